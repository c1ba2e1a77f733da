// Rails (TransportOptions::rails) beyond the transport suite, which runs whole over two rails:
// that a striped write really crosses both, and that a rail that fails in the middle of a stream
// of notified writes loses none of them and raises no error, every notification arriving in
// order after its bytes. Both ends in this process, over:
//  - tcp on 127.0.0.1 and 127.0.0.2: the second rail's connection cut by the kernel (`ss -K`, as
//    a NIC reset would: the sockets abort), which needs root and a kernel with socket destruction
//    (CONFIG_INET_DIAG_DESTROY), as CI has;
//  - verbs on the rxe VM's rxe0 and rxe1: the second taken down with `ip link set veth2 down`
//    (and up again after); skipped where those devices are not.
#include "rails/rails_wire.hpp"

#include <hetmesh/core/log.hpp>
#include <hetmesh/core/plugin.hpp>
#include <hetmesh/core/subprocess.hpp>
#include <hetmesh/transport/transport.hpp>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <mutex>
#include <regex>
#include <string>
#include <vector>

namespace hetmesh {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr uint64_t kWriteBytes = 4 << 20;  // striped: 2 MiB a rail
constexpr int kSlots = 8;
constexpr int kWrites = 48;
constexpr int kCutAfter = 12;  // writes verified before the second rail is cut

struct Rails {
  TransportKind kind;
  std::vector<std::string> nics;
};

std::string rails_name(const testing::TestParamInfo<Rails>& info) {
  return to_string(info.param.kind);
}

bool required(TransportKind kind) {
  const char* list = std::getenv("HM_TEST_REQUIRE_TRANSPORTS");
  return list && std::string(list).find(to_string(kind)) != std::string::npos;
}

struct End {
  Device device = PluginRegistry::load().device("cpu:0");
  Buffer memory = device.allocate(kSlots * kWriteBytes);
  std::unique_ptr<Transport> transport;
  std::shared_ptr<Region> region;
  std::shared_ptr<Connection> connection;
  std::shared_ptr<RemoteRegion> peer;
  explicit End(const Rails& rails) {
    TransportOptions options;
    options.kind = rails.kind;
    options.rails = rails.nics;
    options.io_timeout = 10s;
    transport = Transport::create(options);
    region = transport->register_memory(device, memory.data(), kSlots * kWriteBytes);
  }
  uint8_t* slot(int k) { return static_cast<uint8_t*>(memory.data()) + (k % kSlots) * kWriteBytes; }
};

void connect(End& a, End& b) {
  auto other = std::async(std::launch::async,
                          [&] { return b.transport->connect(a.transport->endpoint(), 10s); });
  a.connection = a.transport->connect(b.transport->endpoint(), 10s);
  b.connection = other.get();
  a.peer = a.connection->import_region(b.region->describe());
  b.peer = b.connection->import_region(a.region->describe());
}

// The port of the second rail's listener in an endpoint of `end`'s transport.
std::string second_rail_port(const End& end) {
  auto parts = detail::unpack_rails(end.transport->endpoint(), "endpoint");
  auto address = nlohmann::json::parse(parts.at(1))["address"].get<std::string>();
  return address.substr(address.rfind(':') + 1);
}

std::string binary(const char* name);

// `ss` over the second rail's connection (the one that dialed b's listener or a's).
ProcessResult ss(const std::vector<std::string>& args, const std::string& port_a,
                 const std::string& port_b) {
  std::vector<std::string> argv{binary("ss")};
  argv.insert(argv.end(), args.begin(), args.end());
  const std::string a = ":" + port_a, b = ":" + port_b;
  argv.insert(argv.end(), {"(", "sport", "=", a, "or", "dport", "=", a, "or", "sport", "=", b, "or",
                           "dport", "=", b, ")"});
  return run_process(argv, 10s);
}

uint8_t pattern(int k, uint64_t i) {
  return static_cast<uint8_t>(k * 31 + i * 7 + (i >> 12));
}

std::string binary(const char* name) {  // iproute2's ss and ip
  for (const char* folder : {"/usr/bin/", "/bin/", "/usr/sbin/", "/sbin/"})
    if (std::filesystem::exists(std::string(folder) + name)) return std::string(folder) + name;
  return name;
}

// Packets rxe1 sent so far (its port counter), or -1 where it has none.
int64_t rxe1_sent_packets() {
  std::ifstream in("/sys/class/infiniband/rxe1/ports/1/hw_counters/sent_pkts");
  int64_t n = -1;
  in >> n;
  return n;
}

class RailsTest : public testing::TestWithParam<Rails> {
 protected:
  void SetUp() override {
    try {
      a_ = std::make_unique<End>(GetParam());
      b_ = std::make_unique<End>(GetParam());
    } catch (const Error& e) {
      if (e.status() == HM_ERR_NOT_SUPPORTED && !required(GetParam().kind))
        GTEST_SKIP() << e.what() << " (set HM_TEST_REQUIRE_TRANSPORTS to make this a failure)";
      throw;
    }
    connect(*a_, *b_);
  }
  // Takes the second rail down: the kernel aborts its tcp connection, or its veth goes down
  // (brought up again in TearDown, for the tests after).
  void cut_second_rail() {
    ProcessResult r;
    if (GetParam().kind == TransportKind::tcp) {
      r = ss({"-K"}, second_rail_port(*a_), second_rail_port(*b_));
    } else {
      r = run_process({binary("ip"), "link", "set", "veth2", "down"}, 10s);
      link_down_ = true;
    }
    ASSERT_EQ(r.exit_code, 0) << r.describe() << r.err;
  }
  void TearDown() override {
    if (link_down_) run_process({binary("ip"), "link", "set", "veth2", "up"}, 10s);
  }
  std::unique_ptr<End> a_, b_;
  bool link_down_ = false;
};

TEST_P(RailsTest, AStripedWriteCrossesBothRails) {
  End &a = *a_, &b = *b_;
  const int64_t sent_before = rxe1_sent_packets();
  for (uint64_t i = 0; i < kWriteBytes; ++i)
    a.slot(0)[i] = pattern(0, i);
  a.connection->write(*a.region, 0, *a.peer, 0, kWriteBytes, 7u, 1);
  std::vector<TransportEvent> events;
  bool notified = false;
  for (auto until = Clock::now() + 60s; !notified && Clock::now() < until;) {
    events.clear();
    b.transport->poll(events, 100ms);
    for (const auto& e : events)
      notified |= e.type == TransportEvent::Type::notification && e.value == 7;
  }
  ASSERT_TRUE(notified);
  EXPECT_EQ(std::memcmp(a.slot(0), b.slot(0), kWriteBytes), 0);
  // The second rail carried about half of it.
  if (GetParam().kind == TransportKind::verbs) {
    // rxe's RoCE MTU here is 4096: 2 MiB is 512 packets.
    EXPECT_GE(rxe1_sent_packets() - sent_before, 500) << "rxe1 sent too few packets";
    return;
  }
  ProcessResult out = ss({"-tinH"}, second_rail_port(a), second_rail_port(b));
  ASSERT_EQ(out.exit_code, 0) << out.describe();
  uint64_t most = 0;
  std::smatch m;
  for (std::string text = out.out;
       std::regex_search(text, m, std::regex(R"(bytes_received:(\d+))")); text = m.suffix())
    most = std::max<uint64_t>(most, std::stoull(m[1]));
  EXPECT_GE(most, kWriteBytes / 2 - 64 * 1024) << out.out;
  EXPECT_LT(most, kWriteBytes) << out.out;
}

TEST_P(RailsTest, ARailCutMidStreamLosesNoWriteAndRaisesNoError) {
  End &a = *a_, &b = *b_;
  std::mutex lines_mutex;
  std::vector<std::string> warnings;
  LogSink previous = set_log_sink([&](LogLevel level, std::string_view line) {
    std::lock_guard lock(lines_mutex);
    if (level <= LogLevel::warn) warnings.emplace_back(line);
  });
  int issued = 0, verified = 0, done = 0;
  std::vector<std::string> failures;
  std::vector<uint32_t> order;
  Clock::time_point cut_at{}, recovered_at{};
  std::vector<TransportEvent> events;
  for (auto until = Clock::now() + 240s; verified < kWrites && Clock::now() < until;) {
    // At most kSlots writes ahead of what b verified: a slot is rewritten only once read.
    while (issued < kWrites && issued < verified + kSlots) {
      for (uint64_t i = 0; i < kWriteBytes; ++i)
        a.slot(issued)[i] = pattern(issued, i);
      const uint64_t at = (issued % kSlots) * kWriteBytes;
      a.connection->write(*a.region, at, *a.peer, at, kWriteBytes, static_cast<uint32_t>(issued),
                          static_cast<uint64_t>(issued));
      ++issued;
    }
    events.clear();
    b.transport->poll(events, 10ms);
    for (const auto& e : events) {
      if (e.type == TransportEvent::Type::peer_lost) failures.push_back("b: " + e.message);
      if (e.type != TransportEvent::Type::notification) continue;
      order.push_back(e.value);
      const int k = static_cast<int>(e.value);
      bool same = true;
      for (uint64_t i = 0; i < kWriteBytes && same; i += 509)
        same = b.slot(k)[i] == pattern(k, i);
      if (!same) failures.push_back(fmt::format("write {} landed wrong", k));
      ++verified;
      if (cut_at != Clock::time_point{} && recovered_at == Clock::time_point{})
        recovered_at = Clock::now();
    }
    events.clear();
    a.transport->poll(events, 0ms);
    for (const auto& e : events) {
      if (e.type == TransportEvent::Type::write_done && e.status != HM_OK)
        failures.push_back(fmt::format("write {} failed: {}", e.cookie, e.message));
      if (e.type == TransportEvent::Type::write_done) ++done;
      if (e.type == TransportEvent::Type::peer_lost) failures.push_back("a: " + e.message);
    }
    if (verified >= kCutAfter && cut_at == Clock::time_point{}) {
      cut_second_rail();
      cut_at = Clock::now();
    }
  }
  set_log_sink(previous);
  EXPECT_EQ(failures, std::vector<std::string>{});
  ASSERT_EQ(verified, kWrites);
  for (int k = 0; k < kWrites; ++k)
    EXPECT_EQ(order[k], static_cast<uint32_t>(k)) << "notifications out of order";
  EXPECT_TRUE(a.connection->alive());
  bool said = false;
  const std::string down = fmt::format("rail 1 ({}) is down", GetParam().nics[1]);
  for (const std::string& line : warnings)
    said |= line.find(down) != std::string::npos;
  EXPECT_TRUE(said) << "the cut never reached the rails: nothing said " << down;
  ASSERT_NE(recovered_at, Clock::time_point{});
  fmt::print(
      "rails over {}: rail 1 cut after {} writes; the next write landed {:.1f} ms later; "
      "{} of {} writes done\n",
      to_string(GetParam().kind), kCutAfter,
      std::chrono::duration<double, std::milli>(recovered_at - cut_at).count(), done, kWrites);
}

INSTANTIATE_TEST_SUITE_P(Kinds, RailsTest,
                         testing::Values(Rails{TransportKind::tcp, {"127.0.0.1", "127.0.0.2"}},
                                         Rails{TransportKind::verbs, {"rxe0", "rxe1"}}),
                         rails_name);

TEST(Rails, APeerWithoutRailsIsRefusedByName) {
  End a(Rails{TransportKind::tcp, {"127.0.0.1", "127.0.0.2"}});
  TransportOptions plain;
  plain.kind = TransportKind::tcp;
  auto single = Transport::create(plain);
  try {
    a.transport->connect(single->endpoint(), 1s);
    ADD_FAILURE() << "a rails transport connected to one without rails";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not a rails transport's"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace hetmesh
