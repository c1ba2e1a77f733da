// The queue between a transport's progress threads and the thread that polls it.
//
// Cheap on the hot path: pushing takes an uncontended lock and wakes the poller only when one is
// blocked; events live in a vector that keeps its capacity, so a steady stream allocates nothing.
// A poller may ask to spin briefly before it blocks (poll's `spin`): on a busy connection the next
// event is often microseconds away, and a futex sleep and wake-up cost more than the wait. It
// spins only while the queue is busy (events handed out within kActiveWindow), so an idle process
// burns no CPU. Spinning is opt-in: on a small machine a spinning poller can take the core that
// the thread producing its events needs.
#pragma once

#include <hetmesh/core/spin.hpp>
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
  using Clock = std::chrono::steady_clock;
  // "Recently": a poll handed out events within this window.
  static constexpr std::chrono::milliseconds kActiveWindow{2};

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

  size_t poll(std::vector<TransportEvent>& out, std::chrono::nanoseconds timeout) {
    return poll(out, timeout, std::chrono::nanoseconds(0));
  }

  // Appends pending events to `out`, waiting up to `timeout` for the first: spinning up to `spin`
  // of it first if the queue was recently active, then blocking. Returns how many.
  size_t poll(std::vector<TransportEvent>& out, std::chrono::nanoseconds timeout,
              std::chrono::nanoseconds spin) {
    if (timeout.count() > 0 && spin.count() > 0 && empty() && recently_active()) {
      auto until = Clock::now() + std::min<std::chrono::nanoseconds>(spin, timeout);
      for (int i = 0; empty(); ++i) {
        cpu_relax();
        if ((i & 63) == 63 && Clock::now() >= until) break;
      }
    }
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
    last_taken_.store(Clock::now().time_since_epoch().count(), std::memory_order_relaxed);
    return n;
  }

  // A hint without locking: true if no event is queued.
  bool empty() const { return count_.load(std::memory_order_acquire) == 0; }

  // Whether a poll handed out events within kActiveWindow.
  bool recently_active() const {
    auto last = Clock::time_point(Clock::duration(last_taken_.load(std::memory_order_relaxed)));
    return Clock::now() - last < kActiveWindow;
  }

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
  int waiters_ = 0;                       // pollers blocked on ready_
  std::atomic<size_t> count_{0};          // events_.size(), for lock-free checks
  std::atomic<Clock::rep> last_taken_{};  // when a poll last handed out events
};

}  // namespace hetmesh::detail
