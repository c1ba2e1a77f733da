// A device event modelled on the host: each record() opens a new generation that completes when
// the stream reaches it. Waiters wait for a specific generation, so re-recording an event never
// releases a wait that was enqueued against the previous capture.
#pragma once

#include <hetmesh/device_plugin.h>
#include <chrono>
#include <condition_variable>
#include <cstdint>

#include <mutex>

namespace hm::kit {

class HostEvent {
 public:
  using Clock = std::chrono::steady_clock;

  explicit HostEvent(bool timing) : timing_(timing) {}

  bool timing() const { return timing_; }

  // Starts a new capture; returns its generation, to be passed to complete() in stream order.
  uint64_t record() {
    std::lock_guard lock(mutex_);
    return ++recorded_;
  }

  // Called by the stream when it reaches generation `generation`.
  void complete(uint64_t generation) {
    {
      std::lock_guard lock(mutex_);
      if (generation > completed_) {
        completed_ = generation;
        completed_at_ = Clock::now();
      }
    }
    changed_.notify_all();
  }

  // The generation a wait enqueued now must wait for.
  uint64_t current_capture() const {
    std::lock_guard lock(mutex_);
    return recorded_;
  }

  bool is_complete() const {
    std::lock_guard lock(mutex_);
    return completed_ >= recorded_;
  }

  // Waits for `generation`; false on timeout.
  bool wait(uint64_t generation, std::chrono::nanoseconds timeout) {
    std::unique_lock lock(mutex_);
    auto done = [&] { return completed_ >= generation; };
    if (timeout == std::chrono::nanoseconds::max()) {
      changed_.wait(lock, done);
      return true;
    }
    return changed_.wait_for(lock, timeout, done);
  }

  bool wait_current(std::chrono::nanoseconds timeout) { return wait(current_capture(), timeout); }

  // Completion time of the latest capture; valid once is_complete() and recorded at least once.
  bool completion_time(Clock::time_point* when) const {
    std::lock_guard lock(mutex_);
    if (recorded_ == 0 || completed_ < recorded_) return false;
    *when = completed_at_;
    return true;
  }

 private:
  const bool timing_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  uint64_t recorded_ = 0;
  uint64_t completed_ = 0;
  Clock::time_point completed_at_{};
};

// hm_wait_condition evaluated on the host.
inline bool wait_condition_met(uint32_t current, uint32_t value, int32_t condition) {
  switch (condition) {
    case HM_WAIT_GEQ:
      return static_cast<int32_t>(current - value) >= 0;
    case HM_WAIT_EQ:
      return current == value;
    case HM_WAIT_AND:
      return (current & value) != 0;
    case HM_WAIT_NOR:
      return ~(current | value) != 0;
    default:
      return false;
  }
}

inline std::chrono::nanoseconds to_timeout(uint64_t timeout_ns) {
  if (timeout_ns == HM_TIMEOUT_INFINITE || timeout_ns > uint64_t(INT64_MAX))
    return std::chrono::nanoseconds::max();
  return std::chrono::nanoseconds(static_cast<int64_t>(timeout_ns));
}

}  // namespace hm::kit
