// HM_WAIT_GEQ on HIP: a stream wait for a cyclic "greater or equal".
//
// The ABI's GEQ is cyclic, (int32_t)(*addr - value) >= 0, so a sequence number that wraps past
// 2^32 still counts as "after" (CUDA's CU_STREAM_WAIT_VALUE_GEQ is the same). HIP's
// hipStreamWaitValueGte is a plain unsigned (*addr & mask) >= value, and no mask makes it cyclic.
// The relay bridges the two: the stream waits for a ticket on a 64-bit gate word of its own
// (hipStreamWaitValue64, Gte), and one watcher thread reads the 32-bit word and stores the ticket
// into the gate once the cyclic condition holds. Tickets come from one 64-bit counter, so they
// never wrap, and a gate reused by a later stream only ever sees larger tickets.
//
// A gate's waits open in the order they were enqueued: only its oldest pending wait is evaluated.
// The cost is the watcher's polling (yields, then sleeps of at most kMaxSleep) while any wait is
// pending; it sleeps on a condition variable otherwise.
//
// This file knows no HIP: the runtime is behind Backend (rocm_geq_relay_hip.hpp), so the relay's
// logic is tested without a GPU (tests/plugins/rocm_plugin_test.cc).
#pragma once

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
#include <vector>

namespace hm::rocm {

// True when the ABI's HM_WAIT_GEQ holds: (int32_t)(word - value) >= 0.
inline bool cyclic_geq(uint32_t word, uint32_t value) {
  return static_cast<int32_t>(word - value) >= 0;
}

class CyclicWaitRelay {
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
    // `bytes` of zeroed, 8-byte-aligned memory for gate words, which the host writes and every
    // device reads coherently.
    virtual void* allocate_gates(size_t bytes) = 0;
    virtual void free_gates(void* chunk) = 0;
    // Enqueues on `stream` a wait until *gate >= ticket (unsigned). Throws hm::kit::Failure.
    virtual void wait_for_ticket(void* stream, uint64_t* gate, uint64_t ticket) = 0;
    // Reads a word in device memory; false if it cannot (the backend reports why).
    virtual bool read_device_word(const Word& word, uint32_t* value) = 0;
  };

  static constexpr std::chrono::microseconds kMaxSleep{16};
  static constexpr size_t kGateChunkBytes = 4096;

  explicit CyclicWaitRelay(std::unique_ptr<Backend> backend);
  ~CyclicWaitRelay();  // stops the watcher, then frees the gate words and the backend
  CyclicWaitRelay(const CyclicWaitRelay&) = delete;
  CyclicWaitRelay& operator=(const CyclicWaitRelay&) = delete;

  // A gate word for one stream.
  uint64_t* acquire_gate();
  // The stream is gone: the gate goes back to the pool once its pending waits have opened.
  void release_gate(uint64_t* gate);

  // Enqueues on `stream` a wait until the cyclic condition on `word` holds for `value`. Throws
  // what the backend throws when the stream wait cannot be enqueued.
  void enqueue(void* stream, uint64_t* gate, Word word, uint32_t value);

 private:
  struct Wait {
    Word word;
    uint32_t value;
    uint64_t ticket;
  };
  struct Front {  // a gate's oldest wait, evaluated outside the lock
    uint64_t* gate;
    Wait wait;
  };

  void watch();
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

}  // namespace hm::rocm
