// libhetmesh-demo-cuda.so, the demo's expert kernels for the cuda plugin (hetmesh/demo_experts.h):
// one block per token, the same arithmetic in the same order as the host run_experts (model.cc),
// with __fmul_rn/__fadd_rn so nvcc cannot fuse a multiply-add: the GPU result matches the
// single-process reference bit for bit. It runs on the plugin's own CUDA stream, which the cuda
// plugin's "hm.cuda.native" extension names; the hetmesh binary itself never needs CUDA.
#include <hetmesh/demo_experts.h>
#include <hetmesh/plugins/cuda.h>

#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>

namespace {

__device__ float load(int32_t type, const void* base, size_t i) {
  switch (type) {
    case HM_DEMO_BF16:
      return __uint_as_float(uint32_t{static_cast<const uint16_t*>(base)[i]} << 16);
    case HM_DEMO_FP16:
      return __half2float(static_cast<const __half*>(base)[i]);
    case HM_DEMO_FP8: {
      __nv_fp8_e4m3 v;
      v.__x = static_cast<const uint8_t*>(base)[i];
      return static_cast<float>(v);
    }
    default:
      return static_cast<const float*>(base)[i];
  }
}

__device__ void store(int32_t type, void* base, size_t i, float value) {
  switch (type) {
    case HM_DEMO_BF16: {  // round to nearest even, NaN kept quiet: as dtype.cc
      uint32_t u = __float_as_uint(value);
      if ((u & 0x7fffffffu) > 0x7f800000u) {
        static_cast<uint16_t*>(base)[i] = static_cast<uint16_t>((u >> 16) | 0x40);
        return;
      }
      u += 0x7fffu + ((u >> 16) & 1u);
      static_cast<uint16_t*>(base)[i] = static_cast<uint16_t>(u >> 16);
      return;
    }
    case HM_DEMO_FP16:
      static_cast<__half*>(base)[i] = __float2half_rn(value);
      return;
    case HM_DEMO_FP8:
      static_cast<uint8_t*>(base)[i] =
          static_cast<uint8_t>(__nv_cvt_float_to_fp8(value, __NV_SATFINITE, __NV_E4M3));
      return;
    default:
      static_cast<float*>(base)[i] = value;
  }
}

// Shared memory: x [hidden], the expert's activations [ffn_dim], y [hidden].
__global__ void experts_kernel(hm_demo_expert_args a, const void* tokens,
                               const hm_demo_route* routing, const float* weights, void* out) {
  extern __shared__ float shared[];
  float* x = shared;
  float* act = x + a.hidden;
  float* y = act + a.ffn_dim;
  const size_t t = blockIdx.x;
  const size_t per_expert = 2 * size_t{a.ffn_dim} * a.hidden;
  for (uint32_t i = threadIdx.x; i < a.hidden; i += blockDim.x) {
    x[i] = load(a.a2f, tokens, t * a.hidden + i);
    y[i] = 0.0f;
  }
  __syncthreads();
  for (uint32_t k = 0; k < a.top_k; ++k) {
    const hm_demo_route r = routing[t * a.top_k + k];
    if (r.expert < a.first_expert || r.expert >= a.last_expert) continue;  // same for the block
    const float* w1 = weights + static_cast<size_t>(r.expert - a.first_expert) * per_expert;
    const float* w2 = w1 + size_t{a.ffn_dim} * a.hidden;
    for (uint32_t j = threadIdx.x; j < a.ffn_dim; j += blockDim.x) {
      float s = 0.0f;
      for (uint32_t i = 0; i < a.hidden; ++i)
        s = __fadd_rn(s, __fmul_rn(w1[size_t{j} * a.hidden + i], x[i]));
      act[j] = s < 0.0f ? 0.0f : s;  // std::max(s, 0.0f)
    }
    __syncthreads();
    for (uint32_t i = threadIdx.x; i < a.hidden; i += blockDim.x) {
      float s = 0.0f;
      for (uint32_t j = 0; j < a.ffn_dim; ++j)
        s = __fadd_rn(s, __fmul_rn(w2[size_t{i} * a.ffn_dim + j], act[j]));
      y[i] = __fadd_rn(y[i], __fmul_rn(r.weight, s));
    }
    __syncthreads();
  }
  for (uint32_t i = threadIdx.x; i < a.hidden; i += blockDim.x)
    store(a.f2a, out, t * a.hidden + i, y[i]);
}

hm_status failed(const hm_demo_experts_call* call, hm_status status, const char* what,
                 const char* why) {
  if (call->error != nullptr && call->error_size > 0)
    std::snprintf(call->error, call->error_size, "%s: %s", what, why);
  return status;
}

hm_status failed(const hm_demo_experts_call* call, cudaError_t e, const char* what) {
  char why[160];
  std::snprintf(why, sizeof why, "%s (%s)", cudaGetErrorString(e), cudaGetErrorName(e));
  return failed(call, HM_ERR_BACKEND, what, why);
}

}  // namespace

extern "C" __attribute__((visibility("default"))) hm_status hm_demo_experts_v1(
    const hm_demo_experts_call* call) {
  if (call == nullptr || call->struct_size < sizeof(hm_demo_experts_call))
    return HM_ERR_INVALID_ARGUMENT;
  const hm_demo_expert_args& args = call->args;
  if (args.tokens == 0) return HM_OK;
  const void* table = nullptr;
  if (call->plugin->get_extension == nullptr ||
      call->plugin->get_extension(HM_CUDA_NATIVE_EXTENSION, 1, &table) != HM_OK)
    return failed(call, HM_ERR_NOT_SUPPORTED, HM_CUDA_NATIVE_EXTENSION,
                  "the device's plugin does not offer it (not the cuda plugin?)");
  void* cu_stream = nullptr;
  int32_t ordinal = 0;
  if (hm_status s = static_cast<const hm_cuda_native_ext*>(table)->stream_native(
          call->stream, &cu_stream, &ordinal);
      s != HM_OK)
    return failed(call, s, "hm.cuda.native.stream_native", call->plugin->last_error());
  if (cudaError_t e = cudaSetDevice(ordinal); e != cudaSuccess)
    return failed(call, e, "cudaSetDevice");
  const size_t shared = (2 * size_t{args.hidden} + args.ffn_dim) * sizeof(float);
  if (shared > 48 * 1024) {
    cudaError_t e = cudaFuncSetAttribute(
        experts_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared));
    if (e != cudaSuccess) return failed(call, e, "cudaFuncSetAttribute(shared memory)");
  }
  experts_kernel<<<args.tokens, 256, shared, static_cast<cudaStream_t>(cu_stream)>>>(
      args, call->tokens, call->routing, call->weights, call->out);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess)
    return failed(call, e, "experts_kernel launch");
  return HM_OK;
}
