// The queue between a transport's progress threads and the thread that polls it.
//
// Cheap on the hot path: pushing takes an uncontended lock and wakes the poller only when one is
// blocked; events live in a vector that keeps its capacity, so a steady stream allocates nothing.
// Spinning for the next event, where it pays, is the transport's own (it knows what to watch
// meanwhile: a message ring, a completion queue).
#pragma once

#include <hetmesh/transport/transport.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <vector>

namespace hetmesh::detail {

class EventQueue {
 public:
  void push(TransportEvent event) {
    bool wake;
    {
      std::lock_guard lock(mutex_);
      events_.push_back(std::move(event));
      wake = published();
    }
    if (wake) ready_.notify_one();
  }

  // Pushes every event of `batch`, in order, and empties it (keeping its capacity).
  void push_all(std::vector<TransportEvent>& batch) {
    if (batch.empty()) return;
    bool wake;
    {
      std::lock_guard lock(mutex_);
      for (auto& e : batch)
        events_.push_back(std::move(e));
      wake = published();
    }
    batch.clear();
    if (wake) ready_.notify_one();
  }

  // Appends pending events to `out`, waiting up to `timeout` for the first. Returns how many.
  size_t poll(std::vector<TransportEvent>& out, std::chrono::nanoseconds timeout) {
    std::unique_lock lock(mutex_);
    if (events_.empty() && timeout.count() > 0) {
      ++waiters_;
      ready_.wait_for(lock, std::min<std::chrono::nanoseconds>(timeout, kLongestWait),
                      [&] { return !events_.empty(); });
      --waiters_;
    }
    size_t n = events_.size();
    if (n == 0) return 0;
    for (auto& e : events_)
      out.push_back(std::move(e));
    events_.clear();
    count_.store(0, std::memory_order_relaxed);
    return n;
  }

  // A hint without locking: true if no event is queued.
  bool empty() const { return count_.load(std::memory_order_acquire) == 0; }

 private:
  // Caps a wait so that steady_clock::now() + wait cannot overflow.
  static constexpr std::chrono::nanoseconds kLongestWait = std::chrono::hours(24 * 365);

  // With mutex_ held, after adding events: true if a blocked poller must be woken.
  bool published() {
    count_.store(events_.size(), std::memory_order_release);
    return waiters_ > 0;
  }

  std::mutex mutex_;
  std::condition_variable ready_;
  std::vector<TransportEvent> events_;
  int waiters_ = 0;               // pollers blocked on ready_
  std::atomic<size_t> count_{0};  // events_.size(), for lock-free checks
};

}  // namespace hetmesh::detail
