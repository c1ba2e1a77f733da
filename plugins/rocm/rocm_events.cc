// Events: recording, waiting, cross-stream ordering and timing.
#include "rocm_streams.hpp"
#include "slots.hpp"

#include <memory>

namespace hm::rocm {

using hm::kit::fail;
using hm::kit::guarded;

Event& event_of(hm_event handle) {
  if (handle == nullptr) fail(HM_ERR_INVALID_HANDLE, "event is NULL");
  auto* event = reinterpret_cast<Event*>(handle);
  if (event->magic != kEventMagic)
    fail(HM_ERR_INVALID_HANDLE, "%p is not an event of this plugin", static_cast<void*>(handle));
  return *event;
}

namespace {

// The hipEvent_t of `e` on `device`, created on first use there.
hipEvent_t event_on(Event& e, int32_t device) {
  auto index = static_cast<size_t>(device);
  if (device == e.device) return e.events[index];
  std::lock_guard lock(e.mutex);
  if (e.events[index] == nullptr) HM_HIP(hipEventCreateWithFlags, &e.events[index], e.flags);
  return e.events[index];
}

}  // namespace

hm_status event_create(int32_t device, uint32_t flags, hm_event* out) {
  return guarded("event_create", [&] {
    device_state(device);
    if (out == nullptr) fail(HM_ERR_INVALID_ARGUMENT, "event output is NULL");
    if ((flags & ~HM_EVENT_DISABLE_TIMING) != 0)
      fail(HM_ERR_INVALID_ARGUMENT, "unknown event flags 0x%x", flags);
    auto event = std::make_unique<Event>();
    event->device = device;
    event->timing = (flags & HM_EVENT_DISABLE_TIMING) == 0;
    event->flags = event->timing ? hipEventDefault : hipEventDisableTiming;
    event->events.assign(state().devices.size(), nullptr);
    DeviceScope scope(device);
    HM_HIP(hipEventCreateWithFlags, &event->events[static_cast<size_t>(device)], event->flags);
    *out = reinterpret_cast<hm_event>(event.release());
  });
}

hm_status event_destroy(hm_event event) {
  return guarded("event_destroy", [&] {
    Event& e = event_of(event);
    e.magic = 0;
    std::unique_ptr<Event> owned(&e);
    hipError_t first_error = hipSuccess;
    for (size_t d = 0; d < e.events.size(); ++d) {
      if (e.events[d] == nullptr) continue;
      DeviceScope scope(static_cast<int32_t>(d));
      hipError_t error = hip().hipEventDestroy(e.events[d]);
      if (first_error == hipSuccess) first_error = error;
    }
    check(first_error, "hipEventDestroy");
  });
}

hm_status event_record(hm_event event, hm_stream stream) {
  return guarded("event_record", [&] {
    Event& e = event_of(event);
    Stream& s = stream_of(stream);
    DeviceScope scope(s.device);
    HM_HIP(hipEventRecord, event_on(e, s.device), s.stream);
    e.recorded_on.store(s.device, std::memory_order_release);
  });
}

hm_status event_query(hm_event event) {
  return guarded("event_query", [&]() -> hm_status {
    Event& e = event_of(event);
    int32_t device = e.recorded_on.load(std::memory_order_acquire);
    if (device < 0) return HM_OK;  // never recorded: complete
    DeviceScope scope(device);
    hipError_t error = hip().hipEventQuery(e.events[static_cast<size_t>(device)]);
    if (error == hipErrorNotReady) return HM_ERR_NOT_READY;
    check(error, "hipEventQuery");
    return HM_OK;
  });
}

hm_status event_synchronize(hm_event event, uint64_t timeout_ns) {
  return guarded("event_synchronize", [&] {
    Event& e = event_of(event);
    int32_t device = e.recorded_on.load(std::memory_order_acquire);
    if (device < 0) return;
    hipEvent_t handle = e.events[static_cast<size_t>(device)];
    DeviceScope scope(device);
    if (timeout_ns == HM_TIMEOUT_INFINITE) {
      HM_HIP(hipEventSynchronize, handle);
      return;
    }
    const Runtime& runtime = hip();
    poll_until_done([&] { return runtime.hipEventQuery(handle); }, timeout_ns, "hipEventQuery",
                    "event");
  });
}

hm_status stream_wait_event(hm_stream stream, hm_event event) {
  return guarded("stream_wait_event", [&] {
    Stream& s = stream_of(stream);
    Event& e = event_of(event);
    int32_t device = e.recorded_on.load(std::memory_order_acquire);
    if (device < 0) return;  // nothing captured: nothing to wait for
    DeviceScope scope(s.device);
    // The event may live on another device: HIP orders streams across devices.
    HM_HIP(hipStreamWaitEvent, s.stream, e.events[static_cast<size_t>(device)], 0);
  });
}

hm_status event_elapsed_ms(hm_event start, hm_event end, float* milliseconds) {
  return guarded("event_elapsed_ms", [&]() -> hm_status {
    if (milliseconds == nullptr) fail(HM_ERR_INVALID_ARGUMENT, "milliseconds is NULL");
    Event& a = event_of(start);
    Event& b = event_of(end);
    if (!a.timing || !b.timing)
      fail(HM_ERR_INVALID_ARGUMENT, "an event was created with HM_EVENT_DISABLE_TIMING");
    int32_t da = a.recorded_on.load(std::memory_order_acquire);
    int32_t db = b.recorded_on.load(std::memory_order_acquire);
    if (da < 0 || db < 0) fail(HM_ERR_INVALID_ARGUMENT, "an event was never recorded");
    if (da != db)
      fail(HM_ERR_INVALID_ARGUMENT, "the events were recorded on different devices (%d and %d)", da,
           db);
    DeviceScope scope(da);
    hipError_t error = hip().hipEventElapsedTime(milliseconds, a.events[static_cast<size_t>(da)],
                                                 b.events[static_cast<size_t>(db)]);
    if (error == hipErrorNotReady) return HM_ERR_NOT_READY;
    check(error, "hipEventElapsedTime");
    return HM_OK;
  });
}

}  // namespace hm::rocm
