// Event pools and events: a signaled bit per event, host signal / reset / query / synchronize, and
// the waits of command lists (on any device) on them.
#include "state.h"

namespace hetmesh_ze {

void Event::signal() {
  {
    std::lock_guard lock(mutex_);
    signaled_ = true;
  }
  cv_.notify_all();
}

void Event::reset() {
  std::lock_guard lock(mutex_);
  signaled_ = false;
}

bool Event::signaled() {
  std::lock_guard lock(mutex_);
  return signaled_;
}

bool Event::wait(std::chrono::steady_clock::time_point deadline, const std::atomic<bool>* stop) {
  // With a stop flag, wake now and then to look at it.
  constexpr auto kStopPoll = std::chrono::milliseconds(5);
  std::unique_lock lock(mutex_);
  while (!signaled_) {
    if (stop != nullptr && stop->load()) return false;
    if (stop == nullptr && deadline == std::chrono::steady_clock::time_point::max()) {
      cv_.wait(lock);
      continue;
    }
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) return false;
    auto until = deadline;
    if (stop != nullptr && deadline - now > kStopPoll) until = now + kStopPoll;
    cv_.wait_until(lock, until);
  }
  return true;
}

Registry<EventPool>& event_pools() {
  static auto* registry = new Registry<EventPool>;
  return *registry;
}

Registry<Event>& events() {
  static auto* registry = new Registry<Event>;
  return *registry;
}

ze_result_t event_args(ze_event_handle_t signal, uint32_t num_waits, const ze_event_handle_t* waits,
                       std::shared_ptr<Event>& signal_out,
                       std::vector<std::shared_ptr<Event>>& waits_out) {
  if (signal != nullptr) {
    signal_out = events().get(signal);
    if (!signal_out) return ZE_RESULT_ERROR_INVALID_ARGUMENT;
  }
  if (num_waits > 0 && waits == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  waits_out.reserve(num_waits);
  for (uint32_t i = 0; i < num_waits; ++i) {
    if (waits[i] == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
    auto event = events().get(waits[i]);
    if (!event) return ZE_RESULT_ERROR_INVALID_ARGUMENT;
    waits_out.push_back(std::move(event));
  }
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL EventPoolCreate(ze_context_handle_t context,
                                       const ze_event_pool_desc_t* desc, uint32_t num_devices,
                                       ze_device_handle_t* devices, ze_event_pool_handle_t* out) {
  return guarded([&] {
    if (auto r = check_context(context); r != ZE_RESULT_SUCCESS) return r;
    if (desc == nullptr || out == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    if (desc->count == 0) return ZE_RESULT_ERROR_INVALID_SIZE;
    if (num_devices > 0 && devices == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    for (uint32_t i = 0; i < num_devices; ++i) {
      Device* device = nullptr;
      if (auto r = check_device(devices[i], device); r != ZE_RESULT_SUCCESS) return r;
    }
    auto pool = std::make_shared<EventPool>();
    pool->context = context;
    pool->count = desc->count;
    pool->flags = desc->flags;
    pool->in_use.assign(desc->count, false);
    *out = static_cast<ze_event_pool_handle_t>(event_pools().add(std::move(pool)));
    return ZE_RESULT_SUCCESS;
  });
}

ze_result_t ZE_APICALL EventPoolDestroy(ze_event_pool_handle_t handle) {
  return guarded([&] {
    std::shared_ptr<EventPool> pool;
    if (auto r = lookup(event_pools(), handle, pool); r != ZE_RESULT_SUCCESS) return r;
    {
      std::lock_guard lock(pool->mutex);
      if (pool->live > 0) return ZE_RESULT_ERROR_HANDLE_OBJECT_IN_USE;  // destroy its events first
    }
    return event_pools().remove(handle) ? ZE_RESULT_SUCCESS : ZE_RESULT_ERROR_INVALID_ARGUMENT;
  });
}

ze_result_t ZE_APICALL EventCreate(ze_event_pool_handle_t pool_handle, const ze_event_desc_t* desc,
                                   ze_event_handle_t* out) {
  return guarded([&] {
    std::shared_ptr<EventPool> pool;
    if (auto r = lookup(event_pools(), pool_handle, pool); r != ZE_RESULT_SUCCESS) return r;
    if (desc == nullptr || out == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    {
      std::lock_guard lock(pool->mutex);
      // One live event per index: a second one would alias the first one's state.
      if (desc->index >= pool->count || pool->in_use[desc->index]) {
        return ZE_RESULT_ERROR_INVALID_ARGUMENT;
      }
      pool->in_use[desc->index] = true;
      ++pool->live;
    }
    auto event = std::make_shared<Event>();
    event->pool = pool;
    event->index = desc->index;
    *out = static_cast<ze_event_handle_t>(events().add(std::move(event)));
    return ZE_RESULT_SUCCESS;
  });
}

ze_result_t ZE_APICALL EventDestroy(ze_event_handle_t handle) {
  return guarded([&] {
    if (handle == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
    auto event = events().remove(handle);
    if (!event) return ZE_RESULT_ERROR_INVALID_ARGUMENT;
    // Pending commands that reference it keep the object; the index is free again now.
    std::lock_guard lock(event->pool->mutex);
    event->pool->in_use[event->index] = false;
    --event->pool->live;
    return ZE_RESULT_SUCCESS;
  });
}

ze_result_t ZE_APICALL EventHostSignal(ze_event_handle_t handle) {
  return guarded([&] {
    std::shared_ptr<Event> event;
    if (auto r = lookup(events(), handle, event); r != ZE_RESULT_SUCCESS) return r;
    event->signal();
    return ZE_RESULT_SUCCESS;
  });
}

ze_result_t ZE_APICALL EventHostSynchronize(ze_event_handle_t handle, uint64_t timeout_ns) {
  return guarded([&] {
    std::shared_ptr<Event> event;
    if (auto r = lookup(events(), handle, event); r != ZE_RESULT_SUCCESS) return r;
    auto deadline = std::chrono::steady_clock::time_point::max();
    // Beyond ~292 years steady_clock overflows: treat such timeouts as forever, as UINT64_MAX is.
    if (timeout_ns < (1ull << 62)) {
      deadline = std::chrono::steady_clock::now() + std::chrono::nanoseconds(timeout_ns);
    }
    return event->wait(deadline, nullptr) ? ZE_RESULT_SUCCESS : ZE_RESULT_NOT_READY;
  });
}

ze_result_t ZE_APICALL EventQueryStatus(ze_event_handle_t handle) {
  return guarded([&] {
    std::shared_ptr<Event> event;
    if (auto r = lookup(events(), handle, event); r != ZE_RESULT_SUCCESS) return r;
    return event->signaled() ? ZE_RESULT_SUCCESS : ZE_RESULT_NOT_READY;
  });
}

ze_result_t ZE_APICALL EventHostReset(ze_event_handle_t handle) {
  return guarded([&] {
    std::shared_ptr<Event> event;
    if (auto r = lookup(events(), handle, event); r != ZE_RESULT_SUCCESS) return r;
    event->reset();
    return ZE_RESULT_SUCCESS;
  });
}

}  // namespace hetmesh_ze
