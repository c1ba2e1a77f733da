// End-to-end tests of the AFD engine with real processes: this binary re-runs itself as the
// attention or FFN instances of a job (--role), which meet through a real TCP store.
#include "child_output.hpp"
#include "join.hpp"
#include "side_band.hpp"
#include "small_engine_job.hpp"
#include "wire.hpp"

#include "verbs_support.hpp"

#include <hetmesh/afd/engine.hpp>
#include <hetmesh/afd/instances.hpp>
#include <hetmesh/afd/local_job.hpp>
#include <hetmesh/core/log.hpp>
#include <hetmesh/core/rendezvous.hpp>
#include <hetmesh/core/subprocess.hpp>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <atomic>
#include <csignal>
#include <cstring>
#include <iostream>
#include <thread>

namespace hetmesh::afd {
namespace {

constexpr auto kTimeout = test::kSmallJobTimeout;

// ---- child roles ----

// Every F answers with out[i] = in[i] + its rank + 1 (bytes), so A can check each partial. With
// `held`, it answers micro-batch N only once the store holds the key "go/N" (the A says when).
int run_ffn(const EngineSpec& spec, KeyValueStore& store, bool held = false) {
  Device device = PluginRegistry::load().device("cpu:0");
  FfnEngine engine(spec, device, store);
  while (auto batch = engine.get_batch(kTimeout)) {
    if (held) store.get(fmt::format("go/{}", batch->micro_batch), kTimeout);
    for (const auto& part : batch->parts) {
      test::answer_plus_rank(spec, part);
    }
    std::cout << "batch " << batch->micro_batch << " parts " << batch->parts.size() << std::endl;
    engine.respond(*batch);
  }
  return 0;
}

// An F whose compute stream works `kSlowCompute` after respond() has queued it: "F compute" runs
// until that work is done (what a device's kernels look like), not until respond() was called.
constexpr auto kSlowCompute = std::chrono::milliseconds(300);

int run_slow_ffn(const EngineSpec& spec, KeyValueStore& store) {
  Device device = PluginRegistry::load().device("cpu:0");
  FfnEngine engine(spec, device, store);
  Stream stream = device.create_stream();
  while (auto batch = engine.get_batch(kTimeout)) {
    int64_t start = now_ns();
    for (const auto& part : batch->parts)
      test::answer_plus_rank(spec, part);
    stream.add_callback([](void*) { std::this_thread::sleep_for(kSlowCompute); }, nullptr);
    engine.respond(*batch, &stream, start);
  }
  return 0;
}

// Prints the F's compute time of one round trip, as the trace has it.
int run_compute_timer(const EngineSpec& spec, KeyValueStore& store) {
  Device device = PluginRegistry::load().device("cpu:0");
  AttentionEngine engine(spec, device, store);
  RoundTrip trip = engine.wait(engine.push_pull(0, spec.tokens), kTimeout);
  const auto& f = trip.ffn.at(0);
  std::cout << "compute_ms " << (f.f_compute_end - f.f_compute_start) / 1'000'000 << std::endl;
  engine.finish();
  return 0;
}

// A pushes `rounds` rounds of every micro-batch and checks each F's answer. With `after`, it
// first waits until the store key `after` exists; at the end it calls finish() (unless
// `finish` is false) and sets "<rank>.done".
int run_attention(const EngineSpec& spec, KeyValueStore& store, int rounds,
                  const std::string& after, bool finish) {
  Device device = PluginRegistry::load().device("cpu:0");
  AttentionEngine engine(spec, device, store);
  if (!after.empty()) store.get(after, kTimeout);
  for (int round = 0; round < rounds; ++round) {
    std::vector<AttentionEngine::Handle> handles;
    for (int mb = 0; mb < spec.micro_batches; ++mb) {
      auto* tokens = static_cast<uint8_t*>(engine.tokens(mb));
      for (uint32_t i = 0; i < spec.tokens * spec.hidden * spec.a2f_bytes; ++i)
        tokens[i] = static_cast<uint8_t>(i + round * 7 + mb * 3 + spec.rank * 11);
      handles.push_back(engine.push_pull(mb, spec.tokens));
    }
    for (int mb = 0; mb < spec.micro_batches; ++mb) {
      engine.wait(handles[static_cast<size_t>(mb)], kTimeout);
      for (int f = 0; f < spec.ffn; ++f) {
        auto* out = static_cast<const uint8_t*>(engine.result(mb, f));
        for (uint32_t i = 0; i < spec.tokens * spec.hidden * spec.f2a_bytes; ++i) {
          auto want = static_cast<uint8_t>(i + round * 7 + mb * 3 + spec.rank * 11 + f + 1);
          if (out[i] != want) {
            std::cerr << fmt::format(
                "attention {}: round {} mb {} ffn {} byte {}: got {} want {}\n", spec.rank, round,
                mb, f, i, out[i], want);
            return 3;
          }
        }
      }
    }
    std::cout << "round " << round << std::endl;
  }
  if (finish) engine.finish();
  store.set(fmt::format("{}.done", spec.rank), {1});
  return 0;
}

// A device stream ordered after a round trip by stream_wait: its marker, written after the wait,
// stays unwritten while the F (held until this A says "go/0") has not answered, and once it is
// written the results are there. Then a round trip still outstanding when the engine ends (the F
// never gets "go/1") lets its waiting stream go: at finish() (`end` "finish"), or when the engine
// is destroyed with the stream still waiting (`end` "destroy": the engine waits for the stream to
// pass before freeing the flag). Prints "stream_wait ok" or what went wrong.
int run_stream_waiter(const EngineSpec& spec, KeyValueStore& store, const std::string& end) {
  Device device = PluginRegistry::load().device("cpu:0");
  auto engine = std::make_unique<AttentionEngine>(spec, device, store);
  Stream stream = device.create_stream();
  HostBuffer markers(device, 4096);
  auto* words = reinterpret_cast<uint32_t*>(markers.data());
  std::memset(engine->tokens(0), 5, uint64_t{spec.tokens} * spec.hidden * spec.a2f_bytes);
  AttentionEngine::Handle h = engine->push_pull(0, spec.tokens);
  engine->stream_wait(h, stream);
  stream.write_value32(&words[0], 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  if (std::atomic_ref<uint32_t>(words[0]).load() != 0) {
    std::cout << "the stream went past stream_wait before the F answered" << std::endl;
    return 3;
  }
  store.set("go/0", {1});
  stream.synchronize(kTimeout);
  if (static_cast<const uint8_t*>(engine->result(0, 0))[0] != 6) {
    std::cout << "the stream went past stream_wait before the results arrived" << std::endl;
    return 3;
  }
  engine->wait(h, kTimeout);
  h = engine->push_pull(1, spec.tokens);
  engine->stream_wait(h, stream);
  stream.write_value32(&words[1], 1);
  if (end == "finish") {
    try {
      engine->finish();  // with micro-batch 1 outstanding
    } catch (const Error&) {
    }
  }
  engine.reset();
  stream.synchronize(kTimeout);  // a stream left waiting would time out here
  if (std::atomic_ref<uint32_t>(words[1]).load() != 1) {
    std::cout << "the waiting stream was not let go" << std::endl;
    return 3;
  }
  std::cout << "stream_wait ok" << std::endl;
  return 0;
}

// Joins as attention 0 but sends one malformed header to F 0, then waits to be dropped.
int run_rogue(const EngineSpec& spec, KeyValueStore& store, const std::string& defect) {
  Device device = PluginRegistry::load().device("cpu:0");
  auto transport = Transport::create(spec.transport);
  HostBuffer headers(device, sizeof(WireHeader) * spec.micro_batches);
  HostBuffer results(device, spec.f2a_slot_bytes() * spec.micro_batches * spec.ffn);
  HostBuffer result_headers(device, sizeof(WireHeader) * spec.micro_batches * spec.ffn);
  auto header_region = transport->register_memory(device, headers.data(), headers.size());
  PublishedRegions mine;
  mine.regions["f2a_payload"] = transport->register_memory(device, results.data(), results.size());
  mine.regions["f2a_headers"] =
      transport->register_memory(device, result_headers.data(), result_headers.size());
  Joined joined = join(spec, *transport, mine, store, Role::ffn, spec.ffn);
  const Link& link = *joined.peers[0].link;
  WireHeader h = make_header(spec, job_layout(spec), joined.epoch, MessageKind::a2f, 0, 1,
                             spec.tokens, uint64_t{spec.tokens} * spec.a2f_bytes_per_token());
  for (int t = 0; t < spec.a2f_tensors(); ++t)
    h.rows[t] = spec.tokens;
  h.result_rows = spec.tokens;
  uint32_t slot = 0;
  if (defect == "tokens") h.tokens = spec.tokens + 1000;
  if (defect == "payload") h.payload_bytes = spec.a2f_slot_bytes() * 4;
  if (defect == "magic") h.magic = 0x12345678;
  if (defect == "slot") slot = 999;
  if (defect == "reply") h.reply_region = 7;  // never announced
  if (defect == "landing") h.landing = 3;     // the F announced no receive buffers
  if (defect == "row_offset") h.row_offset = 1000;
  if (defect == "layout") h.layout ^= 1;  // a job of other shapes
  if (defect == "result_rows") h.result_rows = spec.tokens + 1;
  if (defect == "reply_range") {
    // Announced (its results region), but the answer would run past its end.
    link.connection->send_control(region_frame(1, mine.regions["f2a_payload"]->describe()));
    h.messages = 1;
    h.reply_region = 1;
    h.reply_offset = results.size() - 16;
  }
  std::memcpy(headers.data(), &h, sizeof h);
  link.connection->write(*header_region, 0, link.region("a2f_headers"), 0, sizeof h, slot, 0);
  std::vector<TransportEvent> events;
  for (int i = 0; i < 200; ++i)
    transport->poll(events, std::chrono::milliseconds(50));
  return 0;
}

// Joins as ffn 0 and tells attention 0 where to land its rows in a way that cannot be (a buffer it
// never announced, one too small, a micro-batch or a tensor the job does not have), then waits.
int run_rogue_ffn(const EngineSpec& spec, KeyValueStore& store, const std::string& defect) {
  Device device = PluginRegistry::load().device("cpu:0");
  auto transport = Transport::create(spec.transport);
  const uint64_t rows = spec.ffn_rows(spec.rank);
  HostBuffer inputs(device, spec.a2f_block_bytes(rows) * spec.micro_batches);
  HostBuffer headers(device, sizeof(WireHeader) * spec.attention * spec.micro_batches);
  HostBuffer small(device, 16);
  PublishedRegions mine;
  mine.regions["a2f_payload"] = transport->register_memory(device, inputs.data(), inputs.size());
  mine.regions["a2f_headers"] = transport->register_memory(device, headers.data(), headers.size());
  auto small_region = transport->register_memory(device, small.data(), small.size());
  Joined joined = join(spec, *transport, mine, store, Role::attention, spec.attention);
  const Link& link = *joined.peers[0].link;
  LandingFrame landing{0, 1, {}, {}};
  if (defect == "unknown") landing.region[kTokensTensor] = 7;
  if (defect == "mb") landing.micro_batch = 9;
  if (defect == "small" || defect == "tensor") {
    link.connection->send_control(region_frame(1, small_region->describe()));
    landing.region[defect == "small" ? kTokensTensor : 5] = 1;
  }
  link.connection->send_control(landing_frame(landing));
  std::vector<TransportEvent> events;
  for (int i = 0; i < 200; ++i)
    transport->poll(events, std::chrono::milliseconds(50));
  return 0;
}

int child_main(int argc, char** argv) {
  // --role ROLE --rank RANK --store STORE --out DIR ATTENTION FFN GATHER TRANSPORT
  //   [ROUNDS [AFTER] | DEFECT | held]               (LocalJob's arguments, then the test's)
  if (argc < 13) return 2;
  std::string role = argv[2];
  int rank = std::stoi(argv[4]);
  EngineSpec spec =
      test::small_spec(std::stoi(argv[9]), std::stoi(argv[10]), parse_transport_kind(argv[12]));
  spec.gather = std::string(argv[11]) == "eager" ? Gather::eager : Gather::all;
  spec.rank = rank;
  set_log_identity(fmt::format("{}:{}", role, rank));
  std::unique_ptr<KeyValueStore> store;
  try {
    store = connect_tcp_store(argv[6], kTimeout);
    if (role == "ffn") {
      spec.role = Role::ffn;
      return run_ffn(spec, *store, argc > 13 && std::string(argv[13]) == "held");
    }
    if (role == "slow-ffn") {
      spec.role = Role::ffn;
      return run_slow_ffn(spec, *store);
    }
    if (role == "rogue-ffn") {
      spec.role = Role::ffn;
      return argc < 14 ? 2 : run_rogue_ffn(spec, *store, argv[13]);
    }
    spec.role = Role::attention;
    if (argc < 14) return 2;
    if (role == "rogue") return run_rogue(spec, *store, argv[13]);
    if (role == "waiter") return run_stream_waiter(spec, *store, argv[13]);
    if (role == "compute-timer") return run_compute_timer(spec, *store);
    return run_attention(spec, *store, std::stoi(argv[13]), argc > 14 ? argv[14] : "",
                         argc <= 15 || std::string(argv[15]) != "no-finish");
  } catch (const Error& e) {
    std::cout << "error " << status_name(e.status()) << ": " << e.what() << std::endl;
    // The job's first failure, for the others' rendezvous waits (as run_instance publishes it).
    try {
      if (store && e.status() != kStatusJobFailed)
        Rendezvous(*store, spec.job, spec.role == Role::ffn ? "ffn" : "attention", rank)
            .report_failure(e.what());
    } catch (const Error&) {  // the store is gone: nobody is left to tell
    }
    return 1;
  }
}

// ---- the tests ----

// A job of this binary's child roles, started by the launcher that `hetmesh demo` uses.
struct Job {
  TcpStoreServer store{"127.0.0.1:0"};
  LocalJob instances{{}, store.address(), testing::TempDir()};
  std::vector<ChildProcess*> children;

  ChildProcess& spawn(const std::string& role, int rank, int a, int f, const char* gather,
                      TransportKind kind, std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {std::to_string(a), std::to_string(f), gather, to_string(kind)};
    args.insert(args.end(), extra.begin(), extra.end());
    children.push_back(&instances.start(role, rank, args));
    return *children.back();
  }
};

// Collects a child's output lines until it exits.
std::vector<std::string> lines_until_exit(ChildProcess& child) {
  return test::lines_until_exit(child, kTimeout * 2);
}

struct Shape {
  int attention, ffn;
  TransportKind kind;
};

class AfdJobTest : public testing::TestWithParam<Shape> {};

TEST_P(AfdJobTest, EveryAttentionGetsEveryFfnsAnswer) {
  const Shape s = GetParam();
  HETMESH_SKIP_UNLESS_USABLE(s.kind);
  Job job;
  for (int f = 0; f < s.ffn; ++f)
    job.spawn("ffn", f, s.attention, s.ffn, "all", s.kind);
  for (int a = 0; a < s.attention; ++a)
    job.spawn("attention", a, s.attention, s.ffn, "all", s.kind, {"5"});
  for (auto& child : job.children) {
    auto lines = lines_until_exit(*child);
    ProcessResult r = child->wait(kTimeout);
    std::string output;
    for (const auto& l : lines)
      output += l + "\n";
    EXPECT_EQ(r.exit_code, 0) << r.describe() << "\n" << output;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, AfdJobTest,
    testing::Values(Shape{1, 1, TransportKind::ipc}, Shape{2, 2, TransportKind::ipc},
                    Shape{3, 2, TransportKind::ipc}, Shape{1, 1, TransportKind::tcp},
                    Shape{2, 2, TransportKind::tcp}, Shape{3, 2, TransportKind::tcp},
                    Shape{1, 1, TransportKind::verbs}, Shape{2, 2, TransportKind::verbs}),
    [](const testing::TestParamInfo<Shape>& p) {
      return fmt::format("{}a{}f_{}", p.param.attention, p.param.ffn, to_string(p.param.kind));
    });

// Attention 1 starts only after attention 0 has finished all its rounds. In eager mode F serves
// attention 0 alone, so this completes; a gather-all F would wait for attention 1 forever.
TEST(AfdEagerTest, SlowAttentionDoesNotStallTheOthers) {
  Job job;
  ChildProcess& ffn = job.spawn("ffn", 0, 2, 1, "eager", TransportKind::tcp);
  ChildProcess& fast = job.spawn("attention", 0, 2, 1, "eager", TransportKind::tcp, {"3"});
  ChildProcess& slow =
      job.spawn("attention", 1, 2, 1, "eager", TransportKind::tcp, {"3", "0.done"});
  EXPECT_EQ(fast.wait(kTimeout * 2).exit_code, 0);
  EXPECT_EQ(slow.wait(kTimeout * 2).exit_code, 0);
  auto lines = lines_until_exit(ffn);
  EXPECT_EQ(ffn.wait(kTimeout).exit_code, 0);
  ASSERT_FALSE(lines.empty());
  for (const auto& l : lines)
    EXPECT_NE(l.find("parts 1"), std::string::npos) << l;
}

// Only finish() says an A is done. An A that ends its rounds and is destroyed without it ends as
// one that failed ("quit"): its F does not take the job for finished, and does not wait for a
// replacement either. (Every AfdJobTest A calls finish(), and its Fs end cleanly.)
TEST(AfdFailureTest, AnAttentionEngineDestroyedWithoutFinishQuits) {
  Job job;
  ChildProcess& ffn = job.spawn("ffn", 0, 1, 1, "all", TransportKind::tcp);
  ChildProcess& attention =
      job.spawn("attention", 0, 1, 1, "all", TransportKind::tcp, {"2", "", "no-finish"});
  EXPECT_EQ(attention.wait(kTimeout * 2).exit_code, 0);
  auto lines = lines_until_exit(ffn);
  ProcessResult f = ffn.wait(kTimeout);
  EXPECT_EQ(f.exit_code, 1) << f.describe();
  ASSERT_FALSE(lines.empty());
  EXPECT_NE(lines.back().find("every attention instance was lost, each after a failure of its "
                              "own (last: attention 0 quit"),
            std::string::npos)
      << lines.back();
}

TEST(AfdFailureTest, KilledFfnIsAClearErrorForAttention) {
  Job job;
  ChildProcess& ffn = job.spawn("ffn", 0, 1, 1, "all", TransportKind::tcp);
  ChildProcess& attention = job.spawn("attention", 0, 1, 1, "all", TransportKind::tcp, {"1000000"});
  EXPECT_EQ(attention.read_line(kTimeout), "round 0");
  ffn.kill(SIGKILL);
  std::string error;
  for (;;) {
    std::string line = attention.read_line(kTimeout * 2);
    if (line.rfind("error", 0) == 0) {
      error = line;
      break;
    }
  }
  EXPECT_NE(error.find("PEER_LOST"), std::string::npos) << error;
  EXPECT_NE(error.find("ffn 0 lost"), std::string::npos) << error;
  EXPECT_EQ(attention.wait(kTimeout).exit_code, 1);
}

// A device stream waits for a round trip without the host (stream_wait on the arrival flag), and
// is let go when the engine ends with the round trip outstanding, never left waiting forever.
TEST(AfdStreamWaitTest, AStreamWaitsForTheResultsAndIsLetGoAtTheEnd) {
  for (const char* mode : {"finish", "destroy"}) {
    Job job;
    ChildProcess& ffn = job.spawn("ffn", 0, 1, 1, "all", TransportKind::ipc, {"held"});
    ChildProcess& waiter = job.spawn("waiter", 0, 1, 1, "all", TransportKind::ipc, {mode});
    auto lines = lines_until_exit(waiter);
    ProcessResult r = waiter.wait(kTimeout);
    std::string output;
    for (const auto& l : lines)
      output += l + "\n";
    EXPECT_EQ(r.exit_code, 0) << mode << ": " << r.describe() << "\n" << output;
    EXPECT_NE(output.find("stream_wait ok"), std::string::npos) << mode << ": " << output;
    ffn.kill(SIGKILL);
    ffn.wait(kTimeout);
  }
}

// The trace's "F compute" ends when the F's stream has done the work respond() was given, which
// here runs kSlowCompute after respond() returned (it used to end at the respond() call).
TEST(AfdTraceTest, FComputeEndsWhenTheStreamsWorkIsDone) {
  Job job;
  ChildProcess& ffn = job.spawn("slow-ffn", 0, 1, 1, "all", TransportKind::ipc);
  ChildProcess& timer = job.spawn("compute-timer", 0, 1, 1, "all", TransportKind::ipc, {"-"});
  auto lines = lines_until_exit(timer);
  EXPECT_EQ(timer.wait(kTimeout).exit_code, 0);
  std::string output;
  long compute_ms = -1;
  for (const auto& l : lines) {
    output += l + "\n";
    if (l.rfind("compute_ms ", 0) == 0) compute_ms = std::stol(l.substr(11));
  }
  EXPECT_GE(compute_ms, kSlowCompute.count()) << output;
  ffn.wait(kTimeout);
}

class AfdHeaderTest : public testing::TestWithParam<std::pair<std::string, std::string>> {};

TEST_P(AfdHeaderTest, MalformedHeaderIsRefusedByFfn) {
  Job job;
  ChildProcess& ffn = job.spawn("ffn", 0, 1, 1, "all", TransportKind::tcp);
  job.spawn("rogue", 0, 1, 1, "all", TransportKind::tcp, {GetParam().first});
  auto lines = lines_until_exit(ffn);
  EXPECT_EQ(ffn.wait(kTimeout).exit_code, 1);
  ASSERT_FALSE(lines.empty());
  EXPECT_NE(lines.back().find(GetParam().second), std::string::npos) << lines.back();
  for (const auto& l : lines)
    EXPECT_EQ(l.rfind("batch", 0), std::string::npos) << "served: " << l;
}

INSTANTIATE_TEST_SUITE_P(
    Defects, AfdHeaderTest,
    testing::Values(std::pair{"tokens", "refused header: 1008 tokens (slot holds 0..8)"},
                    std::pair{"payload", "refused header: payload of"},
                    std::pair{"magic", "refused header: magic 12345678"},
                    std::pair{"slot", "notified slot 999, but only 2 slots exist"},
                    std::pair{"reply",
                              "answer to its buffer 7 at offset 0 (512 bytes), which "
                              "it never announced"},
                    std::pair{"reply_range",
                              "answer to its buffer 1 at offset 1008 (512 bytes), "
                              "which holds 1024 bytes"},
                    std::pair{"landing",
                              "refused header: landing 3 of micro-batch 0, which this F never "
                              "announced"},
                    std::pair{"row_offset",
                              "refused header: rows 1000..1008 (the row spaces hold 8)"},
                    std::pair{"layout", "refused header: the sender's job has other shapes"},
                    std::pair{"result_rows", "refused header: an answer of 9 rows (0..8)"}),
    [](const auto& p) { return p.param.first; });

// An F's landing frames are checked by the A before it writes anywhere they name: a hostile or
// broken F's is a protocol error of the A naming that F, and nothing lands there.
class AfdLandingTest : public testing::TestWithParam<std::pair<std::string, std::string>> {};

TEST_P(AfdLandingTest, AnImpossibleLandingIsRefusedByTheAttention) {
  Job job;
  job.spawn("rogue-ffn", 0, 1, 1, "all", TransportKind::tcp, {GetParam().first});
  ChildProcess& attention = job.spawn("attention", 0, 1, 1, "all", TransportKind::tcp, {"3"});
  auto lines = lines_until_exit(attention);
  EXPECT_EQ(attention.wait(kTimeout).exit_code, 1);
  ASSERT_FALSE(lines.empty());
  EXPECT_NE(lines.back().find("ffn 0: refused landing: " + GetParam().second), std::string::npos)
      << lines.back();
}

INSTANTIATE_TEST_SUITE_P(
    Defects, AfdLandingTest,
    testing::Values(std::pair{"unknown", "its buffer 7, never announced"},
                    std::pair{"mb", "micro-batch 9 (0..1)"},
                    std::pair{"small",
                              "512 bytes of its buffer 1 at offset 0 for tokens's rows, which it "
                              "holds 16 bytes"},
                    std::pair{"tensor", "a buffer for tensor 5, which this job does not send"}),
    [](const auto& p) { return p.param.first; });

TEST(AfdLaunchTest, InstancesSayWhichRanksStartHere) {
  JobConfig c;
  c.job.attention = 3;
  c.job.ffn = 4;
  LocalInstances all = parse_instances({}, c);
  EXPECT_EQ(all.attention, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(all.ffn, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_TRUE(all.everything(c));
  LocalInstances some = parse_instances({"ffn:3,0-1", "attention:2"}, c);
  EXPECT_EQ(some.attention, (std::vector<int>{2}));
  EXPECT_EQ(some.ffn, (std::vector<int>{0, 1, 3}));
  EXPECT_FALSE(some.everything(c));
  LocalInstances role = parse_instances({"attention"}, c);
  EXPECT_EQ(role.attention.size(), 3u);
  EXPECT_TRUE(role.ffn.empty());
  for (const char* bad : {"ffn:4", "attention:1-0", "ffn:x", "ffn:-1", "gpu", "ffn:1,,2"}) {
    try {
      parse_instances({bad}, c);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), HM_ERR_INVALID_ARGUMENT) << bad;
      EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace hetmesh::afd

int main(int argc, char** argv) {
  if (argc > 2 && std::strcmp(argv[1], "--role") == 0) return hetmesh::afd::child_main(argc, argv);
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
