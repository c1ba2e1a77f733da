// The cuda plugin's stream calls for the kit's GPU layer (hetmesh/plugin_kit/gpu_streams.hpp has
// the slots): streams and host functions in stream order.
#include "cuda_slots.hpp"
#include "cuda_state.hpp"

namespace hm::cuda {

void Vendor::create_stream(CUstream* out, bool non_blocking) {
  HM_CU(cuStreamCreate, out, non_blocking ? CU_STREAM_NON_BLOCKING : CU_STREAM_DEFAULT);
}

// Returns at once; CUDA releases the stream after its pending work completes.
void Vendor::destroy_stream(Stream& s) {
  HM_CU(cuStreamDestroy, s.stream);
}

void Vendor::synchronize_stream(CUstream stream) {
  HM_CU(cuStreamSynchronize, stream);
}

bool Vendor::stream_done(CUstream stream) {
  return ready(drv().cuStreamQuery(stream), "cuStreamQuery");
}

void Vendor::launch_host_func(Stream& s, hm_host_fn fn, void* user_data) {
  HM_CU(cuLaunchHostFunc, s.stream, fn, user_data);
}

}  // namespace hm::cuda
