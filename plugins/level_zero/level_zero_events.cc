// The level_zero plugin's event calls for the kit's GPU layer (hetmesh/plugin_kit/gpu_events.hpp
// has the slots): each record takes a fresh event from the driver's pool (level_zero_state.hpp
// says why), waits hold the event until the waiting stream passed them, and timing is a global
// timestamp written to host memory at the record.
#include "level_zero_slots.hpp"

#include <atomic>
#include <memory>

namespace hm::level_zero {

unsigned Vendor::event_flags(bool timing) {
  return timing ? 1u : 0u;
}

void Vendor::create_event(ZeEvent** out, unsigned flags) {
  auto event = std::make_unique<ZeEvent>();
  event->device = DeviceScope::current();
  event->timing = (flags & 1u) != 0;
  *out = event.release();
}

void Vendor::destroy_event(ZeEvent* event) {
  // The latest record's event goes back to its pool, reused once it has signaled.
  delete event;
}

void Vendor::record_event(ZeEvent* event, Queue* q) {
  MarkRef mark = q->driver->events->acquire();
  {
    std::lock_guard lock(q->mutex);
    fence(*q);  // the timestamp is taken, and the event signaled, after the prior work completed
    if (event->timing)
      HM_ZE(zeCommandListAppendWriteGlobalTimestamp, q->list, mark->timestamp, mark->event, 0,
            nullptr);
    else
      HM_ZE(zeCommandListAppendSignalEvent, q->list, mark->event);
    // Every wait appended so far is behind this signal: the events it waited on go with it.
    mark->passed.swap(q->held);
  }
  std::lock_guard lock(event->mutex);
  event->current = std::move(mark);  // the previous record's goes back to the pool
}

bool Vendor::event_done(ZeEvent* event) {
  MarkRef mark = event->latest();
  if (!mark) return true;
  return ready(ze().zeEventQueryStatus(mark->event), "zeEventQueryStatus");
}

void Vendor::synchronize_event(ZeEvent* event) {
  MarkRef mark = event->latest();
  if (mark) HM_ZE(zeEventHostSynchronize, mark->event, UINT64_MAX);
}

// The event may belong to another device of the same driver: one context, so any list waits on
// any of its events.
void Vendor::wait_event(Queue* q, ZeEvent* event) {
  MarkRef mark = event->latest();
  if (!mark) return;
  if (device_state(event->device).driver != q->driver)
    fail(HM_ERR_NOT_SUPPORTED,
         "the event belongs to a device of another Level Zero driver (no shared context)");
  std::lock_guard lock(q->mutex);
  HM_ZE(zeCommandListAppendWaitOnEvents, q->list, 1, &mark->event);
  q->held.push_back(std::move(mark));  // not reused before the stream passed the wait
  q->dirty = true;
}

bool Vendor::elapsed_ms(float* milliseconds, ZeEvent* start, ZeEvent* end) {
  MarkRef a = start->latest(), b = end->latest();
  if (!a || !b) fail(HM_ERR_INVALID_ARGUMENT, "an event was never recorded");
  if (!event_done(start) || !event_done(end)) return false;
  const DeviceState& d = device_state(start->device);
  const uint64_t mask =
      d.timestamp_valid_bits >= 64 ? ~uint64_t{0} : (uint64_t{1} << d.timestamp_valid_bits) - 1;
  const uint64_t t0 = std::atomic_ref<uint64_t>(*a->timestamp).load(std::memory_order_acquire);
  const uint64_t t1 = std::atomic_ref<uint64_t>(*b->timestamp).load(std::memory_order_acquire);
  // The counter wraps at timestampValidBits: the difference modulo that width, read as signed (an
  // end recorded before the start gives a negative time, as CUDA's does).
  const uint64_t forward = (t1 - t0) & mask;
  const bool negative = forward > mask / 2;
  const uint64_t ticks = negative ? (t0 - t1) & mask : forward;
  const double ms = static_cast<double>(ticks) * d.timer_resolution_ns / 1e6;
  *milliseconds = static_cast<float>(negative ? -ms : ms);
  return true;
}

}  // namespace hm::level_zero
