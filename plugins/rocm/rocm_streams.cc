// The rocm plugin's stream calls for the kit's GPU layer (hetmesh/plugin_kit/gpu_streams.hpp has
// the slots): streams and host functions in stream order.
#include "rocm_slots.hpp"

#include <hetmesh/plugin_kit/wait_relay.hpp>

#include <memory>
#include <mutex>

namespace hm::rocm {

namespace {

struct HostCall {
  hm_host_fn fn;
  void* user_data;
};

// hipStreamAddCallback's signature around an hm_host_fn.
void run_host_call(hipStream_t, hipError_t, void* user) {
  std::unique_ptr<HostCall> call(static_cast<HostCall*>(user));
  call->fn(call->user_data);
}

}  // namespace

void Vendor::create_stream(hipStream_t* out, bool non_blocking) {
  HM_HIP(hipStreamCreateWithFlags, out, non_blocking ? hipStreamNonBlocking : hipStreamDefault);
}

void Vendor::destroy_stream(Stream& s) {
  State& st = state();
  hipError_t error = st.hip.hipStreamDestroy(s.stream);
  // The relay keeps serving waits still pending on the gate, then reuses it.
  if (s.gate != nullptr) {
    std::lock_guard lock(st.relay_mutex);
    st.relay->release_gate(s.gate);
  }
  check(error, "hipStreamDestroy");
}

void Vendor::synchronize_stream(hipStream_t stream) {
  HM_HIP(hipStreamSynchronize, stream);
}

bool Vendor::stream_done(hipStream_t stream) {
  return ready(hip().hipStreamQuery(stream), "hipStreamQuery");
}

// Runs fn(user_data) on a runtime thread once prior work on the stream completes; later work waits
// for it to return.
void Vendor::launch_host_func(Stream& s, hm_host_fn fn, void* user_data) {
  const Runtime& runtime = hip();
  if (runtime.hipLaunchHostFunc != nullptr) {
    HM_HIP(hipLaunchHostFunc, s.stream, fn, user_data);
    return;
  }
  // hipStreamAddCallback also blocks later work on the stream until the callback returns.
  auto call = std::make_unique<HostCall>(HostCall{fn, user_data});
  HM_HIP(hipStreamAddCallback, s.stream, run_host_call, call.get(), 0);
  call.release();  // run_host_call owns it now
}

}  // namespace hm::rocm
