// The Chrome trace of a real `hetmesh demo` run (2A2F over ipc, separate processes) is a usable
// timeline: it parses, has complete events with times, a process per A and F instance, every
// metric of the engine by name, and tracks whose slices are in time order and never overlap.
// The checker is also run on broken copies of that trace, to show that it fails when it should.
#include <hetmesh/afd/metrics.hpp>
#include <hetmesh/core/error.hpp>
#include <hetmesh/core/job_secret.hpp>
#include <hetmesh/core/subprocess.hpp>

#include "etcd_server.hpp"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <algorithm>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

namespace hetmesh {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr int kAttention = 2, kFfn = 2;

// The phases the issue asks the trace to show, by the names the engine gives them.
const std::vector<std::string> kRequiredSlices = {
    "attention compute", "A send-queue delay", "A2F network", "F gather wait", "F compute",
    "F respond delay",   "F2A network",        "A notify",    "round trip"};

// Everything wrong with `trace` as a timeline of a job with `attention` A and `ffn` F instances;
// empty if nothing is.
std::vector<std::string> timeline_problems(const json& trace, int attention, int ffn) {
  std::vector<std::string> problems;
  auto problem = [&](std::string text) { problems.push_back(std::move(text)); };
  if (!trace.is_object() || !trace.contains("traceEvents") || !trace["traceEvents"].is_array()) {
    problem("no traceEvents array");
    return problems;
  }
  std::map<int, std::string> process_names;
  std::set<std::string> slice_names;
  std::set<int> pids_with_slices;
  std::map<std::pair<int, int>, std::pair<double, double>> last;  // track -> (ts, end) so far
  size_t complete = 0;
  for (const json& e : trace["traceEvents"]) {
    if (!e.is_object() || !e.contains("ph") || !e["ph"].is_string()) {
      problem(fmt::format("event without a phase: {}", e.dump()));
      continue;
    }
    std::string ph = e["ph"];
    if (ph == "M") {
      if (e.value("name", "") == "process_name" && e.contains("pid") && e["args"].contains("name"))
        process_names[e["pid"].get<int>()] = e["args"]["name"].get<std::string>();
      continue;
    }
    if (ph != "X") continue;
    ++complete;
    if (!e.contains("name") || !e.contains("pid") || !e.contains("tid") || !e.contains("ts") ||
        !e.contains("dur") || !e["ts"].is_number() || !e["dur"].is_number()) {
      problem(fmt::format("complete event without name, pid, tid, ts or dur: {}", e.dump()));
      continue;
    }
    std::string name = e["name"];
    int pid = e["pid"], tid = e["tid"];
    double ts = e["ts"], dur = e["dur"];
    slice_names.insert(name);
    pids_with_slices.insert(pid);
    if (dur < 0)
      problem(fmt::format("'{}' at {} on track {}/{} lasts {} us", name, ts, pid, tid, dur));
    auto [it, first] = last.try_emplace({pid, tid}, ts, ts + dur);
    if (!first) {
      auto [previous_ts, previous_end] = it->second;
      // Slices of one track are written in time order and follow each other (1 ns of slack for
      // the rounding of nanoseconds to fractional microseconds).
      if (ts < previous_ts)
        problem(fmt::format("track {}/{}: '{}' starts at {} us, before the slice before it ({} us)",
                            pid, tid, name, ts, previous_ts));
      else if (ts < previous_end - 1e-3)
        problem(
            fmt::format("track {}/{}: '{}' starts at {} us, inside the slice before it (ends "
                        "{} us)",
                        pid, tid, name, ts, previous_end));
      it->second = {ts, std::max(previous_end, ts + dur)};
    }
  }
  if (complete == 0) problem("no complete (\"ph\": \"X\") events");
  for (const auto& name : kRequiredSlices)
    if (!slice_names.contains(name)) problem(fmt::format("no '{}' slice", name));
  auto expect_process = [&](int pid, const std::string& name) {
    auto it = process_names.find(pid);
    if (it == process_names.end() || it->second != name)
      problem(fmt::format("no process named '{}' (pid {})", name, pid));
    else if (!pids_with_slices.contains(pid))
      problem(fmt::format("process '{}' has no slices", name));
  };
  for (int a = 0; a < attention; ++a)
    expect_process(a, fmt::format("attention {}", a));
  for (int f = 0; f < ffn; ++f)
    expect_process(afd::kFfnPidBase + f, fmt::format("ffn {}", f));
  return problems;
}

std::string joined(const std::vector<std::string>& lines) {
  std::string out;
  for (const auto& l : lines)
    out += l + "\n";
  return out;
}

bool mentions(const std::vector<std::string>& problems, const std::string& text) {
  for (const auto& p : problems)
    if (p.find(text) != std::string::npos) return true;
  return false;
}

// ---- peer changes: what an instance saw of its peers, in the summary and the trace ----

afd::InstanceHistory ffn0_saw_attention1_replaced() {
  afd::InstanceHistory h{afd::Role::ffn, 0, {}};
  h.history.changes = {{5'000'000, afd::Role::attention, 1, 1, afd::PeerStatus::State::lost,
                        "attention 1 lost: the peer closed the connection"},
                       {9'500'000, afd::Role::attention, 1, 2, afd::PeerStatus::State::live, ""}};
  h.history.stale_events = 3;
  return h;
}

TEST(PeerHistory, RoundTripsThroughJson) {
  afd::InstanceHistory h =
      afd::history_from_json(afd::history_to_json(ffn0_saw_attention1_replaced()));
  EXPECT_EQ(h.role, afd::Role::ffn);
  EXPECT_EQ(h.rank, 0);
  EXPECT_EQ(h.history.stale_events, 3u);
  ASSERT_EQ(h.history.changes.size(), 2u);
  const afd::PeerChange& lost = h.history.changes[0];
  EXPECT_EQ(lost.at_ns, 5'000'000);
  EXPECT_EQ(lost.role, afd::Role::attention);
  EXPECT_EQ(lost.rank, 1);
  EXPECT_EQ(lost.epoch, 1u);
  EXPECT_EQ(lost.state, afd::PeerStatus::State::lost);
  EXPECT_EQ(lost.reason, "attention 1 lost: the peer closed the connection");
  EXPECT_EQ(h.history.changes[1].state, afd::PeerStatus::State::live);
  EXPECT_EQ(h.history.changes[1].epoch, 2u);
}

TEST(PeerHistory, MalformedJsonIsRefused) {
  for (const std::string text :
       {"", "[]", R"({"role":"gpu","rank":0,"stale_events":0,"changes":[]})",
        R"({"role":"ffn","rank":0,"changes":[]})",
        R"({"role":"ffn","rank":0,"stale_events":0,"changes":[{"at_ns":1}]})"}) {
    try {
      afd::history_from_json(text);
      ADD_FAILURE() << "accepted: " << text;
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), HM_ERR_INVALID_ARGUMENT) << text;
    }
  }
}

TEST(PeerHistory, ChangesAreDescribedInTimeOrderFromTheOrigin) {
  afd::InstanceHistory a0{afd::Role::attention, 0, {}};
  a0.history.changes = {{7'000'000, afd::Role::ffn, 1, 1, afd::PeerStatus::State::lost,
                         "ffn 1 hung: nothing heard from it for 1003 ms"}};
  auto lines = afd::describe_histories({ffn0_saw_attention1_replaced(), a0}, 1'000'000);
  EXPECT_EQ(lines,
            (std::vector<std::string>{
                "ffn 0 at +4.0 ms: attention 1 lost: the peer closed the connection (epoch 1)",
                "attention 0 at +6.0 ms: ffn 1 hung: nothing heard from it for 1003 ms (epoch 1)",
                "ffn 0 at +8.5 ms: attention 1 joined (epoch 2)",
                "ffn 0: 3 event(s) of superseded incarnations dropped"}));
  EXPECT_TRUE(afd::describe_histories({afd::InstanceHistory{}}, 0).empty());
}

TEST(PeerHistory, TheChromeTraceMarksEachChangeOnItsInstance) {
  fs::path path = fs::temp_directory_path() / fmt::format("hetmesh-history-{}.json", getpid());
  afd::write_chrome_trace(path.string(), {}, {ffn0_saw_attention1_replaced()});
  std::ifstream in(path);
  json trace = json::parse(in);
  fs::remove(path);
  std::vector<std::string> marks;
  bool named = false;
  for (const json& e : trace["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "process_name" && e["pid"] == afd::kFfnPidBase)
      named = e["args"]["name"] == "ffn 0";
    if (e["ph"] != "i") continue;
    EXPECT_EQ(e["pid"], afd::kFfnPidBase) << e.dump();
    marks.push_back(fmt::format("{} at {} us, epoch {}", e["name"].get<std::string>(),
                                e["ts"].get<double>(), e["args"]["epoch"].get<int>()));
  }
  EXPECT_TRUE(named);
  EXPECT_EQ(marks, (std::vector<std::string>{"attention 1 lost at 5000 us, epoch 1",
                                             "attention 1 joined at 9500 us, epoch 2"}));
}

// Runs `hetmesh demo` once for the whole suite: 2A2F over ipc, the trace into a temporary folder.
class DemoTraceTest : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / fmt::format("hetmesh-trace-test-{}", getpid());
    fs::create_directories(dir_);
    fs::path trace_file = dir_ / "trace.json";
    std::ofstream(dir_ / "job.toml") << fmt::format(
        "[job]\nattention = {}\nffn = {}\nmicro_batches = 3\nlayers = 3\n\n"
        "[transport]\nkind = \"ipc\"\n\n[tracing]\nchrome_trace = \"{}\"\n",
        kAttention, kFfn, trace_file.string());
    ChildProcess demo({HETMESH_CLI, "demo", "--config", (dir_ / "job.toml").string()});
    try {
      for (;;)
        output_ += demo.read_line(std::chrono::seconds(120)) + "\n";
    } catch (const Error&) {
    }
    exit_code_ = demo.wait(std::chrono::seconds(60)).exit_code;
    std::ifstream in(trace_file);
    if (in) trace_ = json::parse(in, nullptr, false);
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }

  static fs::path dir_;
  static std::string output_;
  static int exit_code_;
  static json trace_;
};
fs::path DemoTraceTest::dir_;
std::string DemoTraceTest::output_;
int DemoTraceTest::exit_code_ = -1;
json DemoTraceTest::trace_;

TEST_F(DemoTraceTest, DemoRunsAndNamesItsTrace) {
  EXPECT_EQ(exit_code_, 0) << output_;
  EXPECT_NE(output_.find("verified"), std::string::npos) << output_;
  EXPECT_NE(output_.find("trace: " + (dir_ / "trace.json").string()), std::string::npos) << output_;
}

TEST_F(DemoTraceTest, TraceIsAUsableTimeline) {
  ASSERT_FALSE(trace_.is_discarded()) << "the trace is not JSON\n" << output_;
  ASSERT_FALSE(trace_.is_null()) << "no trace file\n" << output_;
  auto problems = timeline_problems(trace_, kAttention, kFfn);
  EXPECT_TRUE(problems.empty()) << joined(problems);
  // Each phase of every round trip: 3 layers x 3 micro-batches per A, each seen by both Fs.
  std::map<std::string, int> count;
  for (const json& e : trace_["traceEvents"])
    if (e["ph"] == "X") ++count[e["name"].get<std::string>()];
  EXPECT_EQ(count["round trip"], kAttention * 3 * 3);
  EXPECT_EQ(count["F2A network"], kAttention * 3 * 3 * kFfn);
}

// The checker itself: each kind of damage to the real trace is caught.
TEST_F(DemoTraceTest, CheckerFailsOnAMissingMetric) {
  ASSERT_TRUE(trace_.is_object());
  for (const auto& name : kRequiredSlices) {
    json broken = trace_;
    auto& events = broken["traceEvents"];
    events.erase(std::remove_if(events.begin(), events.end(),
                                [&](const json& e) { return e.value("name", "") == name; }),
                 events.end());
    EXPECT_TRUE(mentions(timeline_problems(broken, kAttention, kFfn), "no '" + name + "' slice"))
        << name;
  }
}

TEST_F(DemoTraceTest, CheckerFailsOnBrokenEvents) {
  ASSERT_TRUE(trace_.is_object());
  auto first_slice = [](json& trace) -> json& {
    for (json& e : trace["traceEvents"])
      if (e["ph"] == "X") return e;
    throw std::runtime_error("no slice");
  };
  json negative = trace_;
  first_slice(negative)["dur"] = -1.0;
  EXPECT_TRUE(mentions(timeline_problems(negative, kAttention, kFfn), "lasts -1"));

  json no_time = trace_;
  first_slice(no_time).erase("ts");
  EXPECT_TRUE(mentions(timeline_problems(no_time, kAttention, kFfn), "without name, pid"));

  json reversed = trace_;
  auto& events = reversed["traceEvents"];
  std::reverse(events.begin(), events.end());
  EXPECT_TRUE(mentions(timeline_problems(reversed, kAttention, kFfn), "before the slice before"));

  EXPECT_TRUE(
      mentions(timeline_problems(trace_, kAttention + 1, kFfn), "no process named 'attention 2'"));
  EXPECT_TRUE(mentions(timeline_problems(json::object(), kAttention, kFfn), "no traceEvents"));
}

// A job split over two invocations, as on two hosts (docs/launching.md): one starts the attention
// instances and hosts the store, the other joins it with the FFN instances; the first verifies.
TEST(DemoLaunchTest, TwoInvocationsShareOneJob) {
  fs::path dir = fs::temp_directory_path() / fmt::format("hetmesh-launch-test-{}", getpid());
  fs::create_directories(dir);
  std::ofstream(dir / "job.toml") << fmt::format(
      // The attention instances wait for the second invocation's FFN instances to join: on a
      // loaded machine (and under the sanitizers) that start can take longer than the default
      // 10 s, so the join's bound is one no loaded machine reaches.
      "[job]\nattention = 2\nffn = 2\nlayers = 2\njoin_timeout_ms = 300000\n\n"
      "[transport]\nkind = \"tcp\"\n\n"
      "[tracing]\nchrome_trace = \"{}\"\n",
      (dir / "trace.json").string());
  std::string config = (dir / "job.toml").string();
  ChildProcess attention({HETMESH_CLI, "demo", "--config", config, "--instances", "attention"});
  std::string store, secret, output;
  while (store.empty()) {
    std::string line = attention.read_line(std::chrono::seconds(60));
    output += line + "\n";
    if (auto at = line.find("rendezvous store "); at != std::string::npos)
      store = line.substr(at + 17, line.find(' ', at + 17) - at - 17);
    if (auto at = line.find("job secret in "); at != std::string::npos)
      secret = line.substr(at + 14, line.find(' ', at + 14) - at - 14);
  }
  ASSERT_FALSE(secret.empty()) << output;
  {  // Without the job's secret the second invocation is refused at its first store request.
    ProcessResult r = run_process(
        {HETMESH_CLI, "demo", "--config", config, "--instances", "ffn:0-1", "--store", store},
        std::chrono::seconds(60));
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE((r.out + r.err).find("does not hold the job's secret"), std::string::npos)
        << r.out << r.err;
  }
  setenv("HETMESH_JOB_SECRET_FILE", secret.c_str(), 1);
  ChildProcess ffn(
      {HETMESH_CLI, "demo", "--config", config, "--instances", "ffn:0-1", "--store", store});
  unsetenv("HETMESH_JOB_SECRET_FILE");
  std::string ffn_output;
  try {
    for (;;)
      ffn_output += ffn.read_line(std::chrono::seconds(120)) + "\n";
  } catch (const Error&) {
  }
  try {
    for (;;)
      output += attention.read_line(std::chrono::seconds(120)) + "\n";
  } catch (const Error&) {
  }
  EXPECT_EQ(ffn.wait(std::chrono::seconds(60)).exit_code, 0) << ffn_output;
  EXPECT_EQ(attention.wait(std::chrono::seconds(60)).exit_code, 0) << output;
  EXPECT_NE(ffn_output.find("ffn instance(s) 0,1 done"), std::string::npos) << ffn_output;
  EXPECT_NE(output.find("verified: final hidden states of 2 attention"), std::string::npos)
      << output;
  // Split over two invocations, the one-way times (two clocks) are left out.
  EXPECT_NE(output.find("one-way times omitted"), std::string::npos) << output;
  fs::remove_all(dir);
}

// A benchmark's JSON says where and when it ran and with which hetmesh, beside its figures.
TEST(BenchJsonTest, TransportResultsNameTheirMachineDateAndVersion) {
  test::TempDir dir;
  ProcessResult r = run_process({HETMESH_CLI, "bench", "transport", "--transport", "tcp", "--sizes",
                                 "4K", "--iterations", "20", "--json", dir.file("bench.json")},
                                std::chrono::seconds(120));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  json results = json::parse(std::ifstream(dir.file("bench.json")), nullptr, false);
  ASSERT_TRUE(results.is_object()) << r.out;
  char host[256] = "";
  gethostname(host, sizeof host - 1);
  std::time_t now = std::time(nullptr);
  char today[16];
  std::strftime(today, sizeof today, "%Y-%m-%d", std::gmtime(&now));
  EXPECT_EQ(results["run"]["host"], host);
  EXPECT_EQ(results["run"]["date"].get<std::string>().substr(0, 10), today);
  EXPECT_EQ(results["run"]["hetmesh_version"].get<std::string>().find('.'), 1u);
  EXPECT_EQ(results["rows"].size(), 1u);
}

// bench afd --gap-us keeps the host busy between a micro-batch's answer and its next push (a
// layer's compute), so each round trip starts after a gap: the measured span is at least the
// gaps, which bounds the throughput the JSON reports. Without the gap, a 1-token job's round trips
// come tens of times faster.
TEST(BenchJsonTest, AfdGapHoldsTheRoundTripsApart) {
  test::TempDir dir;
  std::ofstream(dir.file("gap.toml")) << R"([job]
attention = 1
ffn = 1
micro_batches = 1
[model]
tokens = 1
hidden = 64
experts = 2
top_k = 1
[transport]
kind = "ipc"
)";
  constexpr int kGapUs = 5000;
  ProcessResult r = run_process({HETMESH_CLI, "bench", "afd", "--config", dir.file("gap.toml"),
                                 "--iterations", "20", "--warmup", "2", "--no-bare", "--gap-us",
                                 std::to_string(kGapUs), "--json", dir.file("bench.json")},
                                std::chrono::seconds(120));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("host work between a micro-batch's result and its next push: 5000 us"),
            std::string::npos)
      << r.out;
  json results = json::parse(std::ifstream(dir.file("bench.json")), nullptr, false);
  ASSERT_TRUE(results.is_object()) << r.out;
  EXPECT_EQ(results["gap_us"], kGapUs);
  const double bytes = results["bytes_per_round_trip_per_attention"].get<double>();
  ASSERT_GT(bytes, 0);
  // Gb/s = 8 x bytes per round trip x round trips / span in ns, and span >= round trips x gap.
  EXPECT_LE(results["throughput_gbps"].get<double>(), 8.0 * bytes / (kGapUs * 1000.0) * 1.001)
      << r.out;
}

// `hetmesh info` says what hwloc knows of the machine: its NUMA nodes, and for each device and
// RDMA NIC its place (null for a device that is not a PCI device, as the cpu plugin's).
TEST(InfoTest, SaysWhereThingsSitInTheMachine) {
  ProcessResult r = run_process({HETMESH_CLI, "info", "--json"}, std::chrono::seconds(60));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  json info = json::parse(r.out, nullptr, false);
  ASSERT_TRUE(info.is_object()) << r.out;
  EXPECT_GE(info["topology"]["numa_nodes"].get<int>(), 1) << info["topology"].dump();
  for (const json& plugin : info["plugins"])
    for (const json& device : plugin["devices"]) {
      ASSERT_TRUE(device.contains("place")) << device.dump();
      EXPECT_EQ(device["place"].is_null(), device["pci_bus_id"].get<std::string>().empty())
          << device.dump();
      // One NUMA answer a device, and who gave it; none inside its place.
      const std::string from = device["numa_node_from"].get<std::string>();
      EXPECT_TRUE(from == "plugin" || from == "hwloc" || from == "unknown") << device.dump();
      EXPECT_EQ(from == "unknown", device["numa_node"].get<int>() < 0) << device.dump();
      EXPECT_TRUE(device["place"].is_null() || !device["place"].contains("numa_node"))
          << device.dump();
    }
  r = run_process({HETMESH_CLI, "info"}, std::chrono::seconds(60));
  EXPECT_NE(r.out.find("NUMA node(s) (hwloc)"), std::string::npos) << r.out;
}

// A job over etcd, split over two invocations as on two hosts: nothing is hosted, both meet at
// etcd, and the job's secret (a file both name) authenticates their links; the first verifies.
TEST(DemoLaunchTest, TwoInvocationsMeetAtEtcd) {
  HETMESH_REQUIRE_ETCD_OR_SKIP();
  test::EtcdServer etcd;
  test::TempDir dir;
  JobSecret::generate().write_file(dir.file("job.secret"));
  std::ofstream(dir.file("job.toml")) << fmt::format(
      // The attention instances wait for the second invocation's FFN instances to join: on a
      // loaded machine (and under the sanitizers) that start can take longer than the default
      // 10 s, so the join's bound is one no loaded machine reaches.
      "[job]\nattention = 2\nffn = 2\nlayers = 2\njoin_timeout_ms = 300000\n\n"
      "[transport]\nkind = \"tcp\"\n\n"
      "[rendezvous]\nkind = \"etcd\"\naddress = \"{}\"\nsecret_file = \"{}\"\n",
      etcd.endpoint(), dir.file("job.secret"));
  const std::string config = dir.file("job.toml");
  {  // Without the secret file, an invocation of part of the job is refused before it starts
     // anything: a secret of its own would be unknown to the other invocations.
    std::ofstream(dir.file("no-secret.toml")) << fmt::format(
        "[job]\nattention = 2\nffn = 2\n\n[rendezvous]\nkind = \"etcd\"\naddress = \"{}\"\n",
        etcd.endpoint());
    ProcessResult r = run_process(
        {HETMESH_CLI, "demo", "--config", dir.file("no-secret.toml"), "--instances", "ffn"},
        std::chrono::seconds(60));
    EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
    EXPECT_NE(r.err.find("starts part of a job that meets at etcd"), std::string::npos) << r.err;
  }
  ChildProcess attention({HETMESH_CLI, "demo", "--config", config, "--instances", "attention"});
  ProcessResult ffn = run_process({HETMESH_CLI, "demo", "--config", config, "--instances", "ffn"},
                                  std::chrono::seconds(120));
  std::string output;
  try {
    for (;;)
      output += attention.read_line(std::chrono::seconds(120)) + "\n";
  } catch (const Error&) {
  }
  EXPECT_EQ(ffn.exit_code, 0) << ffn.out << ffn.err;
  EXPECT_EQ(attention.wait(std::chrono::seconds(60)).exit_code, 0) << output;
  EXPECT_NE(output.find("rendezvous store " + etcd.endpoint() + " (joined)"), std::string::npos)
      << output;
  EXPECT_NE(output.find("verified: final hidden states of 2 attention"), std::string::npos)
      << output;
}

}  // namespace
}  // namespace hetmesh
