// One suite for every transport (ipc, tcp, verbs, and fabric over libfabric's tcp and shm
// providers), run with real processes: this binary re-runs
// itself as the peer (--peer), which echoes every write it is notified of back into our region.
// Memory kinds: cpu memory (host-addressable) and asic_stub device memory (not host-addressable,
// which forces the staging paths), in every combination across the two processes; with a GPU,
// cuda memory against each of them too. Over ipc, a peer that loads only its own memory's plugin
// cannot map ours, so its writes to us go through the staging ring (the `ring` cases: the ring's
// writer and reader, on a machine without GPUs). The verbs registration fallback order has its
// own cases (VerbsRegistrationFallbackTest).
//
// The cases are in the files beside this one, a subject each: writes of every size at odd offsets,
// in bursts and through the ring (transport_write_test.cc), control messages
// (transport_control_test.cc), refused writes and descriptors (transport_refusal_test.cc), a peer
// stopped or killed (transport_peer_failure_test.cc), the registration path and the verbs
// fallback order (transport_registration_test.cc). This file is the binary's main, the peer it
// re-runs itself as, the fixture's set-up and checks (transport_support.hpp), and the list of
// cases every test of TransportTest runs for.
#include "transport_support.hpp"

#include <hetmesh/core/hex.hpp>
#include <hetmesh/core/plugin.hpp>
#include <hetmesh/core/subprocess.hpp>
#include <hetmesh/transport/transport.hpp>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <optional>

namespace hetmesh::transport_test {
namespace {

Device open_device(const std::string& memory) {
  return PluginRegistry::load().device(memory + ":0");
}

// Whether this machine has a device of that plugin (cuda's pairs run on the GPU machine only).
bool has_device(const std::string& memory) {
  auto plugin = PluginRegistry::load().find(memory);
  return plugin && plugin->device_count() > 0;
}

bool required(TransportKind kind) {
  const char* list = std::getenv("HM_TEST_REQUIRE_TRANSPORTS");
  return list && std::string(list).find(to_string(kind)) != std::string::npos;
}

}  // namespace

Shape shape_for(uint32_t value) {
  if (value < kSizeCases)  // odd offsets on both sides
    return {kSizes[value], 7 + value, 13 + 2 * value, kHalf + 11 + value};
  if (value == kReportedEcho) return {(16 << 20) + 3, 5, 9, kHalf + 1};  // 8 ring slots and more
  uint64_t k = value - kBurstBase;
  return {4099, k * 8192 + 3, k * 8192 + 5, kHalf + k * 8192 + 9};
}

std::string after(const std::string& line, const std::string& tag) {
  if (line.rfind(tag + " ", 0) != 0)
    throw Error(HM_ERR_INVALID_ARGUMENT, fmt::format("expected '{} ...', got '{}'", tag, line));
  return line.substr(tag.size() + 1);
}

Side::Side(TransportKind kind, const std::string& memory_kind, const std::string& provider,
           const std::string& rails)
    : device(open_device(memory_kind)), memory(device.allocate(kRegionSize)) {
  TransportOptions options;
  options.kind = kind;
  options.fabric_provider = provider;
  for (size_t at = 0; at < rails.size();) {
    size_t comma = std::min(rails.find(',', at), rails.size());
    options.rails.push_back(rails.substr(at, comma - at));
    at = comma + 1;
  }
  // A stopped peer fails a send in 10 s; a slow one on a loaded machine never does.
  options.io_timeout = std::chrono::milliseconds(10000);
  transport = Transport::create(options);
  region = transport->register_memory(device, memory.data(), kRegionSize);
}

std::string describe(const Param& p) {
  if (p.kind == TransportKind::fabric) {
    std::string provider = p.provider;  // "verbs;ofi_rxm" -> "verbs_ofi_rxm"
    for (char& c : provider)
      if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
    return fmt::format("fabric_{}{}_{}_to_{}", provider, p.rails.empty() ? "" : "_rails", p.local,
                       p.remote);
  }
  if (!p.peer_plugin.empty())
    return fmt::format("{}_{}_to_{}_ring", to_string(p.kind), p.local, p.remote);
  if (!p.rails.empty())
    return fmt::format("{}_rails_{}_to_{}", to_string(p.kind), p.local, p.remote);
  if (!p.step.empty()) return fmt::format("{}_{}_{}", to_string(p.kind), p.local, p.step);
  return fmt::format("{}_{}_to_{}", to_string(p.kind), p.local, p.remote);
}

std::string param_name(const testing::TestParamInfo<Param>& info) {
  return describe(info.param);
}

void PrintTo(const Param& p, std::ostream* out) {
  *out << describe(p);
}

void TransportTest::SetUp() {
  for (const std::string& memory : {GetParam().local, GetParam().remote})
    if (!has_device(memory)) GTEST_SKIP() << "no " << memory << " device here";
  try {
    local_ = std::make_unique<Side>(GetParam().kind, GetParam().local, GetParam().provider,
                                    GetParam().rails);
  } catch (const Error& e) {
    if (e.status() == HM_ERR_NOT_SUPPORTED && !required(GetParam().kind))
      GTEST_SKIP() << e.what() << " (set HM_TEST_REQUIRE_TRANSPORTS to make this a failure)";
    throw;
  }
  // This process has loaded its plugins already: the variable reaches only the peer.
  std::optional<std::string> plugins;
  if (!GetParam().peer_plugin.empty()) {
    if (const char* was = std::getenv("HETMESH_PLUGINS")) plugins = was;
    std::string only =
        fmt::format("{}/libhetmesh-device-{}.so", installed_plugin_dir(), GetParam().peer_plugin);
    setenv("HETMESH_PLUGINS", only.c_str(), 1);
  }
  peer_ = std::make_unique<ChildProcess>(
      std::vector<std::string>{self_executable(), "--peer", to_string(GetParam().kind),
                               GetParam().remote, GetParam().provider, GetParam().rails});
  if (!GetParam().peer_plugin.empty()) {
    if (plugins)
      setenv("HETMESH_PLUGINS", plugins->c_str(), 1);
    else
      unsetenv("HETMESH_PLUGINS");
  }
  auto endpoint = from_hex(after(peer_->read_line(kWait), "ENDPOINT"), "the peer's endpoint line");
  peer_region_ = from_hex(after(peer_->read_line(kWait), "REGION"), "the peer's region line");
  peer_->write("ENDPOINT " + to_hex(local_->transport->endpoint()) + "\nREGION " +
               to_hex(local_->region->describe()) + "\n");
  connection_ = local_->transport->connect(endpoint, kWait);
  remote_ = connection_->import_region(peer_region_);
  fill_sources();
}

void TransportTest::TearDown() {
  if (connection_ && connection_->alive()) {
    std::string bye = "exit";
    try {
      connection_->send_control({reinterpret_cast<const uint8_t*>(bye.data()), bye.size()});
    } catch (const Error&) {
    }
  }
  if (peer_) {
    ProcessResult r = peer_->wait(std::chrono::seconds(30));
    if (!killed_) {
      EXPECT_EQ(r.exit_code, 0) << "peer: " << r.describe();
    }
  }
}

void TransportTest::fill_sources() {
  expected_.resize(kHalf);
  for (uint64_t i = 0; i < kHalf; ++i)
    expected_[i] = static_cast<uint8_t>((i * 131 + 17) >> 3);
  Stream stream = local_->device.create_stream();
  stream.copy(local_->memory.data(), expected_.data(), kHalf);
  stream.fill(static_cast<uint8_t*>(local_->memory.data()) + kHalf, 0, kHalf);
  stream.synchronize(kWait);
}

void TransportTest::await_notification(uint32_t value) {
  auto deadline = std::chrono::steady_clock::now() + kWait;
  while (std::chrono::steady_clock::now() < deadline) {
    for (size_t i = 0; i < events_.size(); ++i) {
      const TransportEvent& e = events_[i];
      ASSERT_NE(e.type, TransportEvent::Type::peer_lost) << e.message;
      if (e.type == TransportEvent::Type::write_done) {
        EXPECT_EQ(e.status, HM_OK) << e.message;
        ++writes_done_;
      }
      if (e.type == TransportEvent::Type::notification) notified_.push_back(e.value);
    }
    events_.clear();
    for (uint32_t v : notified_)
      if (v == value) return;
    local_->transport->poll(events_, std::chrono::milliseconds(100));
  }
  FAIL() << "no notification " << value << " within " << kWait.count() << " s";
}

void TransportTest::expect_echo(uint32_t value) {
  Shape s = shape_for(value);
  std::vector<uint8_t> got(s.length);
  Stream stream = local_->device.create_stream();
  stream.copy(got.data(), static_cast<uint8_t*>(local_->memory.data()) + s.echo_offset, s.length);
  stream.synchronize(kWait);
  ASSERT_EQ(std::memcmp(got.data(), expected_.data() + s.src_offset, s.length), 0)
      << "echo of " << s.length << " bytes differs";
}

void TransportTest::send_text(const std::string& text) {
  connection_->send_control({reinterpret_cast<const uint8_t*>(text.data()), text.size()});
}

void TransportTest::write(uint32_t value) {
  Shape s = shape_for(value);
  connection_->write(*local_->region, s.src_offset, *remote_, s.peer_offset, s.length, value,
                     value);
}

namespace {

int run_peer(const std::string& kind, const std::string& memory, const std::string& provider,
             const std::string& rails) {
  try {
    Side side(parse_transport_kind(kind), memory, provider, rails);
    std::cout << "ENDPOINT " << to_hex(side.transport->endpoint()) << "\n"
              << "REGION " << to_hex(side.region->describe()) << std::endl;
    std::string endpoint, region;
    if (!std::getline(std::cin, endpoint) || !std::getline(std::cin, region)) return 2;
    auto connection =
        side.transport->connect(from_hex(after(endpoint, "ENDPOINT"), "the endpoint line"), kWait);
    auto target = connection->import_region(from_hex(after(region, "REGION"), "the region line"));
    auto echo = [&](uint32_t value) {
      Shape s = shape_for(value);
      connection->write(*side.region, s.peer_offset, *target, s.echo_offset, s.length, value,
                        value);
    };
    std::vector<TransportEvent> events;
    for (;;) {
      events.clear();
      side.transport->poll(events, std::chrono::seconds(1));
      for (const auto& e : events) {
        if (e.type == TransportEvent::Type::peer_lost) return 0;
        if (e.type == TransportEvent::Type::notification) {
          echo(e.value);
        } else if (e.type == TransportEvent::Type::control) {
          std::string text(e.payload.begin(), e.payload.end());
          if (text == "exit") return 0;
          if (text == fmt::format("echo {}", kReportedEcho)) {
            echo(kReportedEcho);
            continue;
          }
          std::string reply = "pong " + text;
          connection->send_control({reinterpret_cast<const uint8_t*>(reply.data()), reply.size()});
          if (text == "reported") std::cout << "PONGED" << std::endl;
        } else if (e.type == TransportEvent::Type::write_done && e.status != HM_OK) {
          std::cerr << "peer: echo failed: " << e.message << std::endl;
          return 3;
        } else if (e.type == TransportEvent::Type::write_done && e.cookie == kReportedEcho) {
          std::cout << "ECHOED " << e.cookie << std::endl;
        }
      }
    }
  } catch (const std::exception& e) {
    std::cerr << "peer: " << e.what() << std::endl;
    return 1;
  }
}

std::vector<Param> all_params() {
  std::vector<Param> params;
  for (TransportKind kind : {TransportKind::ipc, TransportKind::tcp, TransportKind::verbs})
    for (auto [local, remote] : {std::pair{"cpu", "cpu"}, std::pair{"asic_stub", "asic_stub"},
                                 std::pair{"cpu", "asic_stub"}, std::pair{"asic_stub", "cpu"}})
      params.push_back({kind, local, remote});
  // A peer that loads only the plugin of its own memory writes to us through its ring: from host
  // memory into our device memory, and from its device memory into our host memory.
  params.push_back({TransportKind::ipc, "asic_stub", "cpu", "", {}, "cpu"});
  params.push_back({TransportKind::ipc, "cpu", "asic_stub", "", {}, "asic_stub"});
  // libfabric's tcp provider (over rxm: it orders messages after writes), shm (which does not:
  // a notice waits for its writes' delivery), and verbs under rxm where an RDMA device is (the
  // rxe VM; skipped elsewhere).
  for (const char* provider : {"tcp", "shm", "verbs;ofi_rxm"})
    for (auto [local, remote] : {std::pair{"cpu", "cpu"}, std::pair{"asic_stub", "asic_stub"},
                                 std::pair{"cpu", "asic_stub"}, std::pair{"asic_stub", "cpu"}})
      params.push_back({TransportKind::fabric, local, remote, "", {}, "", provider});
  // GPU memory, where a GPU is: one DMA to and from a peer's host memory over ipc, the ring to
  // another plugin's device memory, and the staged paths of tcp.
  for (TransportKind kind : {TransportKind::ipc, TransportKind::tcp})
    for (auto [local, remote] : {std::pair{"cuda", "cpu"}, std::pair{"cpu", "cuda"},
                                 std::pair{"cuda", "cuda"}, std::pair{"cuda", "asic_stub"}})
      params.push_back({kind, local, remote});
  // Two rails, every write of 1 MiB and more striped over both: tcp over two loopback addresses
  // (every memory pairing), verbs over two RDMA devices where they are (the rxe VM's rxe0 and
  // rxe1, skipped elsewhere; host memory and staged device memory, as the VM is slow).
  for (auto [local, remote] : {std::pair{"cpu", "cpu"}, std::pair{"asic_stub", "asic_stub"},
                               std::pair{"cpu", "asic_stub"}, std::pair{"asic_stub", "cpu"}})
    params.push_back(
        {TransportKind::tcp, local, remote, "", {}, "", "auto", "127.0.0.1,127.0.0.2"});
  for (const char* memory : {"cpu", "asic_stub"})
    params.push_back({TransportKind::verbs, memory, memory, "", {}, "", "auto", "rxe0,rxe1"});
  // And libfabric's tcp provider over two loopback addresses.
  for (auto [local, remote] : {std::pair{"cpu", "cpu"}, std::pair{"asic_stub", "cpu"}})
    params.push_back(
        {TransportKind::fabric, local, remote, "", {}, "", "tcp", "127.0.0.1,127.0.0.2"});
  return params;
}

INSTANTIATE_TEST_SUITE_P(Transports, TransportTest, testing::ValuesIn(all_params()), param_name);

}  // namespace
}  // namespace hetmesh::transport_test

int main(int argc, char** argv) {
  if (argc == 6 && std::strcmp(argv[1], "--peer") == 0)
    return hetmesh::transport_test::run_peer(argv[2], argv[3], argv[4], argv[5]);
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
