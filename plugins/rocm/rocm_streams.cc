// Streams and host callbacks.
#include "rocm_streams.hpp"

#include "cyclic_wait.hpp"
#include "slots.hpp"

#include <memory>

namespace hm::rocm {

using hm::kit::fail;
using hm::kit::guarded;

Stream& stream_of(hm_stream handle) {
  if (handle == nullptr) fail(HM_ERR_INVALID_HANDLE, "stream is NULL");
  auto* stream = reinterpret_cast<Stream*>(handle);
  if (stream->magic != kStreamMagic)
    fail(HM_ERR_INVALID_HANDLE, "%p is not a stream of this plugin", static_cast<void*>(handle));
  return *stream;
}

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

void launch_host_function(const Stream& stream, hm_host_fn fn, void* user_data) {
  const Runtime& runtime = hip();
  if (runtime.hipLaunchHostFunc != nullptr) {
    HM_HIP(hipLaunchHostFunc, stream.stream, fn, user_data);
    return;
  }
  // hipStreamAddCallback also blocks later work on the stream until the callback returns.
  auto call = std::make_unique<HostCall>(HostCall{fn, user_data});
  HM_HIP(hipStreamAddCallback, stream.stream, run_host_call, call.get(), 0);
  call.release();  // run_host_call owns it now
}

hm_status stream_create(int32_t device, uint32_t flags, hm_stream* out) {
  return guarded("stream_create", [&] {
    device_state(device);
    if (out == nullptr) fail(HM_ERR_INVALID_ARGUMENT, "stream output is NULL");
    if ((flags & ~HM_STREAM_NON_BLOCKING) != 0)
      fail(HM_ERR_INVALID_ARGUMENT, "unknown stream flags 0x%x", flags);
    DeviceScope scope(device);
    auto stream = std::make_unique<Stream>();
    stream->device = device;
    HM_HIP(hipStreamCreateWithFlags, &stream->stream,
           (flags & HM_STREAM_NON_BLOCKING) != 0 ? hipStreamNonBlocking : hipStreamDefault);
    *out = reinterpret_cast<hm_stream>(stream.release());
  });
}

hm_status stream_destroy(hm_stream stream) {
  return guarded("stream_destroy", [&] {
    Stream& s = stream_of(stream);
    State& st = state();
    DeviceScope scope(s.device);
    hipError_t error = st.hip.hipStreamDestroy(s.stream);
    // The relay keeps serving waits still pending on the gate, then reuses it.
    if (s.gate != nullptr) {
      std::lock_guard lock(st.relay_mutex);
      st.relay->release_gate(s.gate);
    }
    s.magic = 0;
    delete &s;
    check(error, "hipStreamDestroy");
  });
}

hm_status stream_synchronize(hm_stream stream, uint64_t timeout_ns) {
  return guarded("stream_synchronize", [&] {
    Stream& s = stream_of(stream);
    DeviceScope scope(s.device);
    if (timeout_ns == HM_TIMEOUT_INFINITE) {
      HM_HIP(hipStreamSynchronize, s.stream);
      return;
    }
    const Runtime& runtime = hip();
    poll_until_done([&] { return runtime.hipStreamQuery(s.stream); }, timeout_ns, "hipStreamQuery",
                    "stream work");
  });
}

hm_status stream_query(hm_stream stream) {
  return guarded("stream_query", [&]() -> hm_status {
    Stream& s = stream_of(stream);
    DeviceScope scope(s.device);
    hipError_t error = hip().hipStreamQuery(s.stream);
    if (error == hipErrorNotReady) return HM_ERR_NOT_READY;
    check(error, "hipStreamQuery");
    return HM_OK;
  });
}

hm_status stream_add_callback(hm_stream stream, hm_host_fn fn, void* user_data) {
  return guarded("stream_add_callback", [&] {
    Stream& s = stream_of(stream);
    if (fn == nullptr) fail(HM_ERR_INVALID_ARGUMENT, "callback is NULL");
    DeviceScope scope(s.device);
    launch_host_function(s, fn, user_data);
  });
}

}  // namespace hm::rocm
