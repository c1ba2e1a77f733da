// How long the thread that watches a transport's completion queues spins (verbs, fabric)
// (backends/src/common/spin_window.hpp): a window that follows the gap between completions,
// clamped, measured from a caller's own start while completions are recent, and none once the
// transport has been quiet.
#include "common/spin_window.hpp"

#include <gtest/gtest.h>

namespace hetmesh::detail {
namespace {

using std::chrono::microseconds;
using Clock = SpinWindow::Clock;

// Feeds `window` 64 completions `gap` apart, the last at `last`.
void feed(SpinWindow& window, microseconds gap, Clock::time_point last) {
  for (int i = 63; i >= 0; --i)
    window.completed(last - i * gap);
}

TEST(SpinWindow, FollowsTheGapBetweenCompletions) {
  auto last = Clock::now();
  SpinWindow window(false);
  feed(window, microseconds(100), last);
  auto spin = window.spin_until() - last;
  // The average of 63 gaps of 100 us, from 0 by eighths: within a few percent of 100 us.
  EXPECT_GT(spin, SpinWindow::kGapFactor * microseconds(95));
  EXPECT_LE(spin, SpinWindow::kGapFactor * microseconds(100));
}

TEST(SpinWindow, IsClampedOnBothSides) {
  auto last = Clock::now();
  SpinWindow fast(false), slow(false);
  feed(fast, microseconds(1), last);
  feed(slow, SpinWindow::kMaxSpin * 10, last);
  EXPECT_EQ(fast.spin_until() - last, SpinWindow::kMinSpin);
  EXPECT_EQ(slow.spin_until() - last, SpinWindow::kMaxSpin);
}

TEST(SpinWindow, ACallerSpinsFromItsOwnStartWhileCompletionsAreRecent) {
  auto last = Clock::now();
  SpinWindow window(false);
  feed(window, microseconds(100), last);
  auto length = window.spin_until() - last;
  // Woken late (after the window from the last completion has passed), it still gets a window.
  auto late = last + length + microseconds(10);
  EXPECT_EQ(window.spin_until(late), late + length);
  // Early, the window runs from its start too.
  auto early = last + microseconds(10);
  EXPECT_EQ(window.spin_until(early), early + length);
}

TEST(SpinWindow, AQuietTransportDoesNotSpin) {
  auto last = Clock::now();
  SpinWindow window(false);
  feed(window, microseconds(100), last);
  auto start = last + SpinWindow::kQuiet + microseconds(1);
  EXPECT_LE(window.spin_until(start), start);
  EXPECT_LE(window.spin_until(), start);
  SpinWindow fresh(false);  // no completion yet
  auto now = Clock::now();
  EXPECT_LE(fresh.spin_until(now), now);
}

TEST(SpinWindow, BusyPollingNeverStops) {
  SpinWindow busy(true);
  EXPECT_EQ(busy.spin_until(), Clock::time_point::max());
  EXPECT_EQ(busy.spin_until(Clock::now()), Clock::time_point::max());
}

}  // namespace
}  // namespace hetmesh::detail
