// Waiting with a timeout where the runtime has none: CUDA and HIP can block in a stream or event
// synchronize, or query, but not block for at most a given time.
#pragma once

#include "status.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <thread>

namespace hm::kit::gpu {

// Polls `done` (true once complete, false while pending; it throws on an error) until it is true
// or `timeout_ns` passes, then fails with HM_ERR_TIMEOUT naming `what`. Copies and kernels a comm
// thread waits for take microseconds, and a sleep costs at least the timer slack (50 us by
// default), so it spins (yielding) for 200 us first and only then sleeps, in doubling steps up to
// 100 us, never past the deadline.
template <typename Done>
void poll_until_done(Done done, uint64_t timeout_ns, const char* what) {
  using Clock = std::chrono::steady_clock;
  constexpr uint64_t kSpinNs = 200'000;
  const Clock::time_point start = Clock::now();
  uint64_t sleep_ns = 1000;
  for (;;) {
    if (done()) return;
    uint64_t elapsed = static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count());
    if (elapsed >= timeout_ns)
      fail(HM_ERR_TIMEOUT, "%s still pending after %llu ns", what,
           static_cast<unsigned long long>(timeout_ns));
    if (elapsed < kSpinNs) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(
          std::chrono::nanoseconds(std::min(sleep_ns, timeout_ns - elapsed)));
      sleep_ns = std::min<uint64_t>(sleep_ns * 2, 100'000);
    }
  }
}

}  // namespace hm::kit::gpu
