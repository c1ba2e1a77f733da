// What the files of transport_test share: the writes' shapes, one side of a connection (Side), a
// case's parameter (Param), and the fixture TransportTest, whose set-up starts the peer (this
// binary re-run with --peer) and connects to it. transport_test.cc defines what is declared here.
#pragma once

#include <hetmesh/core/subprocess.hpp>
#include <hetmesh/transport/transport.hpp>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

namespace hetmesh::transport_test {

inline constexpr uint64_t kHalf = (64ull << 20) + (256 << 10);
// Sources in the first half of a region, echoes in the second.
inline constexpr uint64_t kRegionSize = 2 * kHalf;
inline constexpr std::chrono::seconds kWait{120};
inline constexpr uint32_t kBurstBase = 1000;
inline constexpr int kBurst = 64;

// The peer echoes this value when told to (control "echo 4000") and says so on its standard
// output once its write is done ("ECHOED 4000"), so a test can wait for it without polling.
inline constexpr uint32_t kReportedEcho = 4000;

// Where the bytes of a write with notification `value` come from and go, in both processes.
struct Shape {
  uint64_t length, src_offset, peer_offset, echo_offset;
};

inline constexpr uint64_t kSizes[] = {1, 3, 4096, 65537, 1 << 20, (4 << 20) + 1, 64 << 20};
inline constexpr uint32_t kSizeCases = sizeof kSizes / sizeof kSizes[0];

Shape shape_for(uint32_t value);

// The text after "TAG " in a line of the other process, or an Error.
std::string after(const std::string& line, const std::string& tag);

// The process under test and the peer both hold one of these.
struct Side {
  Device device;
  Buffer memory;
  std::unique_ptr<Transport> transport;
  std::shared_ptr<Region> region;

  // `rails`: the NICs of TransportOptions::rails, comma-separated ("" = none).
  Side(TransportKind kind, const std::string& memory_kind, const std::string& provider,
       const std::string& rails = "");
};

struct Param {
  TransportKind kind;
  std::string local, remote;  // memory kinds: "cpu", "asic_stub" or "cuda"
  // Registration fallback steps only: the step's name and the knobs that force it, set in both
  // processes.
  std::string step;
  std::vector<std::string> knobs;
  // The `ring` cases: the only plugin the peer loads (HETMESH_PLUGINS), so that it cannot map our
  // memory and writes to us through its staging ring.
  std::string peer_plugin;
  // fabric: the libfabric provider both processes use.
  std::string provider = "auto";
  // Rails: the NICs both processes stripe over, comma-separated (TransportOptions::rails).
  std::string rails;
};

std::string describe(const Param& p);

std::string param_name(const testing::TestParamInfo<Param>& info);

// How GoogleTest shows a case's parameter in a failure (rather than its bytes).
void PrintTo(const Param& p, std::ostream* out);

class TransportTest : public testing::TestWithParam<Param> {
 protected:
  void SetUp() override;
  void TearDown() override;

  // Fills the first half of our region with a known pattern (through a stream: the memory may
  // not be host-addressable) and keeps a host copy to check echoes against.
  void fill_sources();

  // Polls until a notification with `value` arrives; fails on peer loss or timeout.
  void await_notification(uint32_t value);

  void expect_echo(uint32_t value);

  void send_text(const std::string& text);

  void write(uint32_t value);

  std::unique_ptr<Side> local_;
  std::unique_ptr<ChildProcess> peer_;
  std::shared_ptr<Connection> connection_;
  std::shared_ptr<RemoteRegion> remote_;
  RegionDescriptor peer_region_;
  std::vector<uint8_t> expected_;
  std::vector<TransportEvent> events_;
  std::vector<uint32_t> notified_;
  int writes_done_ = 0;
  bool killed_ = false;
};

}  // namespace hetmesh::transport_test
