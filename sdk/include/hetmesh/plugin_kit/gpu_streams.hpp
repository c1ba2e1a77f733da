// The stream slots of a GPU plugin: create, destroy, synchronize (with a timeout), query and host
// callbacks, over the vendor calls of `V` (gpu_vendor.hpp lists them).
#pragma once

#include "gpu_handles.hpp"
#include "gpu_poll.hpp"
#include "gpu_state.hpp"
#include "status.hpp"

#include <memory>

namespace hm::kit::gpu {

template <typename V>
hm_status stream_create(int32_t device, uint32_t flags, hm_stream* out) {
  return guarded("stream_create", [&] {
    check_create(V::state(), device, out, flags, HM_STREAM_NON_BLOCKING, "stream");
    typename V::Scope scope(device);
    auto stream = std::make_unique<typename V::Stream>();
    stream->device = device;
    V::create_stream(&stream->stream, (flags & HM_STREAM_NON_BLOCKING) != 0);
    *out = reinterpret_cast<hm_stream>(stream.release());
  });
}

// For a vendor extension: an hm_stream over a runtime stream the application owns.
template <typename V>
hm_status stream_borrow(int32_t device, typename V::NativeStream native, hm_stream* out) {
  return guarded("stream_borrow", [&] {
    check_create(V::state(), device, out, 0, 0, "stream");
    auto stream = std::make_unique<typename V::Stream>();
    stream->device = device;
    stream->stream = native;
    stream->borrowed = true;
    *out = reinterpret_cast<hm_stream>(stream.release());
  });
}

template <typename V>
hm_status stream_destroy(hm_stream stream) {
  return guarded("stream_destroy", [&] {
    auto& s = stream_of<typename V::Stream>(stream);
    typename V::Scope scope(s.device);
    // Freed however the destroy ends: the runtime releases the stream after its pending work.
    std::unique_ptr<typename V::Stream> owned(&s);
    s.magic = 0;
    if (!s.borrowed) V::destroy_stream(s);
  });
}

template <typename V>
hm_status stream_synchronize(hm_stream stream, uint64_t timeout_ns) {
  return guarded("stream_synchronize", [&] {
    auto& s = stream_of<typename V::Stream>(stream);
    typename V::Scope scope(s.device);
    if (timeout_ns == HM_TIMEOUT_INFINITE) {
      V::synchronize_stream(s.stream);
      return;
    }
    poll_until_done([&] { return V::stream_done(s.stream); }, timeout_ns, "stream work");
  });
}

template <typename V>
hm_status stream_query(hm_stream stream) {
  return guarded("stream_query", [&]() -> hm_status {
    auto& s = stream_of<typename V::Stream>(stream);
    typename V::Scope scope(s.device);
    return V::stream_done(s.stream) ? HM_OK : HM_ERR_NOT_READY;
  });
}

template <typename V>
hm_status stream_add_callback(hm_stream stream, hm_host_fn fn, void* user_data) {
  return guarded("stream_add_callback", [&] {
    auto& s = stream_of<typename V::Stream>(stream);
    if (fn == nullptr) fail(HM_ERR_INVALID_ARGUMENT, "callback is NULL");
    typename V::Scope scope(s.device);
    // Runs on a runtime thread once prior work completes; later work waits for it to return.
    V::launch_host_func(s, fn, user_data);
  });
}

}  // namespace hm::kit::gpu
