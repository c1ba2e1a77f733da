// The level_zero plugin's shared helpers (declared in level_zero_state.hpp): ze_result_t checks,
// device lookup, the current-device scope, event pools, stream ordering and completion, and the
// service thread behind host callbacks.
#include "level_zero_state.hpp"

#include <hetmesh/plugin_kit/wait_relay.hpp>

#include <algorithm>
#include <chrono>
#include <cstring>

namespace hm::level_zero {

// ---- errors, devices, scope ----

void check(ze_result_t result, const char* call) {
  if (result != ZE_RESULT_SUCCESS)
    fail(status_of(result), "%s failed: %s", call, result_name(result).c_str());
}

bool ready(ze_result_t result, const char* call) {
  if (result == ZE_RESULT_NOT_READY) return false;
  check(result, call);
  return true;
}

DeviceState& device_state(int32_t device) {
  return hm::kit::gpu::device_state(state(), device);
}

namespace {
thread_local int32_t t_current_device = -1;
}  // namespace

DeviceScope::DeviceScope(int32_t device) : previous_(t_current_device) {
  device_state(device);  // an index that is no device fails here
  t_current_device = device;
}

DeviceScope::~DeviceScope() {
  t_current_device = previous_;
}

int32_t DeviceScope::current() {
  if (t_current_device < 0) fail(HM_ERR_INTERNAL, "no device is current (a slot without a scope)");
  return t_current_device;
}

// ---- state ----

Driver::Driver() = default;
Driver::~Driver() {
  relay.reset();   // joins the watcher, frees the gates
  events.reset();  // then the events
  if (context != nullptr) {
    if (State* s = hm::kit::gpu::state_pointer<State>(); s != nullptr)
      (void)s->ze.zeContextDestroy(context);
  }
}

State::State() = default;
State::~State() = default;

// ---- event pools ----

EventPool::~EventPool() {
  for (auto& mark : marks_) {  // back to this pool while it still stands
    std::vector<MarkRef> passed;
    passed.swap(mark->passed);
  }
  State* s = hm::kit::gpu::state_pointer<State>();
  if (s == nullptr) return;
  for (auto& mark : marks_)
    (void)s->ze.zeEventDestroy(mark->event);
  for (ze_event_pool_handle_t pool : pools_)
    (void)s->ze.zeEventPoolDestroy(pool);
  for (void* chunk : stamps_)
    (void)s->ze.zeMemFree(driver_.context, chunk);
}

void EventPool::grow() {
  const Loader& z = ze();
  ze_event_pool_desc_t desc{};
  desc.stype = ZE_STRUCTURE_TYPE_EVENT_POOL_DESC;
  desc.flags = ZE_EVENT_POOL_FLAG_HOST_VISIBLE;  // the host queries, waits on and signals them
  desc.count = kChunk;
  ze_event_pool_handle_t pool = nullptr;
  // No device list: the pool serves every device of the driver's context.
  check(z.zeEventPoolCreate(driver_.context, &desc, 0, nullptr, &pool), "zeEventPoolCreate");
  pools_.push_back(pool);
  ze_host_mem_alloc_desc_t host{};
  host.stype = ZE_STRUCTURE_TYPE_HOST_MEM_ALLOC_DESC;
  void* stamps = nullptr;
  check(z.zeMemAllocHost(driver_.context, &host, kChunk * sizeof(uint64_t), sizeof(uint64_t),
                         &stamps),
        "zeMemAllocHost");
  std::memset(stamps, 0, kChunk * sizeof(uint64_t));
  stamps_.push_back(stamps);
  for (uint32_t i = 0; i < kChunk; ++i) {
    ze_event_desc_t event_desc{};
    event_desc.stype = ZE_STRUCTURE_TYPE_EVENT_DESC;
    event_desc.index = i;
    event_desc.signal = ZE_EVENT_SCOPE_FLAG_HOST;  // host-coherent when signaled
    event_desc.wait = ZE_EVENT_SCOPE_FLAG_HOST;
    auto mark = std::make_unique<Mark>();
    check(z.zeEventCreate(pool, &event_desc, &mark->event), "zeEventCreate");
    mark->timestamp = static_cast<uint64_t*>(stamps) + i;
    fresh_.push_back(mark.get());
    marks_.push_back(std::move(mark));
  }
}

MarkRef EventPool::acquire() {
  Mark* mark = nullptr;
  std::vector<MarkRef> passed;  // released after the lock: their deleters take it
  {
    std::lock_guard lock(mutex_);
    // The oldest returned events first: the likeliest to have signaled.
    const size_t scan = std::min<size_t>(returned_.size(), 8);
    for (size_t i = 0; i < scan && mark == nullptr; ++i) {
      Mark* candidate = returned_.front();
      returned_.pop_front();
      if (ze().zeEventQueryStatus(candidate->event) == ZE_RESULT_SUCCESS &&
          ze().zeEventHostReset(candidate->event) == ZE_RESULT_SUCCESS) {
        mark = candidate;
        passed.swap(mark->passed);
      } else
        returned_.push_back(candidate);  // its signal is still pending somewhere
    }
    if (mark == nullptr) {
      if (fresh_.empty()) grow();
      mark = fresh_.back();
      fresh_.pop_back();
    }
  }
  return MarkRef(mark, [this](Mark* m) { give_back(m); });
}

void EventPool::give_back(Mark* mark) {
  std::lock_guard lock(mutex_);
  returned_.push_back(mark);
}

// ---- stream order and completion ----

void fence(Queue& q) {
  if (!q.unfenced) return;
  HM_ZE(zeCommandListAppendBarrier, q.list, nullptr, 0, nullptr);
  q.unfenced = false;
}

void signal_after_all(Queue& q, const Mark& mark) {
  fence(q);
  HM_ZE(zeCommandListAppendSignalEvent, q.list, mark.event);
}

namespace {

// The marker for everything appended so far (q.mutex held): a new one if work was appended since.
MarkRef current_marker(Queue& q) {
  if (q.dirty || !q.marker) {
    MarkRef fresh = q.driver->events->acquire();
    signal_after_all(q, *fresh);
    q.marker = std::move(fresh);
    q.dirty = false;
  }
  return q.marker;
}

// The marker `m` signaled: the waits appended before it have passed.
void release_held(Queue& q, const MarkRef& m) {
  std::lock_guard lock(q.mutex);
  if (q.marker == m && !q.dirty) q.held.clear();
}

}  // namespace

bool queue_done(Queue& q) {
  MarkRef m;
  {
    std::lock_guard lock(q.mutex);
    if (!q.dirty && !q.marker) return true;  // nothing was ever appended
    m = current_marker(q);
  }
  if (!ready(ze().zeEventQueryStatus(m->event), "zeEventQueryStatus")) return false;
  release_held(q, m);
  return true;
}

void queue_synchronize(Queue& q) {
  MarkRef m;
  {
    std::lock_guard lock(q.mutex);
    if (!q.dirty && !q.marker) return;  // nothing was ever appended
    m = current_marker(q);
  }
  HM_ZE(zeEventHostSynchronize, m->event, UINT64_MAX);
  release_held(q, m);
}

namespace {

void destroy_now(Queue* q) {
  std::unique_ptr<Queue> owned(q);
  q->held.clear();
  q->marker.reset();
  HM_ZE(zeCommandListDestroy, q->list);
}

}  // namespace

void queue_destroy(Queue* q) {
  // A list must not be destroyed while the device still executes it: an idle one goes now, a busy
  // one (work pending, perhaps on a wait nobody satisfies yet) once its marker signals.
  if (queue_done(*q)) {
    destroy_now(q);
    return;
  }
  service().add_dying(q);
}

// ---- the service thread ----

namespace {
constexpr unsigned kYieldPolls = 256;
constexpr std::chrono::microseconds kMaxSleep{50};
}  // namespace

Service::Service() {
  thread_ = std::thread([this] { run(); });
}

Service::~Service() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void Service::add_callback(MarkRef ready, MarkRef release, hm_host_fn fn, void* user_data) {
  {
    std::lock_guard lock(mutex_);
    callbacks_.push_back(Callback{std::move(ready), std::move(release), fn, user_data});
  }
  wake_.notify_one();
}

void Service::add_dying(Queue* q) {
  {
    std::lock_guard lock(mutex_);
    dying_.push_back(q);
  }
  wake_.notify_one();
}

void Service::run() {
  unsigned idle_polls = 0;
  std::chrono::microseconds sleep{1};
  // The thread lives inside the state (State::service), so the loader outlives it.
  const Loader& z = hm::kit::gpu::state_pointer<State>()->ze;
  std::unique_lock lock(mutex_);
  while (!stop_) {
    if (callbacks_.empty() && dying_.empty()) {
      idle_polls = 0;
      sleep = std::chrono::microseconds{1};
      wake_.wait(lock);
      continue;
    }
    bool progress = false;
    // Callbacks whose stream reached them; they run in order of arrival. A stream's next callback
    // cannot be ready before this one released the stream.
    for (size_t i = 0; i < callbacks_.size();) {
      if (z.zeEventQueryStatus(callbacks_[i].ready->event) != ZE_RESULT_SUCCESS) {
        ++i;
        continue;
      }
      Callback call = std::move(callbacks_[i]);
      callbacks_.erase(callbacks_.begin() + static_cast<std::ptrdiff_t>(i));
      lock.unlock();
      call.fn(call.user_data);
      ze_result_t result = z.zeEventHostSignal(call.release->event);
      if (result != ZE_RESULT_SUCCESS)
        log(HM_LOG_ERROR, "zeEventHostSignal after a host callback failed: " + result_name(result) +
                              " (the stream stays blocked)");
      lock.lock();
      progress = true;
    }
    for (size_t i = 0; i < dying_.size();) {
      Queue* q = dying_[i];
      if (z.zeEventQueryStatus(q->marker->event) != ZE_RESULT_SUCCESS) {
        ++i;
        continue;
      }
      dying_.erase(dying_.begin() + static_cast<std::ptrdiff_t>(i));
      lock.unlock();
      try {
        destroy_now(q);
      } catch (const hm::kit::Failure& failure) {
        log(HM_LOG_WARN, "destroying a stream's command list: " + failure.message);
      }
      lock.lock();
      progress = true;
    }
    if (progress) {
      idle_polls = 0;
      sleep = std::chrono::microseconds{1};
    } else if (++idle_polls < kYieldPolls) {
      lock.unlock();
      std::this_thread::yield();
      lock.lock();
    } else {
      wake_.wait_for(lock, sleep);
      sleep = std::min(sleep * 2, kMaxSleep);
    }
  }
}

Service& service() {
  State& s = state();
  std::lock_guard lock(s.service_mutex);
  if (!s.service) s.service = std::make_unique<Service>();
  return *s.service;
}

}  // namespace hm::level_zero
