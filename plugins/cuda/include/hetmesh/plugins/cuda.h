/*
 * Extensions of the cuda plugin.
 *
 * "hm.cuda.native": the CUDA objects behind the plugin's handles, so an application can launch
 * its own kernels in stream order with the work hetmesh enqueues (as PJRT and oneAPI UR expose
 * native handles), and, since version 2, an hm_stream over a CUDA stream the application owns (a
 * framework's), so that hetmesh waits for that stream's work. The header needs no CUDA header:
 * handles are void*. A caller that asks for version 1 gets this table too (it only grows).
 */
#ifndef HETMESH_CUDA_H_
#define HETMESH_CUDA_H_

#include <hetmesh/device_plugin.h>

#ifdef __cplusplus
extern "C" {
#endif

#define HM_CUDA_NATIVE_EXTENSION "hm.cuda.native"
#define HM_CUDA_NATIVE_VERSION 2u

typedef struct hm_cuda_native_ext {
  hm_extension_header header; /* version HM_CUDA_NATIVE_VERSION */
  /* The CUstream (usable as a cudaStream_t) behind `stream`, and the CUDA device ordinal it runs
   * on. The stream belongs to that device's primary context, so the CUDA runtime may launch on it
   * after cudaSetDevice(ordinal). Valid until stream_destroy; the caller must not destroy it.
   * Thread-safe. */
  hm_status (*stream_native)(hm_stream stream, void** cu_stream, int32_t* cuda_ordinal);
  /* Since version 2. An hm_stream of device `device` over `cu_stream`, a CUstream of that device's
   * primary context that the caller owns (NULL: the context's legacy default stream): the work the
   * host enqueues on it runs in that stream's order. stream_destroy releases the hm_stream only;
   * the caller keeps the CUstream alive until then. HM_ERR_INVALID_ARGUMENT for an unknown device
   * or a NULL `out`. Thread-safe. */
  hm_status (*stream_borrow)(int32_t device, void* cu_stream, hm_stream* out);
} hm_cuda_native_ext;

#ifdef __cplusplus
}
#endif

#endif /* HETMESH_CUDA_H_ */
