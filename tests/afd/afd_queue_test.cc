// The AFD engine as a framework embeds it, with real processes meeting through a real TCP store:
// a host that queues a stage's layers ahead on a stream (and an F killed under that queue),
// side-band messages kept in order with the data, a
// wait that ends when its engine is finished from another thread, a timed-out wait waited for
// again, empty pushes from an idle rank, and an F's finish() ending its get_batch.
#include "child_job.hpp"
#include "small_engine_job.hpp"
#include "verbs_support.hpp"

#include <hetmesh/afd/engine.hpp>
#include <hetmesh/afd/local_job.hpp>
#include <hetmesh/core/log.hpp>
#include <hetmesh/core/metrics_server.hpp>
#include <hetmesh/core/rendezvous.hpp>
#include <hetmesh/core/subprocess.hpp>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <csignal>
#include <cstring>
#include <future>
#include <iostream>
#include <sstream>
#include <thread>

namespace hetmesh::afd {
namespace {

constexpr auto kTimeout = test::kSmallJobTimeout;
constexpr int kLayers = 8;  // the engine's default queue depth: every layer queued at once

uint64_t token_bytes(const EngineSpec& spec) {
  return uint64_t{spec.tokens} * spec.hidden * spec.a2f_bytes;
}

// The value of the first sample of `name` the attention child printed ("metric NAME{...} V") whose
// labels contain each of `labels`; -1 if none.
int64_t metric(const std::vector<std::string>& lines, const std::string& name,
               const std::vector<std::string>& labels = {}) {
  for (const std::string& line : lines) {
    if (!line.starts_with("metric " + name + "{") ||
        !std::all_of(labels.begin(), labels.end(),
                     [&](const std::string& l) { return line.find(l) != std::string::npos; }))
      continue;
    const size_t space = line.rfind(' ');
    return std::stoll(line.substr(space + 1));
  }
  return -1;
}

// ---- child roles ----

// F answers out[i] = in[i] + rank + 1 (bytes). "held": a micro-batch's answer waits for the store
// key "go/<mb>"; "die-at N": the F kills itself on receiving a part tagged N (a layer); "finish":
// another thread's finish() must end a get_batch that waits forever.
int run_ffn(const EngineSpec& spec, KeyValueStore& store, const std::string& mode, int at) {
  Device device = PluginRegistry::load().device("cpu:0");
  FfnEngine engine(spec, device, store);
  if (mode == "finish") {
    auto waiting = std::async(std::launch::async, [&] {
      try {
        engine.get_batch(std::chrono::hours(1));
        return std::string("get_batch returned a batch");
      } catch (const Error& e) {
        return fmt::format("get_batch ended: {}: {}", status_name(e.status()), e.what());
      }
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    engine.finish();
    if (waiting.wait_for(kTimeout) != std::future_status::ready) {
      std::cout << "get_batch did not end at finish()" << std::endl;
      std::_Exit(3);
    }
    std::cout << waiting.get() << std::endl;
    store.set("ffn-finished", {1});
    return 0;
  }
  if (mode == "die-at") store.get("queued", kTimeout);  // every layer is pushed: none refused
  while (auto batch = engine.get_batch(kTimeout)) {
    if (mode == "messages") {
      // The A's message for this step was sent before its push: it is here already.
      auto message = engine.receive_message(std::chrono::milliseconds(0));
      std::string text =
          message ? std::string(message->bytes.begin(), message->bytes.end()) : "nothing";
      std::cout << fmt::format("before part {}: {}", batch->parts[0].tag, text) << std::endl;
      std::string answer = fmt::format("answer {}", batch->parts[0].tag);
      engine.send_message(batch->parts[0].rank,
                          {reinterpret_cast<const uint8_t*>(answer.data()), answer.size()});
    }
    if (mode == "held") store.get(fmt::format("go/{}", batch->micro_batch), kTimeout);
    for (const auto& part : batch->parts) {
      if (mode == "die-at" && part.tag == static_cast<uint64_t>(at)) raise(SIGKILL);
      test::answer_plus_rank(spec, part);
      std::cout << fmt::format("part mb {} tokens {}", batch->micro_batch, part.tokens)
                << std::endl;
    }
    engine.respond(*batch);
  }
  engine.finish();
  return 0;
}

// One layer's attention on the stream: micro-batch mb's tokens become the sum of every F's answer
// to the previous layer, plus one (the first layer's tokens are set by the host).
struct Layer {
  AttentionEngine* engine;
  int mb;
  uint64_t bytes;
};

void next_layer(void* data) {
  const auto& layer = *static_cast<const Layer*>(data);
  auto* tokens = static_cast<uint8_t*>(layer.engine->tokens(layer.mb));
  for (uint64_t i = 0; i < layer.bytes; ++i) {
    uint8_t sum = 1;
    for (int f = 0; f < layer.engine->spec().ffn; ++f)
      sum = static_cast<uint8_t>(sum +
                                 static_cast<const uint8_t*>(layer.engine->result(layer.mb, f))[i]);
    tokens[i] = sum;
  }
}

// The host pushes every layer of both micro-batches without waiting: each layer's attention runs
// on a stream after the stream waited for the previous answers (stream_wait). Then it waits for
// every handle in order, printing "wait <layer> <mb> ok" or "... lost: <why>", and checks the
// last answers against the same layers computed here.
int run_queued(const EngineSpec& job_spec, KeyValueStore& store) {
  Device device = PluginRegistry::load().device("cpu:0");
  EngineSpec spec = job_spec;
  spec.metrics_listen = "127.0.0.1:0";  // scraped below, over HTTP
  AttentionEngine engine(spec, device, store);
  Stream stream = device.create_stream();
  const uint64_t bytes = token_bytes(spec);
  std::vector<std::vector<uint8_t>> expected(static_cast<size_t>(spec.micro_batches));
  std::vector<Layer> layers;
  layers.reserve(static_cast<size_t>(kLayers * spec.micro_batches));
  std::vector<AttentionEngine::Handle> handles;
  for (int mb = 0; mb < spec.micro_batches; ++mb) {
    auto* tokens = static_cast<uint8_t*>(engine.tokens(mb));
    for (uint64_t i = 0; i < bytes; ++i)
      tokens[i] = static_cast<uint8_t>(i * 3 + mb);
    expected[static_cast<size_t>(mb)].assign(tokens, tokens + bytes);
  }
  for (int layer = 0; layer < kLayers; ++layer)
    for (int mb = 0; mb < spec.micro_batches; ++mb) {
      if (layer > 0) {
        layers.push_back(Layer{&engine, mb, bytes});
        stream.add_callback(next_layer, &layers.back());
      }
      AttentionEngine::Push push;
      push.ready.stream = &stream;
      push.tag = static_cast<uint64_t>(layer);
      handles.push_back(engine.push_pull(mb, spec.tokens, push));
      engine.stream_wait(handles.back(), stream);
    }
  std::cout << "queued " << handles.size() << std::endl;
  store.set("queued", {1});
  // The same layers here: F f answers in + f + 1, and the next layer sums the answers, plus one.
  for (auto& e : expected)
    for (int layer = 0; layer < kLayers; ++layer)
      for (uint8_t& byte : e) {
        uint8_t sum = 1;
        for (int f = 0; f < spec.ffn; ++f)
          sum = static_cast<uint8_t>(sum + byte + f + 1);
        byte = layer + 1 < kLayers ? sum : static_cast<uint8_t>(byte + 1);  // F 0's last answer
      }
  uint64_t last_sequence = 0;
  for (size_t i = 0; i < handles.size(); ++i) {
    const int layer = static_cast<int>(i) / spec.micro_batches;
    const int mb = static_cast<int>(i) % spec.micro_batches;
    try {
      RoundTrip trip = engine.wait(handles[i], kTimeout);
      if (mb == 0 && trip.sequence != last_sequence + 1) {
        std::cout << fmt::format("layer {}: sequence {} after {}", layer, trip.sequence,
                                 last_sequence)
                  << std::endl;
        return 3;
      }
      if (mb == 0) last_sequence = trip.sequence;
      std::cout << fmt::format("wait {} {} ok", layer, mb) << std::endl;
    } catch (const Error& e) {
      std::cout << fmt::format("wait {} {} {}: {}", layer, mb, status_name(e.status()), e.what())
                << std::endl;
      if (e.status() != kStatusPeerLost) return 1;
    }
  }
  stream.synchronize(kTimeout);
  // What Prometheus would read: "metric <sample>" for each sample but the histograms' buckets.
  std::istringstream scraped(
      metrics::scrape(engine.metrics_address(), "", std::chrono::milliseconds(5000)));
  for (std::string line; std::getline(scraped, line);)
    if (!line.starts_with("#") && line.find("_bucket{") == std::string::npos)
      std::cout << "metric " << line << std::endl;
  for (int mb = 0; mb < spec.micro_batches; ++mb) {
    const auto* result = static_cast<const uint8_t*>(engine.result(mb, 0));
    if (!std::equal(result, result + bytes, expected[static_cast<size_t>(mb)].begin())) {
      std::cout << "results differ from the layers computed here" << std::endl;
      return 0;  // said, not failed: a run whose F was killed has no last answers to compare
    }
  }
  std::cout << "results match" << std::endl;
  engine.finish();
  return 0;
}

// Pushes micro-batch 0 to a held F and waits in another thread with no bound but a year; finish()
// here must end that wait at once, saying why.
int run_finish_while_waiting(const EngineSpec& spec, KeyValueStore& store) {
  Device device = PluginRegistry::load().device("cpu:0");
  AttentionEngine engine(spec, device, store);
  AttentionEngine::Handle h = engine.push_pull(0, spec.tokens);
  auto waiting = std::async(std::launch::async, [&] {
    try {
      engine.wait(h, std::chrono::hours(24 * 365));
      return std::string("wait returned results");
    } catch (const Error& e) {
      return fmt::format("wait ended: {}: {}", status_name(e.status()), e.what());
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  engine.finish();
  if (waiting.wait_for(kTimeout) != std::future_status::ready) {
    std::cout << "wait did not end at finish()" << std::endl;
    std::_Exit(3);
  }
  std::cout << waiting.get() << std::endl;
  store.set("go/0", {1});  // the F may end
  return 0;
}

// A wait that times out leaves its round trip in flight: once the F answers, a second wait gets
// the results.
int run_wait_again(const EngineSpec& spec, KeyValueStore& store) {
  Device device = PluginRegistry::load().device("cpu:0");
  AttentionEngine engine(spec, device, store);
  std::memset(engine.tokens(0), 5, token_bytes(spec));
  AttentionEngine::Handle h = engine.push_pull(0, spec.tokens);
  try {
    engine.wait(h, std::chrono::milliseconds(300));
    std::cout << "the first wait returned before the F answered" << std::endl;
    return 3;
  } catch (const Error& e) {
    std::cout << "first wait: " << status_name(e.status()) << ": " << e.what() << std::endl;
  }
  store.set("go/0", {1});
  engine.wait(h, kTimeout);
  const auto* result = static_cast<const uint8_t*>(engine.result(0, 0));
  std::cout << "second wait: result " << int{result[0]} << std::endl;
  engine.finish();
  return 0;
}

// An idle rank's empty push beside a full one.
int run_empty_push(const EngineSpec& spec, KeyValueStore& store) {
  Device device = PluginRegistry::load().device("cpu:0");
  AttentionEngine engine(spec, device, store);
  std::memset(engine.tokens(1), 7, token_bytes(spec));
  AttentionEngine::Handle empty = engine.push_pull(0, 0);
  AttentionEngine::Handle full = engine.push_pull(1, spec.tokens);
  RoundTrip trip = engine.wait(empty, kTimeout);
  engine.wait(full, kTimeout);
  std::cout << fmt::format("empty push answered: sequence {}; full: {}", trip.sequence,
                           int{static_cast<const uint8_t*>(engine.result(1, 0))[0]})
            << std::endl;
  engine.finish();
  return 0;
}

// Each step sends the F a message, then pushes; after the wait, the F's message sent before its
// answer is here already.
int run_messages(const EngineSpec& spec, KeyValueStore& store) {
  Device device = PluginRegistry::load().device("cpu:0");
  AttentionEngine engine(spec, device, store);
  for (int step = 0; step < 4; ++step) {
    std::string text = fmt::format("step {}", step);
    engine.send_message(0, {reinterpret_cast<const uint8_t*>(text.data()), text.size()});
    AttentionEngine::Push push;
    push.tag = static_cast<uint64_t>(step);
    engine.wait(engine.push_pull(0, spec.tokens, push), kTimeout);
    auto message = engine.receive_message(std::chrono::milliseconds(0));
    std::cout << fmt::format("after step {}: {}", step,
                             message ? std::string(message->bytes.begin(), message->bytes.end())
                                     : "nothing")
              << std::endl;
  }
  engine.finish();
  return 0;
}

// Joins, then waits until the F has finished (its get_batch test), and ends.
int run_idle(const EngineSpec& spec, KeyValueStore& store) {
  Device device = PluginRegistry::load().device("cpu:0");
  AttentionEngine engine(spec, device, store);
  store.get("ffn-finished", kTimeout);
  return 0;
}

int child_main(int argc, char** argv) {
  // --role ROLE --rank RANK --store STORE --out DIR TRANSPORT FFN [MODE [AT]]
  //   (LocalJob's arguments, then the test's)
  if (argc < 11) return 2;
  const std::string role = argv[2];
  EngineSpec spec = test::small_spec(1, std::stoi(argv[10]), parse_transport_kind(argv[9]));
  spec.rank = std::stoi(argv[4]);
  const std::string mode = argc > 11 ? argv[11] : "";
  set_log_identity(fmt::format("{}:{}", role, spec.rank));
  try {
    auto store = connect_tcp_store(argv[6], kTimeout);
    if (role == "ffn") {
      spec.role = Role::ffn;
      return run_ffn(spec, *store, mode, argc > 12 ? std::stoi(argv[12]) : -1);
    }
    spec.role = Role::attention;
    if (mode == "queued") return run_queued(spec, *store);
    if (mode == "finish-while-waiting") return run_finish_while_waiting(spec, *store);
    if (mode == "wait-again") return run_wait_again(spec, *store);
    if (mode == "empty") return run_empty_push(spec, *store);
    if (mode == "idle") return run_idle(spec, *store);
    if (mode == "messages") return run_messages(spec, *store);
    return 2;
  } catch (const Error& e) {
    std::cout << "error " << status_name(e.status()) << ": " << e.what() << std::endl;
    return 1;
  }
}

// ---- the tests ----

using test::has_line;
using test::joined;

struct Job {
  TransportKind kind = TransportKind::tcp;
  test::ChildJob children;

  ChildProcess& spawn(const std::string& role, int rank, int ffn,
                      std::vector<std::string> extra = {}) {
    extra.insert(extra.begin(), {to_string(kind), std::to_string(ffn)});
    return children.instances.start(role, rank, extra);
  }
};

std::vector<std::string> lines_until_exit(ChildProcess& child) {
  return test::lines_until_exit(child, kTimeout * 2);
}

// Every layer of two micro-batches queued at once, two Fs: each wait in order returns its round
// trip, and the last answers are the layers computed in one process.
// Over each transport: the order of a queue's posts is the engine's, whatever the transport's.
class AfdQueueTest : public testing::TestWithParam<TransportKind> {};

TEST_P(AfdQueueTest, AHostQueuesEveryLayerAheadAndGetsTheResultsInOrder) {
  HETMESH_SKIP_UNLESS_USABLE(GetParam());
  Job job{GetParam()};
  ChildProcess& f0 = job.spawn("ffn", 0, 2);
  ChildProcess& f1 = job.spawn("ffn", 1, 2);
  ChildProcess& a = job.spawn("attention", 0, 2, {"queued"});
  auto lines = lines_until_exit(a);
  EXPECT_EQ(a.wait(kTimeout).exit_code, 0) << joined(lines);
  EXPECT_TRUE(has_line(lines, fmt::format("queued {}", kLayers * 2))) << joined(lines);
  for (int layer = 0; layer < kLayers; ++layer)
    for (int mb = 0; mb < 2; ++mb)
      EXPECT_TRUE(has_line(lines, fmt::format("wait {} {} ok", layer, mb))) << joined(lines);
  EXPECT_TRUE(has_line(lines, "results match")) << joined(lines);
  EXPECT_EQ(f0.wait(kTimeout).exit_code, 0);
  EXPECT_EQ(f1.wait(kTimeout).exit_code, 0);
  // Its metrics, scraped over HTTP: every round trip, and each F's parts and answers.
  const std::string transport = to_string(GetParam());
  EXPECT_EQ(metric(lines, "hetmesh_round_trip_seconds_count"), kLayers * 2) << joined(lines);
  for (const char* status : {"peer_lost", "timeout", "protocol_error"})  // counted from 0
    EXPECT_EQ(metric(lines, "hetmesh_errors_total", {fmt::format("status=\"{}\"", status)}), 0)
        << joined(lines);
  for (const char* peer : {"ffn 0", "ffn 1"}) {
    const std::string of = fmt::format("peer=\"{}\"", peer);
    for (const char* direction : {"sent", "received"})
      EXPECT_EQ(
          metric(lines, "hetmesh_messages_total",
                 {of, fmt::format("direction=\"{}\",transport=\"{}\"", direction, transport)}),
          kLayers * 2)
          << joined(lines);
    EXPECT_EQ(metric(lines, "hetmesh_network_seconds_count", {of}), kLayers * 2) << joined(lines);
    EXPECT_EQ(metric(lines, "hetmesh_peer_up", {of}), 1) << joined(lines);
    EXPECT_EQ(metric(lines, "hetmesh_peer_losses_total", {of}), 0) << joined(lines);
  }
}

// The F dies on receiving layer 3 with every layer queued: the layers before 2 came back, every
// layer from 3 on fails naming the F, and nothing hangs.
TEST_P(AfdQueueTest, AnFfnKilledUnderAFullQueueIsNamedByEveryWaitItOwed) {
  HETMESH_SKIP_UNLESS_USABLE(GetParam());
  Job job{GetParam()};
  ChildProcess& f = job.spawn("ffn", 0, 1, {"die-at", "3"});
  ChildProcess& a = job.spawn("attention", 0, 1, {"queued"});
  auto lines = lines_until_exit(a);
  EXPECT_EQ(a.wait(kTimeout).exit_code, 0) << joined(lines);
  for (int layer = 0; layer < 2; ++layer)
    for (int mb = 0; mb < 2; ++mb)
      EXPECT_TRUE(has_line(lines, fmt::format("wait {} {} ok", layer, mb))) << joined(lines);
  for (int layer = 3; layer < kLayers; ++layer)
    for (int mb = 0; mb < 2; ++mb)
      EXPECT_TRUE(has_line(
          lines, fmt::format("wait {} {} PEER_LOST: attention 0: micro-batch {}", layer, mb, mb)))
          << joined(lines);
  EXPECT_TRUE(has_line(lines, "ffn 0")) << joined(lines);
  EXPECT_EQ(f.wait(kTimeout).signal, SIGKILL);
  // Its metrics: the F lost once and down, and every round trip either answered or failed.
  EXPECT_EQ(metric(lines, "hetmesh_peer_losses_total", {"\"ffn 0\""}), 1) << joined(lines);
  EXPECT_EQ(metric(lines, "hetmesh_peer_up", {"\"ffn 0\""}), 0) << joined(lines);
  const int64_t answered = metric(lines, "hetmesh_round_trip_seconds_count");
  EXPECT_GE(answered, 4) << joined(lines);
  EXPECT_EQ(metric(lines, "hetmesh_errors_total", {"status=\"peer_lost\""}), kLayers * 2 - answered)
      << joined(lines);
}

// The transports order control messages only among themselves (verbs: a socket beside the QP),
// yet a message sent before a push is there before the push's part, both ways.
TEST_P(AfdQueueTest, SideBandMessagesArriveBeforeTheDataSentAfterThem) {
  HETMESH_SKIP_UNLESS_USABLE(GetParam());
  Job job{GetParam()};
  ChildProcess& f = job.spawn("ffn", 0, 1, {"messages"});
  ChildProcess& a = job.spawn("attention", 0, 1, {"messages"});
  auto a_lines = lines_until_exit(a);
  EXPECT_EQ(a.wait(kTimeout).exit_code, 0) << joined(a_lines);
  auto f_lines = lines_until_exit(f);
  EXPECT_EQ(f.wait(kTimeout).exit_code, 0) << joined(f_lines);
  for (int step = 0; step < 4; ++step) {
    EXPECT_TRUE(has_line(f_lines, fmt::format("before part {}: step {}", step, step)))
        << joined(f_lines);
    EXPECT_TRUE(has_line(a_lines, fmt::format("after step {}: answer {}", step, step)))
        << joined(a_lines);
  }
}

INSTANTIATE_TEST_SUITE_P(Transports, AfdQueueTest,
                         testing::Values(TransportKind::ipc, TransportKind::tcp,
                                         TransportKind::verbs),
                         [](const testing::TestParamInfo<TransportKind>& p) {
                           return std::string(to_string(p.param));
                         });

TEST(AfdLifecycleTest, FinishEndsAWaitInAnotherThread) {
  Job job;
  ChildProcess& f = job.spawn("ffn", 0, 1, {"held"});
  ChildProcess& a = job.spawn("attention", 0, 1, {"finish-while-waiting"});
  auto lines = lines_until_exit(a);
  EXPECT_EQ(a.wait(kTimeout).exit_code, 0) << joined(lines);
  EXPECT_TRUE(has_line(lines,
                       "wait ended: CLOSED: attention 0: the engine was finished while "
                       "waiting for micro-batch 0 (sequence 1)"))
      << joined(lines);
  f.wait(kTimeout);
}

TEST(AfdLifecycleTest, ATimedOutWaitCanBeWaitedForAgain) {
  Job job;
  ChildProcess& f = job.spawn("ffn", 0, 1, {"held"});
  ChildProcess& a = job.spawn("attention", 0, 1, {"wait-again"});
  auto lines = lines_until_exit(a);
  EXPECT_EQ(a.wait(kTimeout).exit_code, 0) << joined(lines);
  EXPECT_TRUE(has_line(lines,
                       "first wait: HM_ERR_TIMEOUT: attention 0: micro-batch 0 (sequence "
                       "1): no answer from ffn 0 within 300 ms; it is still in flight"))
      << joined(lines);
  EXPECT_TRUE(has_line(lines, "second wait: result 6")) << joined(lines);  // 5 + rank 0 + 1
  EXPECT_EQ(f.wait(kTimeout).exit_code, 0);
}

TEST(AfdLifecycleTest, AnIdleRankPushesNoTokens) {
  Job job;
  ChildProcess& f = job.spawn("ffn", 0, 1);
  ChildProcess& a = job.spawn("attention", 0, 1, {"empty"});
  auto a_lines = lines_until_exit(a);
  EXPECT_EQ(a.wait(kTimeout).exit_code, 0) << joined(a_lines);
  EXPECT_TRUE(has_line(a_lines, "empty push answered: sequence 1; full: 8")) << joined(a_lines);
  auto f_lines = lines_until_exit(f);
  EXPECT_EQ(f.wait(kTimeout).exit_code, 0) << joined(f_lines);
  EXPECT_TRUE(has_line(f_lines, "part mb 0 tokens 0")) << joined(f_lines);
}

TEST(AfdLifecycleTest, AnFfnsFinishEndsItsGetBatchInAnotherThread) {
  Job job;
  ChildProcess& f = job.spawn("ffn", 0, 1, {"finish"});
  ChildProcess& a = job.spawn("attention", 0, 1, {"idle"});
  auto lines = lines_until_exit(f);
  EXPECT_EQ(f.wait(kTimeout).exit_code, 0) << joined(lines);
  EXPECT_TRUE(has_line(lines,
                       "get_batch ended: CLOSED: ffn 0: the engine was finished while "
                       "get_batch waited"))
      << joined(lines);
  a.wait(kTimeout);
}

}  // namespace
}  // namespace hetmesh::afd

int main(int argc, char** argv) {
  if (argc > 2 && std::strcmp(argv[1], "--role") == 0) return hetmesh::afd::child_main(argc, argv);
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
