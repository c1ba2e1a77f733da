// The plugin's stream and event handles, and waiting on them with a timeout.
#pragma once

#include "rocm_state.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace hm::rocm {

constexpr uint32_t kStreamMagic = 0x4d525453;  // "STRM"
constexpr uint32_t kEventMagic = 0x544e5645;   // "EVNT"

struct Stream {
  uint32_t magic = kStreamMagic;
  int32_t device = 0;
  hipStream_t stream = nullptr;
  uint64_t* gate = nullptr;  // the HM_WAIT_GEQ relay's gate word, on the first such wait
};

struct Event {
  uint32_t magic = kEventMagic;
  int32_t device = 0;
  unsigned flags = 0;  // hipEvent*
  bool timing = true;
  std::mutex mutex;  // guards creating events[d] for d != device
  // One hipEvent_t per device it was recorded on (a HIP event records only on streams of its own
  // device); events[device] exists from event_create.
  std::vector<hipEvent_t> events;
  std::atomic<int32_t> recorded_on{-1};  // device of the latest record, -1 if never recorded
};

Stream& stream_of(hm_stream handle);
Event& event_of(hm_event handle);

// Runs fn(user_data) on a runtime thread once prior work on the stream completes; later work waits
// for it to return. The caller has made the stream's device current.
void launch_host_function(const Stream& stream, hm_host_fn fn, void* user_data);

// Polls `query` (a hipError_t-returning callable) until it stops answering hipErrorNotReady or
// `timeout_ns` passes: yields first, then sleeps in doubling steps up to 100 us, never past the
// deadline. HIP has no timed stream or event wait.
template <typename Query>
void poll_until_done(Query query, uint64_t timeout_ns, const char* call, const char* what) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  uint64_t sleep_ns = 1000;
  for (unsigned polls = 0;; ++polls) {
    hipError_t result = query();
    if (result == hipSuccess) return;
    if (result != hipErrorNotReady) check(result, call);
    uint64_t elapsed = static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count());
    if (elapsed >= timeout_ns)
      hm::kit::fail(HM_ERR_TIMEOUT, "%s still pending after %llu ns", what,
                    static_cast<unsigned long long>(timeout_ns));
    if (polls < 64) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(
          std::chrono::nanoseconds(std::min(sleep_ns, timeout_ns - elapsed)));
      sleep_ns = std::min<uint64_t>(sleep_ns * 2, 100'000);
    }
  }
}

}  // namespace hm::rocm
