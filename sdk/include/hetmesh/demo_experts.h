/*
 * The AFD demo's expert kernels for a device of any plugin: what a vendor supplies so that
 * `hetmesh demo` runs its F instances' experts on the device itself.
 *
 * `hetmesh demo` runs an F instance's experts
 *   - on the host, when the device's memory is host-addressable
 *     (HM_CAP_HOST_ADDRESSABLE_DEVICE_MEMORY);
 *   - else with the kernel library of the device's plugin, libhetmesh-demo-<plugin name>.so, looked
 *     for in the folder named by HETMESH_DEMO_KERNELS, else in ../demo beside the plugin file
 *     (<prefix>/lib/hetmesh/plugins/libhetmesh-device-mychip.so ->
 *     <prefix>/lib/hetmesh/demo/libhetmesh-demo-mychip.so). It exports hm_demo_experts_v1;
 *   - else on the host through staging: each part is copied to host memory by the plugin's
 *     streams, computed there and copied back (correct on any conformant plugin, and says so in
 *     the log; the data path is the device's, the arithmetic is not).
 *
 * A library is loaded with dlopen(RTLD_NOW | RTLD_LOCAL) and never unloaded. C99, so the library
 * and the demo may come from different compilers. hetmesh's own: libhetmesh-demo-cuda.so (CUDA,
 * through the cuda plugin's "hm.cuda.native" extension) and libhetmesh-demo-asic_stub.so (through
 * asic_stub's "hm.asic_stub.launch").
 */
#ifndef HETMESH_DEMO_EXPERTS_H_
#define HETMESH_DEMO_EXPERTS_H_

#include <hetmesh/device_plugin.h>

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define HM_DEMO_EXPERTS_ENTRY_V1 "hm_demo_experts_v1"
#define HM_DEMO_EXPERTS_PREFIX "libhetmesh-demo-"

/* Element types of tokens (A2F) and results (F2A): fp8 is OCP e4m3 (bias 7, no infinities, 0x7f
 * NaN), bf16 and fp16 are IEEE halves, all little-endian, converted with round-to-nearest-even. */
enum { HM_DEMO_FP8 = 0, HM_DEMO_BF16 = 1, HM_DEMO_FP16 = 2, HM_DEMO_FP32 = 3 };

/* One routing entry: top_k of them per token. */
typedef struct hm_demo_route {
  int32_t expert;
  float weight;
} hm_demo_route;

typedef struct hm_demo_expert_args {
  uint32_t tokens, hidden, ffn_dim, top_k;
  int32_t first_expert, last_expert; /* this F owns experts [first, last) */
  int32_t a2f, f2a;                  /* HM_DEMO_*: the element types of tokens and out */
} hm_demo_expert_args;

/* One part of a batch: the expert math the library enqueues on `stream`.
 *
 *   out[t] = sum over k < top_k with first <= routing[t*top_k+k].expert < last of
 *            weight * W2 relu(W1 x_t)
 *
 * with x_t = tokens[t*hidden .. +hidden) read as a2f, out written as f2a, and `weights` holding
 * per expert e from first_expert on, W1 [ffn_dim][hidden] then W2 [hidden][ffn_dim], row-major
 * fp32. Sums run in index order in fp32 without fused multiply-adds: the demo checks its final
 * hidden states against its own single-process computation to HM_DEMO_TOLERANCE, which only
 * absorbs a compiler contracting a multiply-add differently (bit for bit where the order is kept).
 */
#define HM_DEMO_TOLERANCE 1e-4
typedef struct hm_demo_experts_call {
  size_t struct_size;                 /* sizeof(hm_demo_experts_call) as the demo was built */
  const hm_device_plugin_api* plugin; /* the device's plugin, for its extensions (native streams) */
  int32_t device;                     /* the device index within the plugin */
  hm_stream stream;                   /* enqueue on it, in order; do not synchronize it */
  hm_demo_expert_args args;
  const void* tokens;           /* device memory: tokens * hidden elements of a2f */
  const hm_demo_route* routing; /* device memory: tokens * top_k routes */
  const float* weights;         /* device memory the demo uploaded through the plugin */
  void* out;                    /* device memory: tokens * hidden elements of f2a */
  char* error;                  /* on failure, a message naming the cause, NUL-terminated */
  size_t error_size;
} hm_demo_experts_call;

/* Enqueues the part's expert math. Returns HM_OK, or a status with a message in call->error. */
typedef hm_status (*hm_demo_experts_fn)(const hm_demo_experts_call* call);

#ifdef __cplusplus
}
#endif

#endif /* HETMESH_DEMO_EXPERTS_H_ */
