// The queue between a transport's progress threads and the thread that polls it.
#pragma once

#include <hetmesh/transport.hpp>

#include <condition_variable>
#include <deque>
#include <mutex>

namespace hetmesh::detail {

class EventQueue {
 public:
  void push(TransportEvent event) {
    {
      std::lock_guard lock(mutex_);
      events_.push_back(std::move(event));
    }
    ready_.notify_one();
  }

  size_t poll(std::vector<TransportEvent>& out, std::chrono::nanoseconds timeout) {
    std::unique_lock lock(mutex_);
    if (events_.empty() && timeout.count() > 0)
      ready_.wait_for(lock, timeout, [&] { return !events_.empty(); });
    size_t n = events_.size();
    for (auto& e : events_)
      out.push_back(std::move(e));
    events_.clear();
    return n;
  }

 private:
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<TransportEvent> events_;
};

}  // namespace hetmesh::detail
