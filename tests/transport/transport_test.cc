// One suite for every transport (ipc, tcp, verbs), run with real processes: this binary re-runs
// itself as the peer (--peer), which echoes every write it is notified of back into our region.
// Memory kinds: cpu memory (host-addressable) and asic_stub device memory (not host-addressable,
// which forces the staging paths), in every combination across the two processes; with a GPU,
// cuda memory against each of them too. Over ipc, a peer that loads only its own memory's plugin
// cannot map ours, so its writes to us go through the staging ring (the `ring` cases: the ring's
// writer and reader, on a machine without GPUs). The verbs registration fallback order has its
// own cases (VerbsRegistrationFallbackTest).
#include <hetmesh/core/hex.hpp>
#include <hetmesh/core/plugin.hpp>
#include <hetmesh/core/subprocess.hpp>
#include <hetmesh/transport/rdma_info.hpp>
#include <hetmesh/transport/transport.hpp>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <optional>
#include <thread>

namespace hetmesh {
namespace {

constexpr uint64_t kHalf = (64ull << 20) + (256 << 10);
constexpr uint64_t kRegionSize = 2 * kHalf;  // sources in the first half, echoes in the second
constexpr std::chrono::seconds kWait{120};
constexpr uint32_t kBurstBase = 1000;
constexpr int kBurst = 64;

// The peer echoes this value when told to (control "echo 4000") and says so on its standard
// output once its write is done ("ECHOED 4000"), so a test can wait for it without polling.
constexpr uint32_t kReportedEcho = 4000;

// Where the bytes of a write with notification `value` come from and go, in both processes.
struct Shape {
  uint64_t length, src_offset, peer_offset, echo_offset;
};

const uint64_t kSizes[] = {1, 3, 4096, 65537, 1 << 20, (4 << 20) + 1, 64 << 20};
constexpr uint32_t kSizeCases = sizeof kSizes / sizeof kSizes[0];

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

Device open_device(const std::string& memory) {
  return PluginRegistry::load().device(memory + ":0");
}

// Whether this machine has a device of that plugin (cuda's pairs run on the GPU machine only).
bool has_device(const std::string& memory) {
  auto plugin = PluginRegistry::load().find(memory);
  return plugin && plugin->device_count() > 0;
}

// The process under test and the peer both hold one of these.
struct Side {
  Device device;
  Buffer memory;
  std::unique_ptr<Transport> transport;
  std::shared_ptr<Region> region;

  Side(TransportKind kind, const std::string& memory_kind)
      : device(open_device(memory_kind)), memory(device.allocate(kRegionSize)) {
    TransportOptions options;
    options.kind = kind;
    // A stopped peer fails a send in 10 s; a slow one on a loaded machine never does.
    options.io_timeout = std::chrono::milliseconds(10000);
    transport = Transport::create(options);
    region = transport->register_memory(device, memory.data(), kRegionSize);
  }
};

int run_peer(const std::string& kind, const std::string& memory) {
  try {
    Side side(parse_transport_kind(kind), memory);
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
};

std::string describe(const Param& p) {
  if (!p.peer_plugin.empty())
    return fmt::format("{}_{}_to_{}_ring", to_string(p.kind), p.local, p.remote);
  if (!p.step.empty()) return fmt::format("{}_{}_{}", to_string(p.kind), p.local, p.step);
  return fmt::format("{}_{}_to_{}", to_string(p.kind), p.local, p.remote);
}

std::string param_name(const testing::TestParamInfo<Param>& info) {
  return describe(info.param);
}

// How GoogleTest shows a case's parameter in a failure (rather than its bytes).
void PrintTo(const Param& p, std::ostream* out) {
  *out << describe(p);
}

bool required(TransportKind kind) {
  const char* list = std::getenv("HM_TEST_REQUIRE_TRANSPORTS");
  return list && std::string(list).find(to_string(kind)) != std::string::npos;
}

class TransportTest : public testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    for (const std::string& memory : {GetParam().local, GetParam().remote})
      if (!has_device(memory)) GTEST_SKIP() << "no " << memory << " device here";
    try {
      local_ = std::make_unique<Side>(GetParam().kind, GetParam().local);
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
    peer_ = std::make_unique<ChildProcess>(std::vector<std::string>{
        self_executable(), "--peer", to_string(GetParam().kind), GetParam().remote});
    if (!GetParam().peer_plugin.empty()) {
      if (plugins)
        setenv("HETMESH_PLUGINS", plugins->c_str(), 1);
      else
        unsetenv("HETMESH_PLUGINS");
    }
    auto endpoint =
        from_hex(after(peer_->read_line(kWait), "ENDPOINT"), "the peer's endpoint line");
    peer_region_ = from_hex(after(peer_->read_line(kWait), "REGION"), "the peer's region line");
    peer_->write("ENDPOINT " + to_hex(local_->transport->endpoint()) + "\nREGION " +
                 to_hex(local_->region->describe()) + "\n");
    connection_ = local_->transport->connect(endpoint, kWait);
    remote_ = connection_->import_region(peer_region_);
    fill_sources();
  }

  void TearDown() override {
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

  // Fills the first half of our region with a known pattern (through a stream: the memory may
  // not be host-addressable) and keeps a host copy to check echoes against.
  void fill_sources() {
    expected_.resize(kHalf);
    for (uint64_t i = 0; i < kHalf; ++i)
      expected_[i] = static_cast<uint8_t>((i * 131 + 17) >> 3);
    Stream stream = local_->device.create_stream();
    stream.copy(local_->memory.data(), expected_.data(), kHalf);
    stream.fill(static_cast<uint8_t*>(local_->memory.data()) + kHalf, 0, kHalf);
    stream.synchronize(kWait);
  }

  // Polls until a notification with `value` arrives; fails on peer loss or timeout.
  void await_notification(uint32_t value) {
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

  void expect_echo(uint32_t value) {
    Shape s = shape_for(value);
    std::vector<uint8_t> got(s.length);
    Stream stream = local_->device.create_stream();
    stream.copy(got.data(), static_cast<uint8_t*>(local_->memory.data()) + s.echo_offset, s.length);
    stream.synchronize(kWait);
    ASSERT_EQ(std::memcmp(got.data(), expected_.data() + s.src_offset, s.length), 0)
        << "echo of " << s.length << " bytes differs";
  }

  void send_text(const std::string& text) {
    connection_->send_control({reinterpret_cast<const uint8_t*>(text.data()), text.size()});
  }

  void write(uint32_t value) {
    Shape s = shape_for(value);
    connection_->write(*local_->region, s.src_offset, *remote_, s.peer_offset, s.length, value,
                       value);
  }

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

TEST_P(TransportTest, ControlMessagesArriveInOrder) {
  for (int k = 0; k < 20; ++k) {
    std::string text = std::to_string(k);
    connection_->send_control({reinterpret_cast<const uint8_t*>(text.data()), text.size()});
  }
  std::vector<std::string> replies;
  auto deadline = std::chrono::steady_clock::now() + kWait;
  while (replies.size() < 20 && std::chrono::steady_clock::now() < deadline) {
    std::vector<TransportEvent> events;
    local_->transport->poll(events, std::chrono::milliseconds(100));
    for (const auto& e : events) {
      ASSERT_NE(e.type, TransportEvent::Type::peer_lost) << e.message;
      if (e.type == TransportEvent::Type::control)
        replies.emplace_back(e.payload.begin(), e.payload.end());
    }
  }
  ASSERT_EQ(replies.size(), 20u);
  for (int k = 0; k < 20; ++k)
    EXPECT_EQ(replies[k], "pong " + std::to_string(k));
}

TEST_P(TransportTest, WriteOutsideEitherRegionIsRefused) {
  auto refused = [&](uint64_t src_offset, uint64_t dst_offset, uint64_t length) {
    try {
      connection_->write(*local_->region, src_offset, *remote_, dst_offset, length, 1, 1);
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), HM_ERR_INVALID_ARGUMENT) << e.what();
      EXPECT_NE(std::string(e.what()).find("outside"), std::string::npos) << e.what();
      return true;
    }
    return false;
  };
  EXPECT_TRUE(refused(0, kRegionSize - 10, 11));
  EXPECT_TRUE(refused(kRegionSize - 10, 0, 11));
  EXPECT_TRUE(refused(0, kRegionSize + 1, 0));
  EXPECT_TRUE(refused(0, 1, UINT64_MAX));
  // The connection survives a refused write.
  write(2);
  await_notification(2);
  expect_echo(2);
}

TEST_P(TransportTest, ImportRefusesForeignOrMalformedDescriptors) {
  EXPECT_THROW(connection_->import_region(local_->region->describe()), Error)
      << "imported our own region as the peer's";
  EXPECT_THROW(connection_->import_region({'n', 'o', 'p', 'e'}), Error);
  // The peer's own descriptor with a number that does not fit its field, is negative or is not
  // an integer: refused, never wrapped or truncated into a plausible value.
  auto valid = nlohmann::json::parse(peer_region_.begin(), peer_region_.end());
  ASSERT_NO_THROW(connection_->import_region(peer_region_));
  for (auto [key, bad] : {std::pair<const char*, nlohmann::json>{"size", -1},
                          {"size", 1.5},
                          {"size", "64"},
                          {"region", (uint64_t{1} << 32) + 5},
                          {"region", -1}}) {
    nlohmann::json d = valid;
    d[key] = bad;
    std::string text = d.dump();
    EXPECT_THROW(connection_->import_region({text.begin(), text.end()}), Error) << text;
  }
  EXPECT_THROW(local_->transport->connect({'{', '}'}, std::chrono::milliseconds(100)), Error);
}

// A peer that stops reading (SIGSTOP) must not hold a sender forever: once the socket is full, a
// tcp write fails within its io_timeout and the peer is reported lost. (ipc writes go straight
// into the peer's memory and never wait for it; a stopped peer is the engine's heartbeat's to
// find.)
TEST_P(TransportTest, StoppedPeerFailsATcpWriteInsteadOfBlocking) {
  if (GetParam().kind != TransportKind::tcp) GTEST_SKIP() << "only tcp sends can block on a peer";
  peer_->kill(SIGSTOP);
  bool failed = false;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(90);
  while (!failed && std::chrono::steady_clock::now() < deadline) {
    try {
      write(6);  // 64 MiB: the socket buffers fill within a few writes
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), kStatusPeerLost) << e.what();
      failed = true;
    }
    std::vector<TransportEvent> events;
    local_->transport->poll(events, std::chrono::milliseconds(1));
    for (const auto& e : events)
      if (e.type == TransportEvent::Type::write_done && e.status != HM_OK) {
        EXPECT_EQ(e.status, HM_ERR_TIMEOUT) << e.message;
        failed = true;
      }
  }
  peer_->kill(SIGKILL);
  killed_ = true;
  EXPECT_TRUE(failed) << "writes to a stopped peer never failed";
  EXPECT_FALSE(connection_->alive());
}

TEST_P(TransportTest, KilledPeerIsReportedWithinTheTimeout) {
  for (int k = 0; k < 4; ++k)
    write(5);  // 1 MiB writes in flight
  peer_->kill(SIGKILL);
  killed_ = true;
  bool lost = false;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!lost && std::chrono::steady_clock::now() < deadline) {
    std::vector<TransportEvent> events;
    local_->transport->poll(events, std::chrono::milliseconds(100));
    for (const auto& e : events)
      lost |= e.type == TransportEvent::Type::peer_lost;
    if (!lost) {
      try {
        write(5);  // keeps traffic going so a transport without a read-side signal notices too
      } catch (const Error& e) {
        EXPECT_EQ(e.status(), kStatusPeerLost) << e.what();
      }
    }
  }
  ASSERT_TRUE(lost) << "no peer_lost event after the peer was killed";
  EXPECT_FALSE(connection_->alive());
  try {
    write(5);
    ADD_FAILURE() << "write to a lost peer did not throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), kStatusPeerLost) << e.what();
  }
}

TEST_P(TransportTest, RegistrationPathFollowsTheMemory) {
  RegistrationPath path = local_->region->path();
  bool addressable = GetParam().local == "cpu";
  switch (GetParam().kind) {
    case TransportKind::ipc:
      EXPECT_EQ(path, RegistrationPath::ipc_handle) << to_string(path);
      break;
    case TransportKind::tcp:
      EXPECT_EQ(path, addressable ? RegistrationPath::host : RegistrationPath::staging)
          << to_string(path);
      break;
    case TransportKind::verbs:
      // rxe has no dma-buf MRs and no peermem, so device memory falls back to staging.
      EXPECT_EQ(path, addressable ? RegistrationPath::host : RegistrationPath::staging)
          << to_string(path);
      break;
  }
}

// The verbs registration fallback order, a step at a time: host memory takes plain ibv_reg_mr;
// memory the host cannot address (asic_stub's) tries dma-buf when the provider supports it, then
// peermem when nvidia_peermem is loaded, then pinned host staging. Each step is forced by knobs
// that switch the steps before it off (or, for peermem, pretend it is loaded), in both processes;
// the test checks the path recorded for our region and the peer's, why, and that data still
// arrives intact both ways. On rxe (no dma-buf MRs: its fd -1 probe does not answer EBADF; no
// nvidia_peermem) device memory always ends in staging, by each of the routes.
class VerbsRegistrationFallbackTest : public TransportTest {
 protected:
  void SetUp() override {
    for (const std::string& knob : GetParam().knobs)
      setenv(knob.c_str(), "1", 1);
    TransportTest::SetUp();
  }
  void TearDown() override {
    TransportTest::TearDown();
    for (const std::string& knob : GetParam().knobs)
      unsetenv(knob.c_str());
  }
  bool knob(const char* name) const {
    const auto& knobs = GetParam().knobs;
    return std::find(knobs.begin(), knobs.end(), name) != knobs.end();
  }
};

// What the RDMA device the verbs transport opens (the first with an active port) offers.
RdmaDeviceInfo verbs_device() {
  for (const RdmaDeviceInfo& d : list_rdma_devices())
    if (d.error.empty() && d.port_state == "ACTIVE") return d;
  return {};
}

TEST_P(VerbsRegistrationFallbackTest, PathAndDataAtEachStep) {
  const Param& p = GetParam();
  RdmaDeviceInfo rdma = verbs_device();
  const Region& region = *local_->region;
  const std::string& why = region.path_reason();
  auto position = [&](const std::string& text) {
    size_t at = why.find(text);
    EXPECT_NE(at, std::string::npos) << "'" << text << "' is not in the reason: " << why;
    return at;
  };
  RegistrationPath expected;
  if (p.local == "cpu") {
    expected = RegistrationPath::host;
    position("ibv_reg_mr");
  } else {
    bool dmabuf = !knob("HETMESH_VERBS_DISABLE_DMABUF") && rdma.dmabuf_supported &&
                  local_->device.has(HM_CAP_DMABUF_EXPORT);
    bool peermem = !knob("HETMESH_VERBS_DISABLE_PEERMEM") &&
                   (rdma.peermem_present || knob("HETMESH_VERBS_ASSUME_PEERMEM"));
    expected = dmabuf ? RegistrationPath::dmabuf : RegistrationPath::staging;
    if (!dmabuf) {
      // Each step passed over says why, in the order tried.
      size_t dmabuf_at =
          knob("HETMESH_VERBS_DISABLE_DMABUF")
              ? position("disabled by HETMESH_VERBS_DISABLE_DMABUF")
              : position(rdma.dmabuf_supported ? "cannot export" : "dma-buf unsupported");
      size_t peermem_at = position("peermem: ");
      if (knob("HETMESH_VERBS_DISABLE_PEERMEM"))
        position("disabled by HETMESH_VERBS_DISABLE_PEERMEM");
      // asic_stub memory is PROT_NONE host pages that no peer-memory client claims: ibv_reg_mr
      // refuses it, with or without nvidia_peermem, and staging follows.
      if (peermem) position("peermem: ibv_reg_mr failed");
      size_t staging_at = position("staging through");
      EXPECT_LT(dmabuf_at, peermem_at) << why;
      EXPECT_LT(peermem_at, staging_at) << why;
    }
  }
  EXPECT_EQ(region.path(), expected) << to_string(region.path()) << ": " << why;
  // The peer took the same steps with the same knobs.
  std::string peer(peer_region_.begin(), peer_region_.end());
  EXPECT_NE(peer.find(fmt::format("\"path\":\"{}\"", to_string(expected))), std::string::npos)
      << "peer region: " << peer;
  // Data arrives intact both ways: small, unaligned, and larger than a page at odd offsets.
  for (uint32_t value = 0; value < 5; ++value) {
    write(value);
    await_notification(value);
    expect_echo(value);
  }
}

std::vector<Param> fallback_steps() {
  const TransportKind v = TransportKind::verbs;
  return {{v, "cpu", "cpu", "host_memory", {}},
          {v, "asic_stub", "asic_stub", "natural_order", {}},
          {v, "asic_stub", "asic_stub", "dmabuf_off", {"HETMESH_VERBS_DISABLE_DMABUF"}},
          {v,
           "asic_stub",
           "asic_stub",
           "dmabuf_off_peermem_tried",
           {"HETMESH_VERBS_DISABLE_DMABUF", "HETMESH_VERBS_ASSUME_PEERMEM"}},
          {v,
           "asic_stub",
           "asic_stub",
           "dmabuf_and_peermem_off",
           {"HETMESH_VERBS_DISABLE_DMABUF", "HETMESH_VERBS_DISABLE_PEERMEM"}}};
}

INSTANTIATE_TEST_SUITE_P(RegistrationFallback, VerbsRegistrationFallbackTest,
                         testing::ValuesIn(fallback_steps()), param_name);

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
  // GPU memory, where a GPU is: one DMA to and from a peer's host memory over ipc, the ring to
  // another plugin's device memory, and the staged paths of tcp.
  for (TransportKind kind : {TransportKind::ipc, TransportKind::tcp})
    for (auto [local, remote] : {std::pair{"cuda", "cpu"}, std::pair{"cpu", "cuda"},
                                 std::pair{"cuda", "cuda"}, std::pair{"cuda", "asic_stub"}})
      params.push_back({kind, local, remote});
  return params;
}

INSTANTIATE_TEST_SUITE_P(Transports, TransportTest, testing::ValuesIn(all_params()), param_name);

}  // namespace
}  // namespace hetmesh

int main(int argc, char** argv) {
  if (argc == 4 && std::strcmp(argv[1], "--peer") == 0) return hetmesh::run_peer(argv[2], argv[3]);
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
