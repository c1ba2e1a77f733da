// The event slots of a GPU plugin over the vendor calls of `V` (gpu_vendor.hpp lists them). An
// hm_event holds one native event per device it was recorded on (gpu_handles.hpp says why).
#pragma once

#include "gpu_handles.hpp"
#include "gpu_poll.hpp"
#include "gpu_state.hpp"
#include "status.hpp"

#include <memory>
#include <mutex>
#include <optional>

namespace hm::kit::gpu {

template <typename V>
hm_status event_create(int32_t device, uint32_t flags, hm_event* out) {
  return guarded("event_create", [&] {
    check_create(V::state(), device, out, flags, HM_EVENT_DISABLE_TIMING, "event");
    auto event = std::make_unique<typename V::Event>();
    event->device = device;
    event->timing = (flags & HM_EVENT_DISABLE_TIMING) == 0;
    event->flags = V::event_flags(event->timing);
    event->events.assign(V::state().devices.size(), nullptr);
    typename V::Scope scope(device);
    V::create_event(&event->events[static_cast<size_t>(device)], event->flags);
    *out = reinterpret_cast<hm_event>(event.release());
  });
}

template <typename V>
hm_status event_destroy(hm_event event) {
  return guarded("event_destroy", [&] {
    auto& e = event_of<typename V::Event>(event);
    e.magic = 0;
    std::unique_ptr<typename V::Event> owned(&e);
    // Every native event is destroyed; the first failure is reported.
    std::optional<Failure> first_error;
    for (size_t d = 0; d < e.events.size(); ++d) {
      if (e.events[d] == nullptr) continue;
      typename V::Scope scope(static_cast<int32_t>(d));
      try {
        V::destroy_event(e.events[d]);
      } catch (const Failure& failure) {
        if (!first_error) first_error = failure;
      }
    }
    if (first_error) throw *first_error;
  });
}

// The native event of `e` on `device`, created on first use there (its device is current).
template <typename V, typename E>
auto event_on(E& e, int32_t device) {
  auto index = static_cast<size_t>(device);
  if (device == e.device) return e.events[index];
  std::lock_guard lock(e.mutex);
  if (e.events[index] == nullptr) V::create_event(&e.events[index], e.flags);
  return e.events[index];
}

template <typename V>
hm_status event_record(hm_event event, hm_stream stream) {
  return guarded("event_record", [&] {
    auto& e = event_of<typename V::Event>(event);
    auto& s = stream_of<typename V::Stream>(stream);
    typename V::Scope scope(s.device);
    V::record_event(event_on<V>(e, s.device), s.stream);
    e.recorded_on.store(s.device, std::memory_order_release);
  });
}

template <typename V>
hm_status event_query(hm_event event) {
  return guarded("event_query", [&]() -> hm_status {
    auto& e = event_of<typename V::Event>(event);
    int32_t device = e.recorded_on.load(std::memory_order_acquire);
    if (device < 0) return HM_OK;  // never recorded: complete
    typename V::Scope scope(device);
    return V::event_done(e.events[static_cast<size_t>(device)]) ? HM_OK : HM_ERR_NOT_READY;
  });
}

template <typename V>
hm_status event_synchronize(hm_event event, uint64_t timeout_ns) {
  return guarded("event_synchronize", [&] {
    auto& e = event_of<typename V::Event>(event);
    int32_t device = e.recorded_on.load(std::memory_order_acquire);
    if (device < 0) return;
    auto handle = e.events[static_cast<size_t>(device)];
    typename V::Scope scope(device);
    if (timeout_ns == HM_TIMEOUT_INFINITE) {
      V::synchronize_event(handle);
      return;
    }
    poll_until_done([&] { return V::event_done(handle); }, timeout_ns, "event");
  });
}

template <typename V>
hm_status stream_wait_event(hm_stream stream, hm_event event) {
  return guarded("stream_wait_event", [&] {
    auto& s = stream_of<typename V::Stream>(stream);
    auto& e = event_of<typename V::Event>(event);
    int32_t device = e.recorded_on.load(std::memory_order_acquire);
    if (device < 0) return;  // nothing captured: nothing to wait for
    typename V::Scope scope(s.device);
    // The event may live on another device: CUDA and HIP order streams across devices.
    V::wait_event(s.stream, e.events[static_cast<size_t>(device)]);
  });
}

template <typename V>
hm_status event_elapsed_ms(hm_event start, hm_event end, float* milliseconds) {
  return guarded("event_elapsed_ms", [&]() -> hm_status {
    if (milliseconds == nullptr) fail(HM_ERR_INVALID_ARGUMENT, "milliseconds is NULL");
    auto& a = event_of<typename V::Event>(start);
    auto& b = event_of<typename V::Event>(end);
    if (!a.timing || !b.timing)
      fail(HM_ERR_INVALID_ARGUMENT, "an event was created with HM_EVENT_DISABLE_TIMING");
    int32_t da = a.recorded_on.load(std::memory_order_acquire);
    int32_t db = b.recorded_on.load(std::memory_order_acquire);
    if (da < 0 || db < 0) fail(HM_ERR_INVALID_ARGUMENT, "an event was never recorded");
    if (da != db)
      fail(HM_ERR_INVALID_ARGUMENT, "the events were recorded on different devices (%d and %d)", da,
           db);
    typename V::Scope scope(da);
    bool done = V::elapsed_ms(milliseconds, a.events[static_cast<size_t>(da)],
                              b.events[static_cast<size_t>(db)]);
    return done ? HM_OK : HM_ERR_NOT_READY;
  });
}

}  // namespace hm::kit::gpu
