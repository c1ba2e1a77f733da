// The HM_WAIT_GEQ relay's logic (rocm_geq_relay.hpp says how it works): gates, tickets and the
// watcher thread. No HIP here.
#include "rocm_geq_relay.hpp"

#include <algorithm>
#include <atomic>

namespace hm::rocm {
namespace {

constexpr unsigned kYieldPolls = 256;  // polls that only yield before the watcher starts sleeping

}  // namespace

CyclicWaitRelay::CyclicWaitRelay(std::unique_ptr<Backend> backend) : backend_(std::move(backend)) {
  watcher_ = std::thread([this] { watch(); });
}

CyclicWaitRelay::~CyclicWaitRelay() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  watcher_.join();
  for (void* chunk : gate_chunks_)
    backend_->free_gates(chunk);
}

uint64_t* CyclicWaitRelay::acquire_gate() {
  std::lock_guard lock(mutex_);
  if (free_gates_.empty()) {
    void* chunk = backend_->allocate_gates(kGateChunkBytes);
    gate_chunks_.push_back(chunk);
    auto* words = static_cast<uint64_t*>(chunk);
    for (size_t i = kGateChunkBytes / sizeof(uint64_t); i-- > 0;)
      free_gates_.push_back(&words[i]);
  }
  uint64_t* gate = free_gates_.back();
  free_gates_.pop_back();
  return gate;
}

void CyclicWaitRelay::release_gate(uint64_t* gate) {
  std::lock_guard lock(mutex_);
  if (pending_.count(gate) != 0)
    retired_.insert(gate);
  else
    free_gates_.push_back(gate);
}

void CyclicWaitRelay::enqueue(void* stream, uint64_t* gate, Word word, uint32_t value) {
  {
    std::lock_guard lock(mutex_);
    uint64_t ticket = next_ticket_++;
    // Under the lock, so the watcher cannot open this ticket before it is queued on the stream.
    backend_->wait_for_ticket(stream, gate, ticket);
    pending_[gate].push_back(Wait{word, value, ticket});
  }
  wake_.notify_one();
}

bool CyclicWaitRelay::read(const Word& word, uint32_t* value) {
  if (!word.host) return backend_->read_device_word(word, value);
  *value = std::atomic_ref<const uint32_t>(*word.address).load(std::memory_order_acquire);
  return true;
}

void CyclicWaitRelay::open(const std::vector<Front>& satisfied) {
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

void CyclicWaitRelay::watch() {
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
      if (read(front.wait.word, &word) && cyclic_geq(word, front.wait.value))
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

}  // namespace hm::rocm
