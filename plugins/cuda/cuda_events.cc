// The event slots of the cuda plugin. A CUDA event belongs to one context, so an hm_event holds one
// CUevent per device it was recorded on, created on first use there.
#include "cuda_slots.hpp"
#include "cuda_state.hpp"

#include <atomic>
#include <memory>
#include <mutex>

namespace hm::cuda {

// ---- slots: events ----

hm_status event_create(int32_t device, uint32_t flags, hm_event* out) {
  return guarded("event_create", [&] {
    device_state(device);
    if (out == nullptr) fail(HM_ERR_INVALID_ARGUMENT, "event output is NULL");
    if ((flags & ~HM_EVENT_DISABLE_TIMING) != 0)
      fail(HM_ERR_INVALID_ARGUMENT, "unknown event flags 0x%x", flags);
    auto event = std::make_unique<Event>();
    event->device = device;
    event->timing = (flags & HM_EVENT_DISABLE_TIMING) == 0;
    event->flags = event->timing ? CU_EVENT_DEFAULT : CU_EVENT_DISABLE_TIMING;
    event->events.assign(state().devices.size(), nullptr);
    ContextScope scope(device);
    HM_CU(cuEventCreate, &event->events[static_cast<size_t>(device)], event->flags);
    *out = reinterpret_cast<hm_event>(event.release());
  });
}

hm_status event_destroy(hm_event event) {
  return guarded("event_destroy", [&] {
    Event& e = event_of(event);
    e.magic = 0;
    std::unique_ptr<Event> owned(&e);
    CUresult first_error = CUDA_SUCCESS;
    for (size_t d = 0; d < e.events.size(); ++d) {
      if (e.events[d] == nullptr) continue;
      ContextScope scope(static_cast<int32_t>(d));
      CUresult result = drv().cuEventDestroy(e.events[d]);
      if (first_error == CUDA_SUCCESS) first_error = result;
    }
    check(first_error, "cuEventDestroy");
  });
}

namespace {

// The CUevent of `e` on `device`, created on first use there.
CUevent event_on(Event& e, int32_t device) {
  auto index = static_cast<size_t>(device);
  if (device == e.device) return e.events[index];
  std::lock_guard lock(e.mutex);
  if (e.events[index] == nullptr) HM_CU(cuEventCreate, &e.events[index], e.flags);
  return e.events[index];
}

}  // namespace

hm_status event_record(hm_event event, hm_stream stream) {
  return guarded("event_record", [&] {
    Event& e = event_of(event);
    Stream& s = stream_of(stream);
    ContextScope scope(s.device);
    HM_CU(cuEventRecord, event_on(e, s.device), s.stream);
    e.recorded_on.store(s.device, std::memory_order_release);
  });
}

hm_status event_query(hm_event event) {
  return guarded("event_query", [&]() -> hm_status {
    Event& e = event_of(event);
    int32_t device = e.recorded_on.load(std::memory_order_acquire);
    if (device < 0) return HM_OK;  // never recorded: complete
    ContextScope scope(device);
    CUresult result = drv().cuEventQuery(e.events[static_cast<size_t>(device)]);
    if (result == CUDA_ERROR_NOT_READY) return HM_ERR_NOT_READY;
    check(result, "cuEventQuery");
    return HM_OK;
  });
}

hm_status event_synchronize(hm_event event, uint64_t timeout_ns) {
  return guarded("event_synchronize", [&] {
    Event& e = event_of(event);
    int32_t device = e.recorded_on.load(std::memory_order_acquire);
    if (device < 0) return;
    CUevent handle = e.events[static_cast<size_t>(device)];
    ContextScope scope(device);
    if (timeout_ns == HM_TIMEOUT_INFINITE) {
      HM_CU(cuEventSynchronize, handle);
      return;
    }
    const Driver& d = drv();
    poll_until_done([&] { return d.cuEventQuery(handle); }, timeout_ns, "cuEventQuery", "event");
  });
}

hm_status stream_wait_event(hm_stream stream, hm_event event) {
  return guarded("stream_wait_event", [&] {
    Stream& s = stream_of(stream);
    Event& e = event_of(event);
    int32_t device = e.recorded_on.load(std::memory_order_acquire);
    if (device < 0) return;  // nothing captured: nothing to wait for
    ContextScope scope(s.device);
    // The event may live on another device: CUDA orders streams across contexts.
    HM_CU(cuStreamWaitEvent, s.stream, e.events[static_cast<size_t>(device)], 0);
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
    ContextScope scope(da);
    CUresult result = drv().cuEventElapsedTime(milliseconds, a.events[static_cast<size_t>(da)],
                                               b.events[static_cast<size_t>(db)]);
    if (result == CUDA_ERROR_NOT_READY) return HM_ERR_NOT_READY;
    check(result, "cuEventElapsedTime");
    return HM_OK;
  });
}

}  // namespace hm::cuda
