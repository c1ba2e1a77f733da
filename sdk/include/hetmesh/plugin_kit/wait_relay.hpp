// A stream wait for any of the ABI's wait conditions, for a runtime whose own stream waits lack
// some of them: the runtime only has to wait for a 64-bit word to reach a value (unsigned >=).
//
// The ABI's conditions (device_plugin.h) are HM_WAIT_GEQ, EQ, AND and NOR. GEQ is cyclic,
// (int32_t)(*addr - value) >= 0, so a sequence number that wraps past 2^32 still counts as "after"
// (CUDA's CU_STREAM_WAIT_VALUE_GEQ is the same). HIP's hipStreamWaitValueGte is a plain unsigned
// (*addr & mask) >= value, and no mask makes it cyclic; Level Zero's stream waits have only
// unsigned EQ/NEQ/GT/GTE/LT/LTE, so neither AND nor NOR. The relay bridges the two: the stream
// waits for a ticket on a 64-bit gate word of its own (Backend::wait_for_ticket), and one watcher
// thread reads the 32-bit word and stores the ticket into the gate once the condition holds.
// Tickets come from one 64-bit counter, so they never wrap, and a gate reused by a later stream
// only ever sees larger tickets.
//
// The condition is the word's *when the stream reaches the wait*, as a native stream wait's: the
// stream's own earlier work (a write that resets the word, say) must not be overtaken. So the
// stream says it arrived: before the gate wait it writes the ticket into an arrival word beside the
// gate (Backend::signal_arrival, in stream order after its earlier work), and the watcher judges a
// wait only once the arrival word holds its ticket.
//
// A gate's waits open in the order they were enqueued: only its oldest pending wait is evaluated.
// The cost is the watcher's polling (yields, then sleeps of at most kMaxSleep) while any wait is
// pending; it sleeps on a condition variable otherwise.
//
// This file knows no runtime: it is behind Backend (the rocm plugin's is rocm_wait_relay_hip.hpp),
// so the relay's logic is tested without a GPU (tests/plugins/wait_relay_test.cc).
#pragma once

#include "status.hpp"

#include <hetmesh/device_plugin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <utility>
#include <vector>

namespace hm::kit::gpu {

// True when the ABI's wait condition (HM_WAIT_GEQ cyclic, EQ, AND, NOR; device_plugin.h) holds.
// False for a condition the ABI does not define.
inline bool wait_condition_holds(uint32_t word, uint32_t value, int32_t condition) {
  switch (condition) {
    case HM_WAIT_GEQ:
      return static_cast<int32_t>(word - value) >= 0;
    case HM_WAIT_EQ:
      return word == value;
    case HM_WAIT_AND:
      return (word & value) != 0;
    case HM_WAIT_NOR:
      return ~(word | value) != 0;
    default:
      return false;
  }
}

class WaitRelay {
 public:
  // The 32-bit word a wait watches: host memory (pinned, registered or mapped) is read directly,
  // device memory through the backend.
  struct Word {
    const uint32_t* address = nullptr;
    int32_t device = 0;
    bool host = true;
  };

  // What the relay needs from the runtime.
  class Backend {
   public:
    virtual ~Backend() = default;
    // `bytes` of zeroed, 8-byte-aligned memory for gate and arrival words, which the host and
    // every device read and write coherently.
    virtual void* allocate_gates(size_t bytes) = 0;
    virtual void free_gates(void* chunk) = 0;
    // Enqueues on `stream` a write of `ticket` (64 bits) into *arrival, after all the stream's
    // earlier work, whose writes are visible first. Throws hm::kit::Failure.
    virtual void signal_arrival(void* stream, uint64_t* arrival, uint64_t ticket) = 0;
    // Enqueues on `stream` a wait until *gate >= ticket (unsigned 64-bit). Throws
    // hm::kit::Failure.
    virtual void wait_for_ticket(void* stream, uint64_t* gate, uint64_t ticket) = 0;
    // Reads a word in device memory; false if it cannot (the backend reports why).
    virtual bool read_device_word(const Word& word, uint32_t* value) = 0;
  };

  static constexpr std::chrono::microseconds kMaxSleep{16};
  static constexpr size_t kGateChunkBytes = 4096;

  explicit WaitRelay(std::unique_ptr<Backend> backend);
  ~WaitRelay();  // stops the watcher, then frees the gate words and the backend
  WaitRelay(const WaitRelay&) = delete;
  WaitRelay& operator=(const WaitRelay&) = delete;

  // A gate word for one stream (its arrival word is the next one: arrival_of).
  uint64_t* acquire_gate();
  static uint64_t* arrival_of(uint64_t* gate) { return gate + 1; }
  // The stream is gone: the gate goes back to the pool once its pending waits have opened.
  void release_gate(uint64_t* gate);

  // Enqueues on `stream` a wait until `condition` (an HM_WAIT_*) on `word` holds for `value`.
  // Fails with HM_ERR_INVALID_ARGUMENT for a condition the ABI does not define; throws what the
  // backend throws when the stream wait cannot be enqueued.
  void enqueue(void* stream, uint64_t* gate, Word word, uint32_t value, int32_t condition);

 private:
  static constexpr unsigned kYieldPolls = 256;  // polls that only yield before the watcher sleeps

  struct Wait {
    Word word;
    uint32_t value;
    int32_t condition;
    uint64_t ticket;
  };
  struct Front {  // a gate's oldest wait, evaluated outside the lock
    uint64_t* gate;
    Wait wait;
  };

  void watch();
  static bool arrived(const Front& front);
  bool read(const Word& word, uint32_t* value);
  void open(const std::vector<Front>& satisfied);

  std::unique_ptr<Backend> backend_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  uint64_t next_ticket_ = 1;
  std::map<uint64_t*, std::deque<Wait>> pending_;  // per gate, oldest first
  std::set<uint64_t*> retired_;                    // released while waits were pending
  std::vector<uint64_t*> free_gates_;
  std::vector<void*> gate_chunks_;
  std::thread watcher_;
};

inline WaitRelay::WaitRelay(std::unique_ptr<Backend> backend) : backend_(std::move(backend)) {
  watcher_ = std::thread([this] { watch(); });
}

inline WaitRelay::~WaitRelay() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  watcher_.join();
  for (void* chunk : gate_chunks_)
    backend_->free_gates(chunk);
}

inline uint64_t* WaitRelay::acquire_gate() {
  std::lock_guard lock(mutex_);
  if (free_gates_.empty()) {
    void* chunk = backend_->allocate_gates(kGateChunkBytes);
    gate_chunks_.push_back(chunk);
    auto* words = static_cast<uint64_t*>(chunk);
    for (size_t i = kGateChunkBytes / sizeof(uint64_t) / 2; i-- > 0;)
      free_gates_.push_back(&words[2 * i]);  // the gate, then its arrival word
  }
  uint64_t* gate = free_gates_.back();
  free_gates_.pop_back();
  return gate;
}

inline void WaitRelay::release_gate(uint64_t* gate) {
  std::lock_guard lock(mutex_);
  if (pending_.count(gate) != 0)
    retired_.insert(gate);
  else
    free_gates_.push_back(gate);
}

inline void WaitRelay::enqueue(void* stream, uint64_t* gate, Word word, uint32_t value,
                               int32_t condition) {
  if (condition != HM_WAIT_GEQ && condition != HM_WAIT_EQ && condition != HM_WAIT_AND &&
      condition != HM_WAIT_NOR)
    fail(HM_ERR_INVALID_ARGUMENT, "unknown wait condition %d", static_cast<int>(condition));
  {
    std::lock_guard lock(mutex_);
    uint64_t ticket = next_ticket_++;
    // Under the lock, so the watcher cannot open this ticket before it is queued on the stream.
    backend_->signal_arrival(stream, arrival_of(gate), ticket);
    backend_->wait_for_ticket(stream, gate, ticket);
    pending_[gate].push_back(Wait{word, value, condition, ticket});
  }
  wake_.notify_one();
}

inline bool WaitRelay::arrived(const Front& front) {
  return std::atomic_ref<uint64_t>(*arrival_of(front.gate)).load(std::memory_order_acquire) >=
         front.wait.ticket;
}

inline bool WaitRelay::read(const Word& word, uint32_t* value) {
  if (!word.host) return backend_->read_device_word(word, value);
  // atomic_ref<const T> is C++26 (P3323); a load through atomic_ref<T> writes nothing.
  *value = std::atomic_ref<uint32_t>(*const_cast<uint32_t*>(word.address))
               .load(std::memory_order_acquire);
  return true;
}

inline void WaitRelay::open(const std::vector<Front>& satisfied) {
  std::lock_guard lock(mutex_);
  for (const Front& front : satisfied) {
    std::deque<Wait>& queue = pending_[front.gate];
    // Release: whatever was written before the word is visible to the stream's later work.
    std::atomic_ref<uint64_t>(*front.gate).store(front.wait.ticket, std::memory_order_release);
    queue.pop_front();
    if (queue.empty()) {
      pending_.erase(front.gate);
      if (retired_.erase(front.gate) != 0) free_gates_.push_back(front.gate);
    }
  }
}

inline void WaitRelay::watch() {
  std::vector<Front> fronts, satisfied;
  unsigned idle_polls = 0;
  std::chrono::microseconds sleep{1};
  std::unique_lock lock(mutex_);
  while (!stop_) {
    if (pending_.empty()) {
      idle_polls = 0;
      sleep = std::chrono::microseconds{1};
      wake_.wait(lock);
      continue;
    }
    fronts.clear();
    for (auto& [gate, queue] : pending_)
      fronts.push_back(Front{gate, queue.front()});
    lock.unlock();
    satisfied.clear();
    for (const Front& front : fronts) {
      uint32_t word = 0;
      if (!arrived(front)) continue;  // the stream's earlier work may still change the word
      if (read(front.wait.word, &word) &&
          wait_condition_holds(word, front.wait.value, front.wait.condition))
        satisfied.push_back(front);
    }
    if (!satisfied.empty()) open(satisfied);
    lock.lock();
    if (!satisfied.empty()) {
      idle_polls = 0;
      sleep = std::chrono::microseconds{1};
    } else if (++idle_polls < kYieldPolls) {
      lock.unlock();
      std::this_thread::yield();
      lock.lock();
    } else {
      // A new wait wakes the watcher early; an unchanged word is read again after `sleep`.
      wake_.wait_for(lock, sleep);
      sleep = std::min(sleep * 2, kMaxSleep);
    }
  }
}

}  // namespace hm::kit::gpu
