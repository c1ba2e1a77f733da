/*
 * Extensions of the asic_stub plugin (a simulated accelerator).
 *
 * "hm.asic_stub.launch" v1: run a host function as the stand-in for a kernel, in stream order, on
 * device memory. The function receives host-writable views of the device buffers it was given.
 */
#ifndef HETMESH_ASIC_STUB_H_
#define HETMESH_ASIC_STUB_H_

#include <hetmesh/device_plugin.h>

#ifdef __cplusplus
extern "C" {
#endif

#define HM_ASIC_STUB_LAUNCH_EXTENSION "hm.asic_stub.launch"
#define HM_ASIC_STUB_LAUNCH_VERSION 1u
#define HM_ASIC_STUB_MAX_KERNEL_ARGS 4096u

/* A "kernel": buffers[i] is a host-writable view of the i-th device buffer; args points to a copy
 * of the launch arguments. Runs on the stream's engine thread. */
typedef void (*hm_asic_stub_kernel)(void* const* buffers, size_t buffer_count, const void* args);

typedef struct hm_asic_stub_launch_ext {
  hm_extension_header header; /* version HM_ASIC_STUB_LAUNCH_VERSION */
  /* Enqueue kernel on stream. Each buffers[i] is a device or pinned address of this plugin with
   * buffer_sizes[i] bytes available (checked now). args_size bytes of args are copied now
   * (at most HM_ASIC_STUB_MAX_KERNEL_ARGS), so the caller may reuse them at once. */
  hm_status (*launch)(hm_stream stream, hm_asic_stub_kernel kernel, void* const* buffers,
                      const uint64_t* buffer_sizes, size_t buffer_count, const void* args,
                      size_t args_size);
} hm_asic_stub_launch_ext;

#ifdef __cplusplus
}
#endif

#endif /* HETMESH_ASIC_STUB_H_ */
