// The spin-before-sleep policy of the hot-path threads (hetmesh/core/spin.hpp): when it spins, when
// it stops, when it starts again, and that a spin sees a condition set by another thread.
#include <hetmesh/core/spin.hpp>

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

namespace hetmesh {
namespace {

using std::chrono::microseconds;

TEST(SpinPolicy, NeverSpinsOnASmallMachine) {
  SpinPolicy policy(SpinPolicy::kMinCpus - 1);
  EXPECT_FALSE(policy.should_spin());
  int calls = 0;
  EXPECT_FALSE(policy.spin([&] { return ++calls > 1; }));
  EXPECT_EQ(calls, 1) << "a policy that does not spin asks once";
}

TEST(SpinPolicy, SpinsUntilAnotherThreadSetsTheCondition) {
  SpinPolicy policy(SpinPolicy::kMinCpus);
  ASSERT_TRUE(policy.should_spin());
  std::atomic<bool> set{false};
  std::thread setter([&] {
    std::this_thread::sleep_for(microseconds(20));
    set.store(true, std::memory_order_release);
  });
  // Within kSpin (200 us), unless the setter was descheduled for that long; then the spin gives
  // up, which this checks too, by asking again.
  bool seen = policy.spin([&] { return set.load(std::memory_order_acquire); });
  setter.join();
  EXPECT_TRUE(seen || policy.spin([&] { return set.load(std::memory_order_acquire); }));
}

TEST(SpinPolicy, GivesUpAfterKSpinWhenNothingComes) {
  SpinPolicy policy(SpinPolicy::kMinCpus);
  auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(policy.spin([] { return false; }));
  EXPECT_GE(std::chrono::steady_clock::now() - start, SpinPolicy::kSpin);
}

TEST(SpinPolicy, StopsAfterLongWaitsAndStartsAgainAfterShortOnes) {
  SpinPolicy policy(SpinPolicy::kMinCpus);
  int long_waits = 0;
  while (policy.should_spin() && long_waits < 100) {
    policy.record(SpinPolicy::kSpin * 3, true);
    ++long_waits;
  }
  EXPECT_FALSE(policy.should_spin());
  EXPECT_GE(long_waits, 8) << "a few slow waits must not stop the spinning";
  EXPECT_LE(long_waits, 16) << "a run of waits longer than kSpin turns spinning off";
  // Waits that slept count as hits up to 2 kSpin (the wake-up is part of them).
  int short_waits = 0;
  while (!policy.should_spin() && short_waits < 100) {
    policy.record(SpinPolicy::kSpin + microseconds(50), false);
    ++short_waits;
  }
  EXPECT_TRUE(policy.should_spin());
  EXPECT_LT(short_waits, 100);
}

TEST(TimedWait, RecordsTheWholeWait) {
  SpinPolicy policy(SpinPolicy::kMinCpus);
  for (int i = 0; i < 20; ++i) {
    TimedWait wait(policy);
    wait.spin([] { return true; });
    std::this_thread::sleep_for(SpinPolicy::kSpin * 3);  // the "sleep" part of the wait
  }
  EXPECT_FALSE(policy.should_spin()) << "waits that slept past the limit count as misses";
}

}  // namespace
}  // namespace hetmesh
