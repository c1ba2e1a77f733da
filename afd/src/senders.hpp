// The engine's senders: one thread per peer runs that peer's writes in order, so that writes to
// different peers proceed side by side and a slow peer delays only its own; each write first waits
// until the data it carries is ready (an event, or a word a stream writes).
#pragma once

#include "comm_thread.hpp"
#include "peer.hpp"

#include <hetmesh/afd/engine.hpp>
#include <hetmesh/core/device.hpp>
#include <hetmesh/core/error.hpp>
#include <hetmesh/core/spin.hpp>
#include <hetmesh/core/thread.hpp>

#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace hetmesh::afd {

// One peer's writes, run in order on a thread of their own, so that the writes to different
// peers proceed side by side and a slow peer delays only its own. Jobs are small structs in a
// ring sized at construction (the slot credits bound how many can be queued), so pushing
// allocates nothing. `run` gets each job and the stop flag (to bound any wait it does); it must
// not throw.
template <typename Job>
class PeerSender {
 public:
  using Run = std::function<void(const Job&, const std::atomic<bool>& stopping)>;

  PeerSender(size_t capacity, std::string name, int cpu, Run run)
      : name_(std::move(name)), run_(std::move(run)), ring_(capacity) {
    thread_ = start_thread("hm-sender", [this] { loop(); });
    if (cpu >= 0) pin_thread(thread_, cpu, "an AFD sender thread");
  }
  ~PeerSender() { stop(); }
  PeerSender(const PeerSender&) = delete;
  PeerSender& operator=(const PeerSender&) = delete;

  // Queues a job; throws Error(INTERNAL) if the ring is full (a credit was not respected).
  void push(const Job& job) {
    bool wake;
    {
      std::lock_guard lock(mutex_);
      if (tail_ - head_ == ring_.size())
        throw Error(HM_ERR_INTERNAL,
                    fmt::format("{}: more than {} writes queued", name_, ring_.size()));
      ring_[tail_ % ring_.size()] = job;
      ++tail_;
      pushed_.store(tail_, std::memory_order_release);
      wake = sleeping_;
    }
    if (wake) wake_.notify_one();
  }

  // Waits until every job queued so far has run; false if that took past `deadline`.
  bool drain(std::chrono::steady_clock::time_point deadline) {
    std::unique_lock lock(mutex_);
    return idle_.wait_until(lock, deadline, [&] { return ran_ == tail_; });
  }

  // Stops after the job in progress; queued jobs are dropped.
  void stop() {
    {
      std::lock_guard lock(mutex_);
      stopping_.store(true, std::memory_order_release);
    }
    wake_.notify_one();
    if (thread_.joinable()) thread_.join();
  }

 private:
  void loop() {
    for (;;) {
      Job job;
      {
        std::unique_lock lock(mutex_);
        if (head_ == tail_ && !stopping_.load(std::memory_order_relaxed)) {
          lock.unlock();
          TimedWait wait(spin_);
          wait.spin([&] { return pushed_.load(std::memory_order_acquire) != head_; });
          lock.lock();
          while (head_ == tail_ && !stopping_.load(std::memory_order_relaxed)) {
            sleeping_ = true;
            wake_.wait(lock);
            sleeping_ = false;
          }
        }
        if (stopping_.load(std::memory_order_relaxed)) return;
        job = ring_[head_ % ring_.size()];
        ++head_;
      }
      run_(job, stopping_);
      {
        std::lock_guard lock(mutex_);
        ++ran_;
      }
      idle_.notify_all();
    }
  }

  std::string name_;
  Run run_;
  std::mutex mutex_;
  std::condition_variable wake_, idle_;
  std::vector<Job> ring_;
  uint64_t head_ = 0, tail_ = 0;     // under mutex_
  uint64_t ran_ = 0;                 // jobs run to their end, under mutex_
  std::atomic<uint64_t> pushed_{0};  // tail_, read without the lock while spinning
  bool sleeping_ = false;            // under mutex_
  std::atomic<bool> stopping_{false};
  SpinPolicy spin_;  // the thread's own
  std::thread thread_;
};

// What a sender waits for before it posts: an event the engine owns (recorded on the caller's
// stream during push_pull or respond), or a word the engine owns reaching `value`; neither: ready.
struct ReadyWait {
  const Event* event = nullptr;
  const void* flag = nullptr;
  uint32_t value = 0;
};

// Waits until `ready` holds (an event completed, a flag reached its value; at once for neither).
// Returns false if `stopping` was set first. Throws Error if the event reports a failure.
bool wait_ready(const ReadyWait& ready, const std::atomic<bool>& stopping);

// The CPU for sender `index` (0-based) of an engine: comm_cpus[1 + index], wrapping around;
// -1 (unpinned) without comm_cpus.
int sender_cpu(const std::vector<int>& comm_cpus, size_t index);

// A sender per peer of `peer_role` (`peers` of them), named "attention 0 to ffn 1", pinned as
// sender_cpu() says, each running `run(peer, job, stopping)` and holding up to `capacity` jobs.
template <typename Job, typename Run>
std::vector<std::unique_ptr<PeerSender<Job>>> start_senders(const EngineSpec& spec, Role peer_role,
                                                            int peers, size_t capacity, Run run) {
  std::vector<std::unique_ptr<PeerSender<Job>>> senders;
  for (int peer = 0; peer < peers; ++peer)
    senders.push_back(std::make_unique<PeerSender<Job>>(
        capacity,
        fmt::format("{} to {}", peer_name(spec.role, spec.rank), peer_name(peer_role, peer)),
        sender_cpu(spec.comm_cpus, static_cast<size_t>(peer)),
        [run, peer](const Job& job, const std::atomic<bool>& stopping) {
          run(peer, job, stopping);
        }));
  return senders;
}

}  // namespace hetmesh::afd
