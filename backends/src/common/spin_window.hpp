// How long the thread that watches a transport's completion queues spins before it sleeps (verbs,
// fabric).
//
// A sleep and the wake-up after it cost each hop of a round trip two thread wake-ups (the poller's
// on the completion channel, then the caller's on the event queue): microseconds on a host, and
// hundreds of microseconds in a virtual machine, where an 8 B ping-pong over soft-RoCE then took
// 520 us one way against ib_write_lat's 20. A fixed spin window is either too short for round
// trips slower than it (they always sleep) or wastes CPU on fast ones. This one follows the
// traffic: it spins for kGapFactor times the typical gap between completions after the last one,
// within [kMinSpin, kMaxSpin], so ping-pong traffic never sleeps and an idle transport stops
// spinning within kMaxSpin. One thread spins at a time (the caller of poll() while there is one,
// else the poller thread), whatever the machine's size, as the poller alone did before.
#pragma once

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>

namespace hetmesh::detail {

class SpinWindow {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr std::chrono::microseconds kMinSpin{50};
  static constexpr std::chrono::microseconds kMaxSpin{2000};
  static constexpr int kGapFactor = 4;
  static constexpr std::chrono::microseconds kQuiet = 2 * kMaxSpin;

  // `busy`: never stop spinning (TransportOptions::busy_poll).
  explicit SpinWindow(bool busy) : busy_(busy) {}

  // Folds in a completion seen at `now`: the gap since the one before (at most kMaxSpin, so one
  // idle stretch does not stretch the window for long) into a running average (1/8 per gap).
  // Called with the completion queues' mutex held: one writer.
  void completed(Clock::time_point now) {
    int64_t at =
        std::chrono::duration_cast<std::chrono::nanoseconds>(now.time_since_epoch()).count();
    int64_t last = last_.load(std::memory_order_relaxed);
    if (last != 0) {
      int64_t gap = std::min<int64_t>(at - last, kMaxSpinNs);
      int64_t average = gap_.load(std::memory_order_relaxed);
      gap_.store(average + (gap - average) / 8, std::memory_order_relaxed);
    }
    last_.store(at, std::memory_order_relaxed);
  }

  // Until when the poller thread, which has seen nothing since the last completion, spins.
  Clock::time_point spin_until() const {
    return busy_ ? Clock::time_point::max() : last() + window();
  }

  // Until when a caller that started waiting at `start` spins: a window from the later of the
  // last completion and `start`, if completions came recently. From `start` too, not only from
  // the last completion: a caller whose own wake-up was slow (hundreds of microseconds in a
  // virtual machine) would otherwise find the window gone, sleep again, and keep the round trips
  // slow for ever. Not at all once the transport has been quiet for kQuiet, so an idle caller
  // that polls in a loop sleeps at once.
  Clock::time_point spin_until(Clock::time_point start) const {
    if (busy_) return Clock::time_point::max();
    auto from = last();
    if (start - from <= kQuiet) from = std::max(from, start);
    return from + window();
  }

 private:
  Clock::time_point last() const {
    std::chrono::nanoseconds at(last_.load(std::memory_order_relaxed));
    return Clock::time_point(std::chrono::duration_cast<Clock::duration>(at));
  }
  std::chrono::nanoseconds window() const {
    return std::chrono::nanoseconds(std::clamp<int64_t>(
        kGapFactor * gap_.load(std::memory_order_relaxed), kMinSpinNs, kMaxSpinNs));
  }

  static constexpr int64_t kMinSpinNs = std::chrono::nanoseconds(kMinSpin).count();
  static constexpr int64_t kMaxSpinNs = std::chrono::nanoseconds(kMaxSpin).count();
  const bool busy_;
  std::atomic<int64_t> last_{0};  // the last completion, ns since the clock's epoch
  std::atomic<int64_t> gap_{0};   // the average gap between completions, ns
};

// A spinning thread gives the CPU away every kEvery: the kernel's own work for the NIC (rxe's,
// in softirq threads once it defers it) may need this very CPU, and would otherwise wait behind
// the spinner for a scheduler tick (4 ms): on a 2-vCPU machine, with a spinner in each of two
// processes, one-way latencies then jumped from 40 us to 1.5-5 ms for stretches. Where nothing
// else waits, sched_yield returns at once.
class SpinYield {
 public:
  static constexpr std::chrono::microseconds kEvery{20};
  void operator()(SpinWindow::Clock::time_point now) {
    if (now - last_ < kEvery) return;
    sched_yield();
    last_ = now;
  }

 private:
  SpinWindow::Clock::time_point last_ = SpinWindow::Clock::now();
};

}  // namespace hetmesh::detail
