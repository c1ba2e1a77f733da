/*
 * Extensions of the cuda plugin.
 *
 * "hm.cuda.native" v1: the CUDA objects behind the plugin's handles, so an application can launch
 * its own kernels in stream order with the work hetmesh enqueues (as PJRT and oneAPI UR expose
 * native handles). The header needs no CUDA header: handles come back as void*.
 */
#ifndef HETMESH_CUDA_H_
#define HETMESH_CUDA_H_

#include <hetmesh/device_plugin.h>

#ifdef __cplusplus
extern "C" {
#endif

#define HM_CUDA_NATIVE_EXTENSION "hm.cuda.native"
#define HM_CUDA_NATIVE_VERSION 1u

typedef struct hm_cuda_native_ext {
  hm_extension_header header; /* version HM_CUDA_NATIVE_VERSION */
  /* The CUstream (usable as a cudaStream_t) behind `stream`, and the CUDA device ordinal it runs
   * on. The stream belongs to that device's primary context, so the CUDA runtime may launch on it
   * after cudaSetDevice(ordinal). Valid until stream_destroy; the caller must not destroy it.
   * Thread-safe. */
  hm_status (*stream_native)(hm_stream stream, void** cu_stream, int32_t* cuda_ordinal);
} hm_cuda_native_ext;

#ifdef __cplusplus
}
#endif

#endif /* HETMESH_CUDA_H_ */
