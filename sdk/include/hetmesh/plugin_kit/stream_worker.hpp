// An in-order work queue served by one thread: the stream model of a device without a hardware
// queue, or a simulated copy engine. Each operation runs to completion before the next starts.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace hm::kit {

class StreamWorker {
 public:
  using Operation = std::function<void()>;

  StreamWorker() : thread_([this] { serve(); }) {}

  // Drains pending work, then stops the thread. Waiting operations see cancelled() and give up,
  // so destroying a stream blocked on a flag nobody will write does not hang.
  ~StreamWorker() {
    cancelled_.store(true, std::memory_order_release);
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    work_ready_.notify_all();
    thread_.join();
  }

  StreamWorker(const StreamWorker&) = delete;
  StreamWorker& operator=(const StreamWorker&) = delete;

  // Enqueues `op`; returns its ticket (1, 2, ...). Never blocks on device work.
  uint64_t submit(Operation op) {
    uint64_t ticket;
    {
      std::lock_guard lock(mutex_);
      queue_.push_back(std::move(op));
      ticket = ++submitted_;
    }
    work_ready_.notify_one();
    return ticket;
  }

  // True once the stream is being destroyed; long waits inside operations poll it.
  bool cancelled() const { return cancelled_.load(std::memory_order_acquire); }

  // Ticket of the last enqueued operation (0 if none).
  uint64_t submitted() const {
    std::lock_guard lock(mutex_);
    return submitted_;
  }

  bool is_complete(uint64_t ticket) const {
    std::lock_guard lock(mutex_);
    return completed_ >= ticket;
  }

  bool idle() const {
    std::lock_guard lock(mutex_);
    return completed_ == submitted_;
  }

  // Waits until everything submitted so far completes; false on timeout.
  bool wait_idle(std::chrono::nanoseconds timeout) {
    std::unique_lock lock(mutex_);
    uint64_t target = submitted_;
    return wait_locked(lock, timeout, [&] { return completed_ >= target; });
  }

 private:
  template <typename Pred>
  bool wait_locked(std::unique_lock<std::mutex>& lock, std::chrono::nanoseconds timeout,
                   Pred pred) {
    if (timeout == std::chrono::nanoseconds::max()) {
      work_done_.wait(lock, pred);
      return true;
    }
    return work_done_.wait_for(lock, timeout, pred);
  }

  void serve() {
    std::unique_lock lock(mutex_);
    for (;;) {
      work_ready_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping and drained
      Operation op = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      op();
      op = nullptr;  // release captures before reporting completion
      lock.lock();
      ++completed_;
      work_done_.notify_all();
    }
  }

  mutable std::mutex mutex_;
  std::condition_variable work_ready_;
  std::condition_variable work_done_;
  std::deque<Operation> queue_;
  uint64_t submitted_ = 0;
  uint64_t completed_ = 0;
  bool stopping_ = false;
  std::atomic<bool> cancelled_{false};
  std::thread thread_;  // last: starts after the members above exist
};

}  // namespace hm::kit
