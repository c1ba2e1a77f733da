// Spinning before sleeping, for the threads on the AFD hot path (senders, completion threads, the
// caller waiting for a round trip, the FFN waiting for a batch).
//
// Each hop of a round trip hands work from one thread to another. A futex sleep and wake-up costs
// 5-10 us per hop (more in a VM, where the wake-up is an IPI), which on two GPUs joined by NVLink
// is as long as the copy itself; a thread that spins for its next job takes it in well under a
// microsecond. So a thread spins while its jobs come back to back, and sleeps at once when they
// do not (an idle engine burns no CPU), and never spins on a machine too small to give each
// spinning thread a core of its own: there it takes the core that the work it waits for needs.
#pragma once

#include <sched.h>

#include <atomic>
#include <chrono>
#include <thread>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

// Exported from the library, which hides every other symbol (core/README.md, "Exports").
#pragma GCC visibility push(default)

namespace hetmesh {

// A pause for spin loops: lets the sibling hyperthread run and saves power.
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

// Decides whether a thread that found nothing to do should spin for its next job before it
// sleeps: while at least a quarter of its recent waits ended within kSpin (a round trip on two
// GPUs is 30-80 us, so a thread whose job comes once per round trip keeps spinning, and one whose
// jobs come further apart sleeps at once). A quarter, not most: a few slow round trips must not
// make a thread sleep, as its wake-up then costs more slow round trips (up to 200 us each in a VM,
// whose idle vCPU must be scheduled again): with three quarters, `hetmesh bench afd` on two H200s
// had a p99 of 480 us. Never in a process that may run on fewer than kMinCpus CPUs: there the
// spinning threads take the cores that the copies they wait for need (`hetmesh bench afd` on 2
// cores had 6-45% slower round trips with spinning threads, in three paired runs; on 4 pinned
// CPUs per instance of a 16-core machine, F's respond delay rose from 11 to 36-90 us). One per
// waiting thread; record() and should_spin() may race harmlessly.
class SpinPolicy {
 public:
  static constexpr std::chrono::microseconds kSpin{200};
  static constexpr unsigned kMinCpus = 8;

  explicit SpinPolicy(unsigned cpus = usable_cpus()) : enabled_(cpus >= kMinCpus) {}

  // The CPUs this thread may run on (its affinity mask, inherited from the process's pinning).
  static unsigned usable_cpus() {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) return static_cast<unsigned>(CPU_COUNT(&set));
    return std::thread::hardware_concurrency();
  }

  bool should_spin() const {
    return enabled_ && hits_.load(std::memory_order_relaxed) >= kHitsToSpin;
  }

  // Folds in one wait: how long it took, and whether it spun first. A wait that ended in a sleep
  // includes the wake-up, so it counts as a hit up to kSpin later: otherwise a thread that stopped
  // spinning would, by sleeping, make its waits too long to ever start again.
  void record(std::chrono::nanoseconds waited, bool spun) {
    auto limit = spun ? kSpin : 2 * kSpin;
    int hit = waited <= limit ? 1024 : 0;
    int rate = hits_.load(std::memory_order_relaxed);
    hits_.store(rate + (hit - rate) / 8, std::memory_order_relaxed);
  }

  // Spins until `done()` holds or kSpin passes, if spinning pays; returns done(). The caller then
  // sleeps the usual way (if it must) and record()s the whole wait.
  template <typename Done>
  bool spin(Done&& done) const {
    if (!should_spin()) return done();
    auto until = std::chrono::steady_clock::now() + kSpin;
    for (int i = 0;; ++i) {
      if (done()) return true;
      if ((i & 31) == 31 && std::chrono::steady_clock::now() >= until) return done();
      cpu_relax();
    }
  }

 private:
  static constexpr int kHitsToSpin = 256;  // /1024
  bool enabled_;
  std::atomic<int> hits_{1024};  // share of recent waits that ended within the limit, /1024
};

// Measures one wait for a SpinPolicy: spins, and on scope exit records how long the whole wait
// (spin and sleep) took.
class TimedWait {
 public:
  explicit TimedWait(SpinPolicy& policy)
      : policy_(policy), start_(std::chrono::steady_clock::now()) {}
  ~TimedWait() { policy_.record(std::chrono::steady_clock::now() - start_, spun_); }
  TimedWait(const TimedWait&) = delete;
  TimedWait& operator=(const TimedWait&) = delete;

  template <typename Done>
  bool spin(Done&& done) {
    spun_ = policy_.should_spin();
    return policy_.spin(done);
  }

 private:
  SpinPolicy& policy_;
  std::chrono::steady_clock::time_point start_;
  bool spun_ = false;
};

}  // namespace hetmesh

#pragma GCC visibility pop
