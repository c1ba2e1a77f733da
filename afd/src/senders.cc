// What a sender waits for before it posts, and where senders run (senders.hpp).
#include "senders.hpp"

#include <algorithm>
#include <chrono>

namespace hetmesh::afd {

bool wait_ready(const ReadyWait& ready, const std::atomic<bool>& stopping) {
  // Slices short enough that a stopping engine is not held up for long.
  constexpr auto kSlice = std::chrono::milliseconds(10);
  if (ready.event != nullptr) {
    while (!ready.event->ready()) {
      if (stopping.load(std::memory_order_acquire)) return false;
      try {
        ready.event->synchronize(kSlice);
      } catch (const Error& e) {
        if (e.status() != HM_ERR_TIMEOUT) throw;
      }
    }
    return true;
  }
  if (ready.flag != nullptr) {
    auto reached = [&] {
      return static_cast<int32_t>(
                 std::atomic_ref<const uint32_t>(*static_cast<const uint32_t*>(ready.flag))
                     .load(std::memory_order_acquire) -
                 ready.value) >= 0;
    };
    // A stream writes the flag: spin briefly, then poll it with growing sleeps (up to 50 us).
    auto spin_until = Clock::now() + std::chrono::microseconds(20);
    auto pause = std::chrono::microseconds(1);
    while (!reached()) {
      if (stopping.load(std::memory_order_acquire)) return false;
      if (Clock::now() < spin_until) {
        cpu_relax();
      } else {
        std::this_thread::sleep_for(pause);
        pause = std::min(pause * 2, std::chrono::microseconds(50));
      }
    }
  }
  return true;
}

int sender_cpu(const std::vector<int>& comm_cpus, size_t index) {
  if (comm_cpus.empty()) return -1;
  return comm_cpus[(1 + index) % comm_cpus.size()];
}

}  // namespace hetmesh::afd
