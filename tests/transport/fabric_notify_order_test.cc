// The fabric transport's two ways of raising a notification on one connection: as the last RMA
// write's remote CQ data, and as a notice message (a staged region's write needs one to copy its
// bytes in). The peer's provider reports a write's data on arrival but may hold a message back,
// so once a notice has gone, every later notification must go as one too: here notified writes
// into host memory by data, then writes into device memory behind a host mirror (notices)
// interleaved with notified writes into host memory, all in flight at once, more notices than
// the peer has receives posted. Every notification must arrive in issue order, and with it the
// device bytes of the staged write before it.
// Over libfabric's tcp provider, which carries notifications as data.
#include <hetmesh/core/plugin.hpp>
#include <hetmesh/transport/transport.hpp>

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <future>
#include <string>
#include <vector>

namespace hetmesh {
namespace {

using namespace std::chrono_literals;

constexpr uint64_t kPiece = 4096;
constexpr uint32_t kFirst = 32;   // notified writes by data before the first notice
constexpr uint32_t kPairs = 600;  // then a staged write and a notified write, each

std::vector<uint8_t> pattern(uint32_t i) {
  std::vector<uint8_t> bytes(kPiece);
  for (uint64_t k = 0; k < kPiece; ++k)
    bytes[k] = static_cast<uint8_t>(i * 31 + k * 7 + 1);
  return bytes;
}

TEST(FabricNotifyOrder, NotificationsByDataAndByNoticeArriveInIssueOrder) {
  PluginRegistry plugins = PluginRegistry::load();
  Device cpu = plugins.device("cpu:0");
  Device stub = plugins.device("asic_stub:0");
  TransportOptions options;
  options.kind = TransportKind::fabric;
  options.fabric_provider = "tcp";
  auto a = Transport::create(options);
  auto b = Transport::create(options);

  Buffer source = cpu.allocate(kPiece * (kPairs + 1));
  Buffer host_target = cpu.allocate(kPiece);
  Buffer device_target = stub.allocate(kPiece * kPairs);
  auto from = a->register_memory(cpu, source.data(), kPiece * (kPairs + 1));
  auto into_host = b->register_memory(cpu, host_target.data(), kPiece);
  auto into_device = b->register_memory(stub, device_target.data(), kPiece * kPairs);

  auto b_connects = std::async(std::launch::async, [&] { return b->connect(a->endpoint(), 30s); });
  auto to_b = a->connect(b->endpoint(), 30s);
  auto to_a = b_connects.get();
  auto host = to_b->import_region(into_host->describe());
  auto device = to_b->import_region(into_device->describe());

  auto* bytes = static_cast<uint8_t*>(source.data());
  for (uint32_t i = 0; i < kPairs; ++i)
    std::memcpy(bytes + i * kPiece, pattern(i).data(), kPiece);
  uint64_t cookie = 0;
  uint32_t value = 0;
  for (; value < kFirst; ++value)
    to_b->write(*from, kPairs * kPiece, *host, 0, 8, value, cookie++);
  for (uint32_t i = 0; i < kPairs; ++i, ++value) {
    to_b->write(*from, i * kPiece, *device, i * kPiece, kPiece, std::nullopt, cookie++);
    to_b->write(*from, kPairs * kPiece, *host, 0, 8, value, cookie++);
  }

  Stream stream = stub.create_stream();
  std::vector<uint8_t> landed(kPiece);
  std::vector<TransportEvent> events;
  uint32_t expected = 0;
  auto until = std::chrono::steady_clock::now() + 60s;
  while (expected < value && std::chrono::steady_clock::now() < until) {
    events.clear();
    b->poll(events, 100ms);
    for (const auto& e : events) {
      ASSERT_NE(e.type, TransportEvent::Type::peer_lost) << e.message;
      if (e.type != TransportEvent::Type::notification) continue;
      ASSERT_EQ(e.value, expected) << "notifications out of issue order";
      // The staged write issued just before this notification is on the device (those before it
      // were checked at their own notifications).
      if (expected >= kFirst) {
        const uint32_t i = expected - kFirst;
        stream.copy(landed.data(), static_cast<uint8_t*>(device_target.data()) + i * kPiece,
                    kPiece);
        stream.synchronize();
        ASSERT_EQ(landed, pattern(i)) << "staged write " << i << " is not on the device when the "
                                      << "notification " << expected << " after it arrives";
      }
      ++expected;
    }
  }
  EXPECT_EQ(expected, value);
  EXPECT_TRUE(to_a->alive());
  EXPECT_TRUE(to_b->alive());
}

}  // namespace
}  // namespace hetmesh
