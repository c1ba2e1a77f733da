// The level_zero plugin's stream calls for the kit's GPU layer (hetmesh/plugin_kit/gpu_streams.hpp
// has the slots): immediate command lists as streams, completion through marker events, and host
// callbacks through an event pair and the service thread.
#include "level_zero_slots.hpp"

#include <hetmesh/plugin_kit/wait_relay.hpp>

#include <memory>
#include <mutex>

namespace hm::level_zero {

// One immediate list, asynchronous, on the compute group: appends return at once and run in the
// order of the list (with the fences of level_zero_state.cc), which is a stream. Level Zero has no
// default stream to synchronise with, so HM_STREAM_NON_BLOCKING changes nothing.
void Vendor::create_stream(Queue** out, bool) {
  const int32_t device = DeviceScope::current();
  DeviceState& d = device_state(device);
  auto q = std::make_unique<Queue>();
  q->device = device;
  q->driver = d.driver;
  ze_command_queue_desc_t desc{};
  desc.stype = ZE_STRUCTURE_TYPE_COMMAND_QUEUE_DESC;
  desc.ordinal = d.compute_ordinal;
  desc.index = 0;
  desc.mode = ZE_COMMAND_QUEUE_MODE_ASYNCHRONOUS;
  desc.priority = ZE_COMMAND_QUEUE_PRIORITY_NORMAL;
  HM_ZE(zeCommandListCreateImmediate, d.driver->context, d.handle, &desc, &q->list);
  *out = q.release();
}

void Vendor::destroy_stream(Stream& s) {
  // The relay keeps serving waits still pending on the gate, then reuses it.
  if (s.gate != nullptr) {
    Driver& driver = *s.stream->driver;
    std::lock_guard lock(driver.relay_mutex);
    driver.relay->release_gate(s.gate);
  }
  queue_destroy(s.stream);
}

void Vendor::synchronize_stream(Queue* q) {
  queue_synchronize(*q);
}

bool Vendor::stream_done(Queue* q) {
  return queue_done(*q);
}

// Level Zero has no host function in a list. The stream signals `ready` once its prior work
// completed and then waits on `release`; the service thread sees `ready`, calls fn and
// host-signals `release`, so later work waits for fn to return (CUDA's semantics). `release`
// stays held by the stream until the stream is seen past its wait.
void Vendor::launch_host_func(Stream& s, hm_host_fn fn, void* user_data) {
  Queue& q = *s.stream;
  EventPool& events = *q.driver->events;
  MarkRef ready = events.acquire();
  MarkRef release = events.acquire();
  Service& callbacks = service();
  {
    std::lock_guard lock(q.mutex);
    signal_after_all(q, *ready);
    HM_ZE(zeCommandListAppendWaitOnEvents, q.list, 1, &release->event);
    q.held.push_back(release);
    q.dirty = true;
  }
  callbacks.add_callback(std::move(ready), std::move(release), fn, user_data);
}

}  // namespace hm::level_zero
