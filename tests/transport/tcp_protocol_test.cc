// The tcp receiver must refuse frames that point outside a registered region, name unknown
// regions or are not frames at all: the peer is dropped with a reason, and no byte lands.
#include "common/socket_link.hpp"

#include <hetmesh/transport/transport.hpp>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstring>
#include <thread>

namespace hetmesh {
namespace {

// Mirrors the tcp frame header (backends/src/tcp/tcp_transport.cc).
struct FrameHeader {
  uint32_t magic = 0x50544d48;
  uint8_t version = 1;
  uint8_t type = 2;  // write with notification
  uint16_t reserved = 0;
  uint32_t region = 1;
  uint32_t value = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
};

class TcpProtocolTest : public testing::Test {
 protected:
  void SetUp() override {
    device_ = PluginRegistry::load().device("cpu:0");
    memory_ = device_->allocate(4096);
    std::memset(memory_.data(), 0x11, 4096);
    transport_ = Transport::create(TransportOptions{});
    region_ = transport_->register_memory(*device_, memory_.data(), 4096);
  }

  // Connects a raw socket as a peer whose id sorts first (so it dials), sends `bytes`, and returns
  // the peer_lost message the transport reports.
  std::string send_raw(const std::vector<uint8_t>& bytes) {
    auto endpoint = nlohmann::json::parse(transport_->endpoint());
    std::string address = endpoint["address"];
    std::thread fake([&] {
      detail::Fd fd = detail::dial({address}, "0000000000000000", endpoint["endpoint"],
                                   JobSecret::none(), std::chrono::seconds(10));
      detail::send_all(fd.get(), bytes.data(), bytes.size(), "raw frame");
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    });
    nlohmann::json fake_endpoint = {
        {"transport", "tcp"}, {"endpoint", "0000000000000000"}, {"address", "tcp://127.0.0.1:1"}};
    std::string text = fake_endpoint.dump();
    auto connection = transport_->connect({text.begin(), text.end()}, std::chrono::seconds(10));
    std::string lost;
    std::vector<TransportEvent> events;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (lost.empty() && std::chrono::steady_clock::now() < deadline) {
      events.clear();
      transport_->poll(events, std::chrono::milliseconds(100));
      for (const auto& e : events) {
        EXPECT_NE(e.type, TransportEvent::Type::notification) << "a refused write notified";
        if (e.type == TransportEvent::Type::peer_lost) lost = e.message;
      }
    }
    fake.join();
    EXPECT_FALSE(connection->alive());
    return lost;
  }

  std::vector<uint8_t> frame(const FrameHeader& h, size_t payload) {
    std::vector<uint8_t> bytes(sizeof h + payload, 0xee);
    std::memcpy(bytes.data(), &h, sizeof h);
    return bytes;
  }

  void expect_untouched() {
    for (int i = 0; i < 4096; ++i)
      ASSERT_EQ(static_cast<uint8_t*>(memory_.data())[i], 0x11) << "byte " << i << " was written";
  }

  std::optional<Device> device_;
  Buffer memory_;
  std::unique_ptr<Transport> transport_;
  std::shared_ptr<Region> region_;
};

TEST_F(TcpProtocolTest, WritePastTheEndOfARegionIsRefused) {
  FrameHeader h;
  h.offset = 4000;
  h.length = 200;
  std::string lost = send_raw(frame(h, 200));
  EXPECT_NE(lost.find("outside its 4096 bytes"), std::string::npos) << lost;
  expect_untouched();
}

TEST_F(TcpProtocolTest, OffsetOverflowIsRefused) {
  FrameHeader h;
  h.offset = UINT64_MAX - 10;
  h.length = 20;
  std::string lost = send_raw(frame(h, 0));
  EXPECT_NE(lost.find("outside"), std::string::npos) << lost;
  expect_untouched();
}

TEST_F(TcpProtocolTest, UnknownRegionIsRefused) {
  FrameHeader h;
  h.region = 77;
  h.length = 8;
  std::string lost = send_raw(frame(h, 8));
  EXPECT_NE(lost.find("region 77, which is not registered"), std::string::npos) << lost;
  expect_untouched();
}

TEST_F(TcpProtocolTest, GarbageIsRefused) {
  FrameHeader h;
  h.magic = 0xdeadbeef;
  std::string lost = send_raw(frame(h, 0));
  EXPECT_NE(lost.find("bad frame"), std::string::npos) << lost;
}

TEST_F(TcpProtocolTest, OversizedControlMessageIsRefused) {
  FrameHeader h;
  h.type = 3;
  h.length = 1 << 30;
  std::string lost = send_raw(frame(h, 0));
  EXPECT_NE(lost.find("exceeds"), std::string::npos) << lost;
}

TEST(TransportOptionsTest, UnknownTransportNameIsRefused) {
  try {
    parse_transport_kind("carrier_pigeon");
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("choose ipc, tcp, verbs or fabric"), std::string::npos);
  }
}

TEST(TransportOptionsTest, ConnectToNobodyTimesOut) {
  auto transport = Transport::create(TransportOptions{});
  nlohmann::json nobody = {
      {"transport", "tcp"}, {"endpoint", "0000000000000001"}, {"address", "tcp://127.0.0.1:1"}};
  std::string text = nobody.dump();
  try {
    transport->connect({text.begin(), text.end()}, std::chrono::milliseconds(300));
    FAIL() << "connected to nobody";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), HM_ERR_TIMEOUT) << e.what();
  }
}

}  // namespace
}  // namespace hetmesh
