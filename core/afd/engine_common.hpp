// Pieces both engine roles use: host-side slot memory, publishing descriptors through the
// rendezvous store, connecting to every peer, and the comm thread.
#pragma once

#include "wire.hpp"

#include <hetmesh/afd.hpp>
#include <hetmesh/rendezvous.hpp>

#include <fmt/format.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

namespace hetmesh::afd {

const char* role_name(Role role);
std::string peer_name(Role role, int rank);  // "attention 1", "ffn 0"

// Host memory for headers and flags: pinned on the device when it has pinned memory (stream
// memory operations need that), plain host memory otherwise.
class HostSlots {
 public:
  HostSlots(const Device& device, uint64_t bytes);
  uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  bool pinned() const { return static_cast<bool>(pinned_); }

 private:
  Buffer pinned_;
  std::vector<uint8_t> plain_;
  uint8_t* data_;
  uint64_t size_;
};

// This instance's registered regions, by name, as published for peers.
struct PublishedRegions {
  std::map<std::string, std::shared_ptr<Region>> regions;
  std::vector<uint8_t> encode() const;
};
std::map<std::string, std::vector<uint8_t>> decode_regions(const std::vector<uint8_t>& blob,
                                                           const std::string& from);

struct Peer {
  int rank = 0;
  std::shared_ptr<Connection> connection;
  std::map<std::string, std::shared_ptr<RemoteRegion>> regions;
  bool left = false;
};

// Publishes this instance's endpoint and regions, then connects to every rank of `peer_role` in
// rank order (a global order, so symmetric connects never wait on each other in a cycle).
std::vector<Peer> join(const EngineSpec& spec, Transport& transport, const PublishedRegions& mine,
                       KeyValueStore& store, Role peer_role, int peer_count);

// Pins `thread` to `cpu`; logs a warning if that fails.
void pin_thread(std::thread& thread, int cpu, const char* what);

// A pause for spin loops.
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

// A thread that runs `step` until stopped: the engine's comm loop, which polls the transport.
// Pinned to spec.comm_cpus[0] if given.
class CommThread {
 public:
  CommThread(const std::vector<int>& cpus, std::function<void()> step);
  ~CommThread();
  void stop();

 private:
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

// Decides whether a thread that found nothing to do should spin for the next job before it
// sleeps: only while most recent waits ended within kSpin, so a thread whose work comes in bursts
// (one job per micro-batch, back to back) saves itself a futex sleep and wake-up per job, and one
// whose jobs come far apart sleeps at once. Never on a machine of fewer than kMinCpus CPUs: there
// the spinning thread takes the core that the copy it waits for needs (`hetmesh bench afd` on 2
// cores had 6-45% slower round trips with it, in three paired runs).
class SpinPolicy {
 public:
  static constexpr std::chrono::microseconds kSpin{30};
  static constexpr unsigned kMinCpus = 8;
  bool should_spin() const { return enabled_ && hits_ >= 768; }
  // Folds in one wait: how long it took, and whether it spun first.
  void record(std::chrono::nanoseconds waited, bool spun) {
    // A wait that ended in a sleep includes the wake-up: counted as a hit up to kSpin later.
    auto limit = spun ? kSpin : 2 * kSpin;
    int hit = waited <= limit ? 1024 : 0;
    hits_ += (hit - hits_) / 8;
  }

 private:
  bool enabled_ = std::thread::hardware_concurrency() >= kMinCpus;
  int hits_ = 1024;  // share of recent waits that ended within the limit, /1024
};

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
    thread_ = std::thread([this] { loop(); });
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
          auto start = std::chrono::steady_clock::now();
          bool spun = spin_.should_spin();
          if (spun) {
            auto until = start + SpinPolicy::kSpin;
            for (int i = 0; pushed_.load(std::memory_order_acquire) == head_; ++i) {
              cpu_relax();
              if ((i & 31) == 31 && std::chrono::steady_clock::now() >= until) break;
            }
          }
          lock.lock();
          while (head_ == tail_ && !stopping_.load(std::memory_order_relaxed)) {
            sleeping_ = true;
            wake_.wait(lock);
            sleeping_ = false;
          }
          spin_.record(std::chrono::steady_clock::now() - start, spun);
        }
        if (stopping_.load(std::memory_order_relaxed)) return;
        job = ring_[head_ % ring_.size()];
        ++head_;
      }
      run_(job, stopping_);
    }
  }

  std::string name_;
  Run run_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::vector<Job> ring_;
  uint64_t head_ = 0, tail_ = 0;     // under mutex_
  std::atomic<uint64_t> pushed_{0};  // tail_, read without the lock while spinning
  bool sleeping_ = false;            // under mutex_
  std::atomic<bool> stopping_{false};
  SpinPolicy spin_;  // the thread's own
  std::thread thread_;
};

// Waits until `ready` holds (an event completed, a flag reached its value; at once for neither).
// Returns false if `stopping` was set first. Throws Error if the event reports a failure.
bool wait_ready(const ReadySignal& ready, const std::atomic<bool>& stopping);

// The CPU for sender `index` (0-based) of an engine: comm_cpus[1 + index], wrapping around;
// -1 (unpinned) without comm_cpus.
int sender_cpu(const std::vector<int>& comm_cpus, size_t index);

// Rethrows a failed write to `peer` with the peer's name: "ffn 1 lost: ..." for a lost peer.
[[noreturn]] void rethrow_for_peer(const Error& e, Role role, int rank);

// Checks a notification's slot index against `limit`; throws a protocol error otherwise.
void check_slot(uint32_t slot, uint32_t limit, const std::string& from);

}  // namespace hetmesh::afd
