// Rails (TransportOptions::rails) beyond the transport suite, which runs whole over two rails:
// that a striped write really crosses both; that a rail that fails in the middle of a stream of
// notified writes and control messages loses none of them and raises no error, every notification
// arriving once, in order, after its bytes, and every control message once, in order, whether the
// rail was the second or the lead (which carries them); and that such a rail is connected again
// after its cooldown and carries stripes again. Both ends in this process, over:
//  - tcp on 127.0.0.1 and 127.0.0.2: a rail's connections cut by the kernel (`ss -K`, as a NIC
//    reset would: the sockets abort), which needs root and a kernel with socket destruction
//    (CONFIG_INET_DIAG_DESTROY), as CI has;
//  - libfabric's tcp provider on the same two addresses, cut the same way;
//  - verbs on the rxe VM's rxe0 and rxe1, and libfabric's verbs;ofi_rxm on the same two (named by
//    their domains): a rail taken down with `ip link set veth0|veth2 down` (and up again after);
//    skipped where those devices are not.
#include "rails/rails_wire.hpp"

#include <unistd.h>

#include <hetmesh/core/log.hpp>
#include <hetmesh/core/plugin.hpp>
#include <hetmesh/core/subprocess.hpp>
#include <hetmesh/transport/transport.hpp>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <iostream>
#include <mutex>
#include <regex>
#include <span>
#include <sstream>
#include <string>
#include <vector>

namespace hetmesh {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr uint64_t kWriteBytes = 4 << 20;  // striped: 2 MiB a rail
constexpr int kSlots = 8;
constexpr int kWrites = 48;

struct Rails {
  TransportKind kind;
  std::vector<std::string> nics;
  std::string provider = "auto";  // fabric
  // The rxe VM's two RDMA devices, cut by their links (veth0, veth2); rxe1 counts its packets.
  bool rxe() const { return nics.at(1) == "rxe1"; }
};

std::string rails_name(const testing::TestParamInfo<Rails>& info) {
  if (info.param.kind != TransportKind::fabric) return to_string(info.param.kind);
  std::string provider = info.param.provider;  // "verbs;ofi_rxm" -> "verbs_ofi_rxm"
  for (char& c : provider)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return "fabric_" + provider;
}

bool required(TransportKind kind) {
  const char* list = std::getenv("HM_TEST_REQUIRE_TRANSPORTS");
  return list && std::string(list).find(to_string(kind)) != std::string::npos;
}

struct End {
  Device device = PluginRegistry::load().device("cpu:0");
  Buffer memory = device.allocate(2 * kSlots * kWriteBytes);  // a half for each way
  std::unique_ptr<Transport> transport;
  std::shared_ptr<Region> region;
  std::shared_ptr<Connection> connection;
  std::shared_ptr<RemoteRegion> peer;
  explicit End(const Rails& rails) {
    TransportOptions options;
    options.kind = rails.kind;
    options.rails = rails.nics;
    options.fabric_provider = rails.provider;
    options.io_timeout = 10s;
    transport = Transport::create(options);
    region = transport->register_memory(device, memory.data(), 2 * kSlots * kWriteBytes);
  }
  uint8_t* memory_at(uint64_t offset) { return static_cast<uint8_t*>(memory.data()) + offset; }
  uint8_t* slot(int k) { return memory_at((k % kSlots) * kWriteBytes); }
};

void connect(End& a, End& b) {
  auto other = std::async(std::launch::async,
                          [&] { return b.transport->connect(a.transport->endpoint(), 10s); });
  a.connection = a.transport->connect(b.transport->endpoint(), 10s);
  b.connection = other.get();
  a.peer = a.connection->import_region(b.region->describe());
  b.peer = b.connection->import_region(a.region->describe());
}

// The port of rail `rail`'s listener in an endpoint of `end`'s transport.
std::string rail_port(const End& end, size_t rail) {
  auto parts = detail::unpack_rails(end.transport->endpoint(), "endpoint");
  auto address = nlohmann::json::parse(parts.at(rail))["address"].get<std::string>();
  return address.substr(address.rfind(':') + 1);
}

std::string binary(const char* name);

// An `ss` filter of a rail's tcp connections: tcp's is the one that dialed b's listener or a's;
// libfabric's tcp provider opens its own to the rail's address, from whatever source the kernel
// picks (127.0.0.1 for either): rail 0's go from and to 127.0.0.1, rail 1's have 127.0.0.2 at
// one end.
std::vector<std::string> rail_filter(const End& a, const End& b, const Rails& rails, size_t rail) {
  if (rails.kind == TransportKind::fabric)
    return {"(", "src", rails.nics.at(rail), rail == 0 ? "and" : "or", "dst", rails.nics.at(rail),
            ")"};
  const std::string pa = ":" + rail_port(a, rail), pb = ":" + rail_port(b, rail);
  return {"(",     "sport", "=", pa,   "or",    "dport", "=", pa, "or",
          "sport", "=",     pb,  "or", "dport", "=",     pb,  ")"};
}

ProcessResult ss(const std::vector<std::string>& args, const std::vector<std::string>& filter) {
  std::vector<std::string> argv{binary("ss")};
  argv.insert(argv.end(), args.begin(), args.end());
  argv.insert(argv.end(), filter.begin(), filter.end());
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

// Whether a line of `ss -p` names this process among the socket's users (a child, ss itself
// among them, may hold it too: libfabric's sockets are inherited).
bool owned_here(const std::string& line) {
  return line.find(fmt::format("pid={},", ::getpid())) != std::string::npos;
}

// About how many bytes the second rail carried so far: rxe1's packets (its RoCE MTU here is
// 4096), or the most a tcp connection of the second rail received (its connections now).
uint64_t second_rail_bytes(const End& a, const End& b, const Rails& rails) {
  if (rails.rxe()) return static_cast<uint64_t>(rxe1_sent_packets()) * 4096;
  ProcessResult out = ss({"-tinpH"}, rail_filter(a, b, rails, 1));
  EXPECT_EQ(out.exit_code, 0) << out.describe();
  // This process's sockets only (another test may use the same address): a socket's line names
  // its process, the indented line after it has its counters.
  uint64_t most = 0;
  bool mine = false;
  std::istringstream lines(out.out);
  for (std::string line; std::getline(lines, line);) {
    std::smatch m;
    if (!line.empty() && !std::isspace(static_cast<unsigned char>(line[0])))
      mine = owned_here(line);
    else if (mine && std::regex_search(line, m, std::regex(R"(bytes_received:(\d+))")))
      most = std::max<uint64_t>(most, std::stoull(m[1]));
  }
  return most;
}

// Writes slot k of a into b's (a striped write), and waits for its notification; says what went
// wrong, or nothing.
std::string write_one(End& a, End& b, int k) {
  for (uint64_t i = 0; i < kWriteBytes; ++i)
    a.slot(k)[i] = pattern(k, i);
  const uint64_t at = (k % kSlots) * kWriteBytes;
  a.connection->write(*a.region, at, *a.peer, at, kWriteBytes, static_cast<uint32_t>(k),
                      static_cast<uint64_t>(k));
  std::vector<TransportEvent> events;
  bool notified = false, done = false;
  for (auto until = Clock::now() + 60s; !(notified && done) && Clock::now() < until;) {
    events.clear();
    b.transport->poll(events, 10ms);
    for (const auto& e : events) {
      if (e.type == TransportEvent::Type::peer_lost) return "b lost its peer: " + e.message;
      notified |= e.type == TransportEvent::Type::notification && e.value == uint32_t(k);
    }
    events.clear();
    a.transport->poll(events, 0ms);
    for (const auto& e : events) {
      if (e.type == TransportEvent::Type::peer_lost) return "a lost its peer: " + e.message;
      if (e.type == TransportEvent::Type::write_done && e.status != HM_OK)
        return fmt::format("write {} failed: {}", k, e.message);
      done |= e.type == TransportEvent::Type::write_done && e.cookie == uint64_t(k);
    }
  }
  if (!notified || !done) return fmt::format("write {}: not notified and done within 60 s", k);
  for (uint64_t i = 0; i < kWriteBytes; i += 509)
    if (b.slot(k)[i] != pattern(k, i)) return fmt::format("write {} landed wrong at {}", k, i);
  return "";
}

// The log lines of a test, from every thread.
class Said {
 public:
  Said()
      : previous_(set_log_sink([this](LogLevel level, std::string_view line) {
          if (level <= LogLevel::warn) std::cerr << line << "\n";  // shown with a failure
          std::lock_guard lock(mutex_);
          if (level <= LogLevel::warn) lines_.emplace_back(line);
        })) {}
  ~Said() { set_log_sink(previous_); }
  // How many lines said `text`.
  int count(const std::string& text) {
    std::lock_guard lock(mutex_);
    return static_cast<int>(std::count_if(lines_.begin(), lines_.end(), [&](const auto& line) {
      return line.find(text) != std::string::npos;
    }));
  }

 private:
  std::mutex mutex_;
  std::vector<std::string> lines_;
  LogSink previous_;
};

// Notified 4 MiB writes from a to b, each with a control message naming it, at most kSlots ahead
// of what b verified (a slot is rewritten only once b has read it, as the AFD engines' round trips
// do), each checked where it lands, in order; with `both_ways`, the same from b to a at once (in
// the other half of each end's slots), so each end's lead also carries its own writes ahead of
// its acknowledgements of the peer's.
class Stream {
 public:
  struct Way {
    End& from;
    End& to;
    int half;
    uint64_t bytes = kWriteBytes;  // a write's
    int depth = kSlots;            // writes in flight at most
    int issued = 0, verified = 0, done = 0, controls = 0;
    bool in_order = true, controls_in_order = true;
    // Where write k goes, in each end's memory.
    uint64_t offset(int k) const {
      return half * kSlots * kWriteBytes + static_cast<uint64_t>(k % depth) * bytes;
    }
  };
  // a writes `bytes` a write to b; with `back_bytes`, b to a too. Up to as many in flight as fit
  // in kSlots slots (at most 256).
  explicit Stream(End& a, End& b, uint64_t bytes = kWriteBytes, uint64_t back_bytes = 0) {
    ways.push_back({a, b, 0, bytes, depth(bytes)});
    if (back_bytes) ways.push_back({b, a, 1, back_bytes, depth(back_bytes)});
  }
  static int depth(uint64_t bytes) {
    return static_cast<int>(std::min<uint64_t>(256, kSlots * kWriteBytes / bytes));
  }
  // Streams until `enough()` or `until`; false at the deadline.
  bool run(const std::function<bool()>& enough, Clock::time_point until) {
    while (!enough()) {
      if (Clock::now() >= until) return false;
      step();
    }
    return true;
  }
  // Until every write issued is verified and done, and every control message came.
  bool drain(Clock::time_point until) {
    stop_issuing_ = true;
    const bool drained = run(
        [&] {
          return std::all_of(ways.begin(), ways.end(), [](const Way& w) {
            return w.verified == w.issued && w.done == w.issued && w.controls == w.issued;
          });
        },
        until);
    stop_issuing_ = false;
    return drained;
  }
  Way& ab() { return ways.front(); }
  std::vector<Way> ways;
  std::vector<std::string> failures;

 private:
  void step() {
    for (Way& w : ways)
      issue(w);
    take(ab().to, 5ms);  // b, then a
    take(ab().from, 5ms);
  }
  void issue(Way& w) {
    while (!stop_issuing_ && w.issued < w.verified + w.depth) {
      const int k = w.issued;
      const uint64_t at = w.offset(k);
      for (uint64_t i = 0; i < w.bytes; ++i)
        w.from.memory_at(at)[i] = pattern(k, i);
      w.from.connection->write(*w.from.region, at, *w.from.peer, at, w.bytes,
                               static_cast<uint32_t>(k), static_cast<uint64_t>(k));
      // And a control message naming it (the lead carries them, numbered, beside the writes).
      const std::string text = fmt::format("write {}", k);
      w.from.connection->send_control(
          std::span(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
      ++w.issued;
    }
  }
  // The events of `end`: the peer's notifications and control messages are of the way into it,
  // its own writes' completions of the way out of it.
  void take(End& end, std::chrono::nanoseconds wait) {
    events_.clear();
    end.transport->poll(events_, wait);
    for (const auto& e : events_) {
      const std::string side = &end == &ways.front().from ? "a" : "b";
      if (e.type == TransportEvent::Type::peer_lost) {
        failures.push_back(side + ": " + e.message);
        continue;
      }
      const bool into = e.type != TransportEvent::Type::write_done;
      auto found = std::find_if(ways.begin(), ways.end(),
                                [&](const Way& x) { return &(into ? x.to : x.from) == &end; });
      if (found == ways.end()) {
        failures.push_back(fmt::format("{}: an event of a way not streamed (type {})", side,
                                       static_cast<int>(e.type)));
        continue;
      }
      Way& w = *found;
      switch (e.type) {
        case TransportEvent::Type::peer_lost:
          break;
        case TransportEvent::Type::write_done:
          if (e.status != HM_OK)
            failures.push_back(fmt::format("{}: write {} failed: {}", side, e.cookie, e.message));
          ++w.done;
          break;
        case TransportEvent::Type::control: {
          const std::string text(e.payload.begin(), e.payload.end());
          w.controls_in_order = w.controls_in_order && text == fmt::format("write {}", w.controls);
          ++w.controls;
          break;
        }
        case TransportEvent::Type::notification: {
          const int k = static_cast<int>(e.value);
          w.in_order = w.in_order && k == w.verified;
          bool same = true;
          for (uint64_t i = 0; i < w.bytes && same; i += 509)
            same = end.memory_at(w.offset(k))[i] == pattern(k, i);
          if (!same) failures.push_back(fmt::format("{}: write {} landed wrong", side, k));
          ++w.verified;
          break;
        }
      }
    }
  }
  std::vector<TransportEvent> events_;
  bool stop_issuing_ = false;
};

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
  // Takes a rail down: the kernel aborts its tcp connections (tcp, fabric's tcp provider), or its
  // veth goes down (verbs; brought up again by bring_rail_up or TearDown). The stream goes on while
  // the command runs, so that the cut finds writes in flight.
  void cut_rail(Stream& stream, size_t rail) {
    const std::string veth = rail == 0 ? "veth0" : "veth2";
    std::vector<std::string> argv{binary("ip"), "link", "set", veth, "down"};
    if (GetParam().rxe()) {
      link_down_ = veth;
    } else {
      // Exactly this process's sockets there are now, each by its two addresses: not another
      // test's on the same address (ctest runs tests side by side), nor a connection made again
      // after the cut while ss still runs on a loaded machine.
      ProcessResult now = ss({"-tnpH"}, rail_filter(*a_, *b_, GetParam(), rail));
      ASSERT_EQ(now.exit_code, 0) << now.describe();
      argv = {binary("ss"), "-K", "("};
      const std::regex socket(R"((\S+:\d+)\s+(\S+:\d+)\s+users:)");
      std::istringstream lines(now.out);
      for (std::string line; std::getline(lines, line);) {
        std::smatch m;
        if (!std::regex_search(line, m, socket) || !owned_here(line)) continue;
        if (argv.size() > 3) argv.push_back("or");
        argv.insert(argv.end(), {"(", "src", m[1], "and", "dst", m[2], ")"});
      }
      ASSERT_GT(argv.size(), 3u) << "no connection of rail " << rail << " to cut: " << now.out;
      argv.push_back(")");
    }
    auto cut = std::async(std::launch::async, [=] { return run_process(argv, 10s); });
    stream.run([&] { return cut.wait_for(0s) == std::future_status::ready; }, Clock::now() + 60s);
    ProcessResult r = cut.get();
    ASSERT_EQ(r.exit_code, 0) << r.describe() << r.err;
  }
  void bring_rail_up() {
    if (link_down_.empty()) return;
    ProcessResult r = run_process({binary("ip"), "link", "set", link_down_, "up"}, 10s);
    EXPECT_EQ(r.exit_code, 0) << r.describe() << r.err;
    link_down_.clear();
  }
  void TearDown() override { bring_rail_up(); }
  // Cuts `rail` in the middle of `stream`, and streams on until a's next write landed; prints how
  // long that took.
  void cut_and_recover(Stream& stream, size_t rail, Clock::time_point until) {
    Stream::Way& ab = stream.ab();
    cut_rail(stream, rail);
    const auto cut_at = Clock::now();
    const int verified_at_cut = ab.verified;
    EXPECT_TRUE(stream.run([&] { return ab.verified > verified_at_cut; }, until));
    fmt::print(
        "rails over {}: rail {} cut after {} writes; the next write landed {:.1f} ms later\n",
        to_string(GetParam().kind), rail, verified_at_cut,
        std::chrono::duration<double, std::milli>(Clock::now() - cut_at).count());
  }
  // Streams to `writes` from a, then until everything issued landed: no write or control message
  // lost, failed, doubled or out of order, either way, and both ends still connected.
  void finish(Stream& stream, int writes, Clock::time_point until) {
    Stream::Way& ab = stream.ab();
    EXPECT_TRUE(stream.run([&] { return ab.verified >= writes; }, until));
    EXPECT_TRUE(stream.drain(until));
    EXPECT_EQ(stream.failures, std::vector<std::string>{});
    for (const Stream::Way& w : stream.ways) {
      const char* way = &w == &ab ? "a to b" : "b to a";
      EXPECT_TRUE(w.in_order) << way << ": notifications out of order, lost or doubled";
      EXPECT_TRUE(w.controls_in_order) << way << ": control messages out of order, lost or doubled";
      EXPECT_EQ(w.verified, w.issued) << way;
      EXPECT_EQ(w.controls, w.issued) << way;
      EXPECT_EQ(w.done, w.issued) << way;
    }
    EXPECT_TRUE(a_->connection->alive());
    EXPECT_TRUE(b_->connection->alive());
    fmt::print("rails over {}: {} and {} writes both ways, none lost\n", to_string(GetParam().kind),
               ab.issued, stream.ways.back().issued);
  }
  std::string rail_name(size_t rail) const {
    return fmt::format("rail {} ({})", rail, GetParam().nics[rail]);
  }
  std::unique_ptr<End> a_, b_;
  std::string link_down_;  // the veth taken down
};

TEST_P(RailsTest, AStripedWriteCrossesBothRails) {
  End &a = *a_, &b = *b_;
  const uint64_t before = second_rail_bytes(a, b, GetParam());
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
  const uint64_t carried = second_rail_bytes(a, b, GetParam()) - before;
  EXPECT_GE(carried, kWriteBytes / 2 - 64 * 1024);
  EXPECT_LT(carried, kWriteBytes);
}

TEST_P(RailsTest, ARailCutMidStreamLosesNoWriteAndRaisesNoError) {
  Said said;
  Stream stream(*a_, *b_, kWriteBytes, kWriteBytes);
  const auto until = Clock::now() + 240s;
  ASSERT_TRUE(stream.run([&] { return stream.ab().verified >= kWrites / 4; }, until));
  cut_and_recover(stream, 1, until);
  finish(stream, kWrites, until);
  EXPECT_GE(said.count(rail_name(1) + " is down"), 1) << "the cut never reached the rails";
}

// The lead (rail 0, which carries the user's notifications and control messages) cut mid-stream:
// both ends move theirs to rail 1, what the peer had not passed up goes again there, and the job
// goes on over the one rail left. a's small writes, 256 in flight, keep both leads busy, so
// acknowledgements lag behind what was passed up: at the cut, each end has notifications and
// control messages the peer passed up but has not acknowledged yet, which must not come twice;
// b's writes are striped, their notifications held behind their stripes. Then (but over
// verbs;ofi_rxm) rail 0 is back and rail 1 is cut: the lead moves again, onto the rail that came
// back.
TEST_P(RailsTest, TheLeadRailCutMidStreamHandsItsNotificationsOnAndLosesNothing) {
  Said said;
  Stream stream(*a_, *b_, 64 << 10, kWriteBytes);
  const int writes = kWrites * static_cast<int>(kWriteBytes / (64 << 10));
  const auto until = Clock::now() + 240s;
  ASSERT_TRUE(stream.run([&] { return stream.ab().verified >= writes / 4; }, until));
  cut_and_recover(stream, 0, until);
  EXPECT_GE(said.count(rail_name(1) + " carries the notifications from now"), 1);
  // Not over verbs;ofi_rxm: rxm keeps its failed connection to the peer's address, so a cut
  // rail's return is not dependable there. (Over verbs, rail 0 once never came back: each end
  // tried in windows of the same period, out of phase for good; the waits are drawn now.)
  if (GetParam().provider != "verbs;ofi_rxm") {
    bring_rail_up();
    ASSERT_TRUE(stream.run([&] { return said.count(rail_name(0) + " is back") >= 2; }, until))
        << "both ends should have connected rail 0 again";
    cut_and_recover(stream, 1, until);
    EXPECT_GE(said.count(rail_name(0) + " carries the notifications from now"), 1);
  }
  finish(stream, writes, until);
}

// A rail taken out is connected again by both ends after its cooldown, and carries half of each
// striped write again; a stream of writes goes on throughout, none lost, failed or out of order.
TEST_P(RailsTest, ACutRailIsTriedAgainAndCarriesStripesOnceBack) {
  if (GetParam().provider == "verbs;ofi_rxm")
    GTEST_SKIP() << "not yet over verbs;ofi_rxm: its rail is connected again, but rxm keeps its "
                    "failed connection to the peer's address, so the rail fails again and is "
                    "taken out again (no write lost)";
  End &a = *a_, &b = *b_;
  Said said;
  Stream stream(a, b);
  Stream::Way& ab = stream.ab();
  const std::string rail = fmt::format("rail 1 ({})", GetParam().nics[1]);
  const auto until = Clock::now() + 240s;
  ASSERT_TRUE(stream.run([&] { return ab.verified >= kSlots; }, until));
  cut_rail(stream, 1);
  const auto cut_at = Clock::now();
  // Until both ends took the rail out (a's writes find it, or its connection's end).
  ASSERT_TRUE(stream.run([&] { return said.count(rail + " is down") >= 2; }, until))
      << "both ends should have taken the rail out: " << said.count(rail + " is down");
  bring_rail_up();
  // Until both ends have it back, and a few writes more.
  ASSERT_TRUE(stream.run([&] { return said.count(rail + " is back") >= 2; }, until))
      << "both ends should have connected the rail again: " << said.count(rail + " is back");
  const auto back_at = Clock::now();
  const int verified_back = ab.verified;
  ASSERT_TRUE(stream.run([&] { return ab.verified >= verified_back + 2 * kSlots; }, until));
  ASSERT_TRUE(stream.drain(until));
  EXPECT_EQ(stream.failures, std::vector<std::string>{});
  EXPECT_TRUE(ab.in_order) << "notifications out of order";
  // One write more, alone: the rail carries its half again.
  const uint64_t before = second_rail_bytes(a, b, GetParam());
  ASSERT_EQ(write_one(a, b, ab.issued), "");
  const uint64_t carried = second_rail_bytes(a, b, GetParam()) - before;
  EXPECT_GE(carried, kWriteBytes / 2 - 64 * 1024) << "the rail came back but carried too little";
  // Once back, the rail's new connection kept its accounts (a count off by one would take it
  // down again as a malformed acknowledgement).
  EXPECT_EQ(said.count(rail + " is down"), 2);
  EXPECT_EQ(said.count("pieces of the"), 0);
  EXPECT_TRUE(a.connection->alive());
  EXPECT_TRUE(b.connection->alive());
  fmt::print(
      "rails over {}: rail 1 cut, then back on both ends {:.0f} ms after the cut ({} "
      "writes, none lost)\n",
      to_string(GetParam().kind),
      std::chrono::duration<double, std::milli>(back_at - cut_at).count(), ab.issued + 1);
}

INSTANTIATE_TEST_SUITE_P(
    Kinds, RailsTest,
    testing::Values(Rails{TransportKind::tcp, {"127.0.0.1", "127.0.0.2"}},
                    Rails{TransportKind::verbs, {"rxe0", "rxe1"}},
                    Rails{TransportKind::fabric, {"127.0.0.1", "127.0.0.2"}, "tcp"},
                    Rails{TransportKind::fabric, {"rxe0", "rxe1"}, "verbs;ofi_rxm"}),
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
