// Connection::write's `more` (libfabric's FI_MORE): a run of writes each saying another follows
// delivers every notification, in order, once a write without it (or a control message) ends the
// run. ipc holds the run's notifications until then (one publication for the lot) and verbs its
// work requests (one ibv_post_send for the lot), which the first case checks; tcp delivers each at
// once, and the rest holds for all three. verbs runs in the soft-RoCE VM (ci/verbs-tests.sh).
#include <hetmesh/core/error.hpp>
#include <hetmesh/core/plugin.hpp>
#include <hetmesh/transport/transport.hpp>

#include "verbs_support.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <future>
#include <optional>
#include <string>
#include <vector>

namespace hetmesh {
namespace {

using namespace std::chrono_literals;

constexpr uint64_t kBytes = 64 << 10;
constexpr uint64_t kWrite = 256;  // inline on ipc: the run's notifications are held there

struct End {
  Device device = PluginRegistry::load().device("cpu:0");
  Buffer memory = device.allocate(kBytes);
  std::unique_ptr<Transport> transport;
  std::shared_ptr<Region> region;
  std::shared_ptr<Connection> connection;
  std::shared_ptr<RemoteRegion> peer;
  explicit End(TransportKind kind) {
    TransportOptions options;
    options.kind = kind;
    transport = Transport::create(options);
    region = transport->register_memory(device, memory.data(), kBytes);
  }
  uint8_t* at(uint64_t offset) { return static_cast<uint8_t*>(memory.data()) + offset; }
};

class WriteMoreTest : public testing::TestWithParam<TransportKind> {
 protected:
  void SetUp() override {
    HETMESH_SKIP_UNLESS_USABLE(GetParam());
    a_.emplace(GetParam());
    b_.emplace(GetParam());
    auto other = std::async(std::launch::async,
                            [&] { return b_->transport->connect(a_->transport->endpoint(), 10s); });
    a_->connection = a_->transport->connect(b_->transport->endpoint(), 10s);
    b_->connection = other.get();
    a_->peer = a_->connection->import_region(b_->region->describe());
  }

  // Write k (of kWrite bytes, each byte k) into slot k of b, notified with k unless `notify` is
  // false.
  void write(uint32_t k, bool more, bool notify = true) {
    std::memset(a_->at(k * kWrite), static_cast<int>(k), kWrite);
    a_->connection->write(*a_->region, k * kWrite, *a_->peer, k * kWrite, kWrite,
                          notify ? std::optional<uint32_t>(k) : std::nullopt, k, more);
  }

  // What b receives within `wait`, in order: "n<k>" per notification, "c<text>" per control
  // message; stops early once `until` events came.
  std::vector<std::string> receive(std::chrono::milliseconds wait, size_t until) {
    std::vector<std::string> got;
    std::vector<TransportEvent> events;
    for (auto end = std::chrono::steady_clock::now() + wait;
         got.size() < until && std::chrono::steady_clock::now() < end;) {
      events.clear();
      b_->transport->poll(events, 10ms);
      for (const auto& e : events) {
        EXPECT_NE(e.type, TransportEvent::Type::peer_lost) << e.message;
        if (e.type == TransportEvent::Type::notification) {
          got.push_back("n" + std::to_string(e.value));
          // The bytes landed before their notification.
          EXPECT_EQ(*b_->at(e.value * kWrite + kWrite - 1), static_cast<uint8_t>(e.value));
        }
        if (e.type == TransportEvent::Type::control)
          got.push_back("c" + std::string(e.payload.begin(), e.payload.end()));
      }
    }
    return got;
  }

  std::optional<End> a_, b_;
};

TEST_P(WriteMoreTest, ARunsNotificationsArriveInOrderOnceAWriteWithoutMoreEndsIt) {
  for (uint32_t k = 1; k <= 5; ++k)
    write(k, /*more=*/true);
  if (GetParam() != TransportKind::tcp) {
    EXPECT_TRUE(receive(100ms, 1).empty()) << "nothing was held back for the run's end";
  }
  write(6, /*more=*/false);
  EXPECT_EQ(receive(10s, 6), (std::vector<std::string>{"n1", "n2", "n3", "n4", "n5", "n6"}));
}

TEST_P(WriteMoreTest, AWriteWithoutANotificationEndsTheRunToo) {
  for (uint32_t k = 1; k <= 3; ++k)
    write(k, /*more=*/true);
  write(4, /*more=*/false, /*notify=*/false);
  EXPECT_EQ(receive(10s, 3), (std::vector<std::string>{"n1", "n2", "n3"}));
}

TEST_P(WriteMoreTest, ARefusedWriteWithoutMoreEndsTheRunToo) {
  for (uint32_t k = 1; k <= 3; ++k)
    write(k, /*more=*/true);
  try {  // past the end of the peer's region
    a_->connection->write(*a_->region, 0, *a_->peer, kBytes, kWrite, 9u, 9, /*more=*/false);
    ADD_FAILURE() << "a write past the peer's region was taken";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), HM_ERR_INVALID_ARGUMENT) << e.what();
  }
  EXPECT_EQ(receive(10s, 3), (std::vector<std::string>{"n1", "n2", "n3"}));
}

TEST_P(WriteMoreTest, AControlMessageEndsTheRunAndComesAfterIt) {
  write(1, /*more=*/true);
  write(2, /*more=*/true);
  const std::string text = "after";
  a_->connection->send_control(
      std::span(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
  std::vector<std::string> got = receive(10s, 3);
  if (GetParam() == TransportKind::verbs) {
    // verbs sends control messages on its socket, beside the data path: no order between the
    // two, only within each.
    auto control = std::find(got.begin(), got.end(), "cafter");
    ASSERT_NE(control, got.end()) << "the control message never came";
    got.erase(control);
    EXPECT_EQ(got, (std::vector<std::string>{"n1", "n2"}));
    return;
  }
  EXPECT_EQ(got, (std::vector<std::string>{"n1", "n2", "cafter"}));
}

INSTANTIATE_TEST_SUITE_P(Kinds, WriteMoreTest,
                         testing::Values(TransportKind::ipc, TransportKind::tcp,
                                         TransportKind::verbs),
                         [](const auto& kind) { return std::string(to_string(kind.param)); });

}  // namespace
}  // namespace hetmesh
