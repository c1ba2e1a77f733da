/*
 * The demo's expert kernel on NVIDIA GPUs, built by nvcc into libhetmesh-demo-cuda.so, which the
 * demo dlopen()s when an F instance runs on a cuda device (so the hetmesh binary itself never
 * needs the CUDA runtime). A C interface: the library and the demo may be built by different
 * compilers.
 */
#ifndef HETMESH_DEMO_CUDA_EXPERT_KERNELS_H_
#define HETMESH_DEMO_CUDA_EXPERT_KERNELS_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define HM_DEMO_CUDA_RUN_EXPERTS "hm_demo_cuda_run_experts"

/* Element types, in hetmesh::afd::Dtype's order. */
enum { HM_DEMO_FP8 = 0, HM_DEMO_BF16 = 1, HM_DEMO_FP16 = 2, HM_DEMO_FP32 = 3 };

typedef struct hm_demo_expert_args {
  uint32_t tokens, hidden, ffn_dim, top_k;
  int32_t first_expert, last_expert; /* this F owns [first, last) */
  int32_t a2f, f2a;                  /* HM_DEMO_* */
} hm_demo_expert_args;

/* Enqueues run_experts (see model.hpp) on `cu_stream` of CUDA device `ordinal`: tokens, routing,
 * weights and out are device memory of that device. Returns 0, or a CUDA error code with a
 * message in `error`. Results are bit-identical to the host version for every A2F type and for
 * fp32/bf16 F2A (sums run in the same order, without fused multiply-adds). */
typedef int (*hm_demo_cuda_run_experts_fn)(const hm_demo_expert_args* args, const void* tokens,
                                           const void* routing, const float* weights, void* out,
                                           void* cu_stream, int32_t ordinal, char* error,
                                           size_t error_size);

#ifdef __cplusplus
}
#endif

#endif /* HETMESH_DEMO_CUDA_EXPERT_KERNELS_H_ */
