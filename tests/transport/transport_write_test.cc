// TransportTest's writes: every size from 1 byte to 64 MiB at odd offsets on both sides, a burst
// of writes in flight whose notifications keep their order, and (the `ring` cases) a peer's ring
// writes that land while this process does not poll.
#include "transport_support.hpp"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace hetmesh {
namespace {

using namespace transport_test;

TEST_P(TransportTest, RoundTripsEverySizeAtOddOffsets) {
  for (uint32_t value = 0; value < kSizeCases; ++value) {
    write(value);
    await_notification(value);
    expect_echo(value);
  }
}

TEST_P(TransportTest, ManyWritesInFlightKeepTheirOrder) {
  for (int k = 0; k < kBurst; ++k)
    write(kBurstBase + k);
  await_notification(kBurstBase + kBurst - 1);
  while (notified_.size() < static_cast<size_t>(kBurst) && !HasFatalFailure())
    await_notification(kBurstBase + kBurst - 1);
  std::vector<uint32_t> issued;
  for (int k = 0; k < kBurst; ++k)
    issued.push_back(kBurstBase + k);
  EXPECT_EQ(notified_, issued) << "echo notifications arrived out of order";
  EXPECT_GE(writes_done_, 1);
  for (int k = 0; k < kBurst; ++k)
    expect_echo(kBurstBase + k);
}

// A poller that returns with events leaves the frames that come after them for its next poll
// (it asks for no wake-up), and then may not poll again for a while. A ring writer that runs out
// of slots meanwhile must still get them back: it wakes the reader's progress thread, which lands
// the chunks. Here the peer echoes 16 MiB through its 4 x 2 MiB ring after our last poll, which
// returned an event; its write can only finish if our side lands most of it without a poll. (The
// progress thread also looks at its ring once a second whatever happens, so without the writer's
// wake-up this passes too, a second later: the figure printed shows which.)
TEST_P(TransportTest, RingWritesLandWhileTheReaderDoesNotPoll) {
  if (GetParam().peer_plugin.empty()) GTEST_SKIP() << "for the ring cases";
  Shape s = shape_for(kReportedEcho);  // the bytes to echo, without a notification (no echo yet)
  connection_->write(*local_->region, s.src_offset, *remote_, s.peer_offset, s.length, std::nullopt,
                     kReportedEcho);
  bool written = false;
  while (!written && !HasFatalFailure()) {
    events_.clear();
    local_->transport->poll(events_, std::chrono::milliseconds(100));
    for (const auto& e : events_) {
      ASSERT_NE(e.type, TransportEvent::Type::peer_lost) << e.message;
      written |= e.type == TransportEvent::Type::write_done && e.cookie == kReportedEcho;
    }
  }
  send_text("reported");
  ASSERT_EQ(peer_->read_line(kWait), "PONGED");
  // Polls that do not wait read the pong from the queue or the ring once our progress thread, if
  // the pong woke it, is done with it, and return with it, leaving no wake-up asked for.
  events_.clear();
  for (auto give_up = std::chrono::steady_clock::now() + kWait;
       events_.empty() && std::chrono::steady_clock::now() < give_up;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    local_->transport->poll(events_, std::chrono::nanoseconds(0));
  }
  ASSERT_EQ(events_.size(), 1u);
  ASSERT_EQ(events_[0].type, TransportEvent::Type::control);
  ASSERT_EQ(std::string(events_[0].payload.begin(), events_[0].payload.end()), "pong reported");
  events_.clear();
  auto start = std::chrono::steady_clock::now();
  send_text(fmt::format("echo {}", kReportedEcho));
  EXPECT_EQ(peer_->read_line(kWait), fmt::format("ECHOED {}", kReportedEcho));
  std::printf(
      "[ figure ] 16 MiB through the peer's ring while we did not poll: %.1f ms\n",
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  await_notification(kReportedEcho);
  expect_echo(kReportedEcho);
}

}  // namespace
}  // namespace hetmesh
