// Round trips a device triggers (docs/device-triggered.md), with real processes meeting through a
// real TCP store: A on asic_stub (device memory the host cannot touch; its streams are threads)
// and F on cpu, neither host calling the engine per layer. A "step" is what a captured graph holds:
// the same stream operations with the same values, enqueued again for every replay, then one
// synchronize. Every replay's results are checked; a killed F, a finished A and As that are done
// release every stream that waits.
#include "child_job.hpp"
#include "small_engine_job.hpp"

#include <hetmesh/afd/engine.hpp>
#include <hetmesh/afd/local_job.hpp>
#include <hetmesh/core/log.hpp>
#include <hetmesh/core/rendezvous.hpp>
#include <hetmesh/core/subprocess.hpp>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <csignal>
#include <cstring>
#include <iostream>
#include <thread>

namespace hetmesh::afd {
namespace {

constexpr auto kTimeout = test::kSmallJobTimeout;
constexpr int kLayers = 4;
// Micro-batch 1 sends fewer rows than the slot holds: the count rides on the doorbell.
constexpr uint32_t kTokens[2] = {8, 5};

uint64_t row_bytes(const EngineSpec& spec) {
  return uint64_t{spec.hidden} * spec.a2f_bytes;
}

// ---- child roles ----

// The F's step: for each layer and micro-batch, wait for the batch, add one to every byte of its
// row space (a host callback standing in for the experts), and ring the answer. "die-at R": the
// F kills itself in layer 1 of replay R. "idle": it serves no step at all. "one-mb": a step is
// micro-batch 0 once. Ends when its step
// count is done, or when the engine says the job is over for it.
struct FfnStep {
  FfnEngine* engine;
  int mb;
  int die_at_replay;
  int replay = 0;
  int layer = 0;
};

void ffn_compute(void* data) {
  auto& step = *static_cast<FfnStep*>(data);
  const EngineSpec& spec = step.engine->spec();
  if (step.replay == step.die_at_replay && step.layer == 1) raise(SIGKILL);
  const auto* in = static_cast<const uint8_t*>(step.engine->inputs(step.mb, kTokensTensor));
  auto* out = static_cast<uint8_t*>(step.engine->outputs(step.mb));
  for (uint64_t i = 0; i < spec.ffn_rows(spec.rank) * row_bytes(spec); ++i)
    out[i] = static_cast<uint8_t>(in[i] + 1);
}

int run_ffn(const EngineSpec& spec, KeyValueStore& store, int replays, const std::string& mode,
            int at) {
  Device device = PluginRegistry::load().device("cpu:0");
  FfnEngine engine(spec, device, store);
  engine.serve_device();
  try {
    engine.get_batch(std::chrono::milliseconds(0));
  } catch (const Error& e) {
    std::cout << "get_batch: " << e.what() << std::endl;
  }
  Stream stream = device.create_stream();
  std::vector<FfnStep> steps;
  steps.reserve(static_cast<size_t>(kLayers * spec.micro_batches));
  // "one-mb": a step is one round trip of micro-batch 0.
  for (int layer = 0; layer < (mode == "one-mb" ? 1 : kLayers); ++layer)
    for (int mb = 0; mb < (mode == "one-mb" ? 1 : spec.micro_batches); ++mb)
      steps.push_back(FfnStep{&engine, mb, mode == "die-at" ? at : -1, 0, layer});
  // One step more than the A sends: the As' end must release it.
  const int steps_run = mode == "idle" ? 0 : replays + 1;
  for (int r = 0; r < steps_run; ++r) {
    for (FfnStep& step : steps) {
      step.replay = r;
      engine.enqueue_wait_batch(step.mb, stream);
      stream.add_callback(ffn_compute, &step);
      engine.enqueue_respond(step.mb, stream);
    }
    stream.synchronize(kTimeout);
    if (!engine.device_trips().ended.empty()) break;
  }
  if (mode == "idle") store.get("attention-done", kTimeout);
  DeviceTrips trips = engine.device_trips();
  std::cout << fmt::format("ffn: raised {} answered {} ended: {}", trips.completed,
                           trips.rung - trips.failed, trips.ended)
            << std::endl;
  engine.finish();
  return 0;
}

// Micro-batch 0 armed three ways, each ring naming one: layout 0 sends from the engine's slots,
// layouts 1 and 2 from buffers of their own, the answer landing in the buffer sent (as a graph's
// layers, each with its tensor at its own address). Each round trip adds one to what it sent, so
// after `replays` rounds of the three every buffer's rows sent hold the start + replays, and the
// rows after them the start.
int run_layouts(AttentionEngine& engine, Device& device, Stream& stream, int replays,
                const std::vector<uint8_t>& start, uint64_t slot) {
  const EngineSpec& spec = engine.spec();
  constexpr uint32_t kRows[3] = {8, 5, 3};
  Buffer own[2] = {device.allocate(slot), device.allocate(slot)};
  for (int l = 1; l <= 2; ++l) {
    Buffer& b = own[l - 1];
    stream.copy(b.data(), start.data(), slot);
    const PushTensor from[] = {{b.data()}, {}};
    void* const into[] = {b.data()};
    AttentionEngine::Push push;
    push.tensors = from;
    push.results_into = into;
    engine.arm_device(0, push, l);
  }
  stream.copy(engine.tokens(0), start.data(), slot);
  for (int r = 0; r < replays; ++r)
    for (int l = 0; l < 3; ++l) {
      engine.enqueue_push_pull(0, kRows[l], stream, l);
      engine.enqueue_wait(0, stream);
      if (l == 0) stream.copy(engine.tokens(0), engine.result(0, 0), kRows[0] * row_bytes(spec));
    }
  for (const int layout : {3, AttentionEngine::kMaxDeviceLayouts})
    try {
      engine.enqueue_push_pull(0, 1, stream, layout);
    } catch (const Error& e) {
      std::cout << "enqueue_push_pull: " << e.what() << std::endl;
    }
  try {
    engine.arm_device(0, {}, AttentionEngine::kMaxDeviceLayouts);
  } catch (const Error& e) {
    std::cout << "arm_device: " << e.what() << std::endl;
  }
  std::vector<uint8_t> got(slot * 3);
  stream.copy(got.data(), engine.tokens(0), slot);
  stream.copy(got.data() + slot, own[0].data(), slot);
  stream.copy(got.data() + 2 * slot, own[1].data(), slot);
  stream.synchronize(kTimeout);
  int right = 0;
  for (int l = 0; l < 3; ++l) {
    bool same = true;
    for (uint64_t i = 0; i < slot; ++i) {
      const int added = i < kRows[l] * row_bytes(spec) ? replays : 0;
      same = same && got[l * slot + i] == static_cast<uint8_t>(start[i] + added);
    }
    right += same;
  }
  DeviceTrips trips = engine.device_trips();
  std::cout << fmt::format("layouts right {} of 3; rung {} completed {} failed {}", right,
                           trips.rung, trips.completed, trips.failed)
            << std::endl;
  engine.finish();
  return 0;
}

// The A's step, replayed `replays` times: each micro-batch's tokens start as the host's pattern,
// are sent, and each layer's answer becomes the next layer's tokens on the stream (a copy, as a
// kernel would write them); the last answer is copied out to the host, a region per replay.
int run_attention(const EngineSpec& spec, KeyValueStore& store, int replays,
                  const std::string& mode) {
  Device device = PluginRegistry::load().device("asic_stub:0");
  AttentionEngine engine(spec, device, store);
  const uint64_t slot = spec.tokens * row_bytes(spec);
  std::vector<uint8_t> start(slot * 2);
  for (uint64_t i = 0; i < start.size(); ++i)
    start[i] = static_cast<uint8_t>(i * 7 + 3);
  std::vector<uint8_t> out(slot * 2 * static_cast<size_t>(replays));
  Stream stream = device.create_stream();
  for (int mb = 0; mb < spec.micro_batches; ++mb)
    engine.arm_device(mb);
  try {  // a push of the wrong shape is refused when armed; the arm before it stays
    void* const three[3] = {};
    AttentionEngine::Push bad;
    bad.results_into = three;
    engine.arm_device(0, bad);
  } catch (const Error& e) {
    std::cout << "arm_device: " << e.what() << std::endl;
  }
  try {
    engine.push_pull(0, 1);
  } catch (const Error& e) {
    std::cout << "push_pull: " << e.what() << std::endl;
  }
  if (mode == "layouts") return run_layouts(engine, device, stream, replays, start, slot);
  if (mode == "finish") {
    // The F never answers: finish() must let the waiting stream go, naming why.
    engine.enqueue_push_pull(0, kTokens[0], stream);
    engine.enqueue_wait(0, stream);
    // Until the engine has taken the ring (sent it): then only finish() can let the stream go.
    const auto give_up = std::chrono::steady_clock::now() + kTimeout;  // a hang guard only
    while (engine.device_trips().rung == 0 && std::chrono::steady_clock::now() < give_up)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::cout << "stream ready before finish: " << stream.ready() << std::endl;
    engine.finish();
    stream.synchronize(kTimeout);
    DeviceTrips trips = engine.device_trips();
    std::cout << fmt::format("after finish: rung {} failed {}: {}", trips.rung, trips.failed,
                             trips.failures.empty() ? "" : trips.failures.front())
              << std::endl;
    store.set("attention-done", {1});
    return 0;
  }
  for (int r = 0; r < replays; ++r) {
    for (int mb = 0; mb < spec.micro_batches; ++mb) {
      stream.copy(engine.tokens(mb), start.data() + mb * slot, slot);
      engine.enqueue_push_pull(mb, kTokens[mb], stream);
    }
    for (int layer = 0; layer < kLayers; ++layer)
      for (int mb = 0; mb < spec.micro_batches; ++mb) {
        engine.enqueue_wait(mb, stream);
        if (layer + 1 < kLayers) {
          stream.copy(engine.tokens(mb), engine.result(mb, 0), kTokens[mb] * row_bytes(spec));
          engine.enqueue_push_pull(mb, kTokens[mb], stream);
        }
      }
    for (int mb = 0; mb < spec.micro_batches; ++mb)
      stream.copy(out.data() + (2 * r + mb) * slot, engine.result(mb, 0),
                  kTokens[mb] * row_bytes(spec));
    stream.synchronize(kTimeout);
    DeviceTrips trips = engine.device_trips();
    if (!trips.failures.empty())
      std::cout << fmt::format("replay {}: {} failed: {}", r, trips.failures.size(),
                               trips.failures.front())
                << std::endl;
  }
  int good = 0;
  for (int r = 0; r < replays; ++r) {
    bool same = true;
    for (int mb = 0; mb < spec.micro_batches; ++mb)
      for (uint64_t i = 0; i < kTokens[mb] * row_bytes(spec); ++i)
        same = same &&
               out[(2 * r + mb) * slot + i] == static_cast<uint8_t>(start[mb * slot + i] + kLayers);
    good += same;
  }
  std::cout << fmt::format("replays {} right {}", replays, good) << std::endl;
  engine.finish();
  return 0;
}

int child_main(int argc, char** argv) {
  // --role ROLE --rank RANK --store STORE --out DIR REPLAYS [MODE [AT]]
  if (argc < 10) return 2;
  const std::string role = argv[2];
  EngineSpec spec = test::small_spec(1, 1, TransportKind::ipc);
  spec.rank = std::stoi(argv[4]);
  const int replays = std::stoi(argv[9]);
  const std::string mode = argc > 10 ? argv[10] : "";
  set_log_identity(fmt::format("{}:{}", role, spec.rank));
  try {
    auto store = connect_tcp_store(argv[6], kTimeout);
    if (role == "ffn") {
      spec.role = Role::ffn;
      return run_ffn(spec, *store, replays, mode, argc > 11 ? std::stoi(argv[11]) : -1);
    }
    spec.role = Role::attention;
    return run_attention(spec, *store, replays, mode);
  } catch (const Error& e) {
    std::cout << "error " << status_name(e.status()) << ": " << e.what() << std::endl;
    return 1;
  }
}

// ---- the tests ----

using test::has_line;
using test::joined;

std::vector<std::string> lines_until_exit(ChildProcess& child) {
  return test::lines_until_exit(child, kTimeout * 2);
}

// A thousand replays of four layers of two micro-batches, no host call per layer: every replay's
// answers are the four layers computed here, and the host's calls that would race the device are
// refused by name.
TEST(AfdDeviceTriggerTest, AReplayedStepGetsEveryResultRightAThousandTimes) {
  test::ChildJob job;
  ChildProcess& f = job.instances.start("ffn", 0, {"1000"});
  ChildProcess& a = job.instances.start("attention", 0, {"1000"});
  auto a_lines = lines_until_exit(a);
  EXPECT_EQ(a.wait(kTimeout).exit_code, 0) << joined(a_lines);
  EXPECT_TRUE(has_line(a_lines, "replays 1000 right 1000")) << joined(a_lines);
  EXPECT_FALSE(has_line(a_lines, "failed")) << joined(a_lines);
  EXPECT_TRUE(has_line(a_lines, "push_pull: push_pull: micro-batch 0 is armed for its device"))
      << joined(a_lines);
  EXPECT_TRUE(has_line(a_lines, "arm_device: arm_device: 3 result buffers for 1 ffn instance(s)"))
      << joined(a_lines);
  auto f_lines = lines_until_exit(f);
  EXPECT_EQ(f.wait(kTimeout).exit_code, 0) << joined(f_lines);
  EXPECT_TRUE(has_line(f_lines, "get_batch: get_batch: this F serves its device"))
      << joined(f_lines);
  // 1000 replays x 4 layers x 2 micro-batches answered, then the step the As' end released (its
  // rings have nothing to answer).
  EXPECT_TRUE(has_line(f_lines,
                       "ffn: raised 8000 answered 8000 ended: ffn 0: every attention "
                       "instance left or was lost"))
      << joined(f_lines);
}

// One micro-batch armed with three layouts, rung in turn 200 times: each ring sends the layout it
// names, from and into its own buffer; an unarmed or out-of-range layout is refused by name.
TEST(AfdDeviceTriggerTest, EachRingSendsTheLayoutItNames) {
  test::ChildJob job;
  ChildProcess& f = job.instances.start("ffn", 0, {"600", "one-mb"});
  ChildProcess& a = job.instances.start("attention", 0, {"200", "layouts"});
  auto a_lines = lines_until_exit(a);
  EXPECT_EQ(a.wait(kTimeout).exit_code, 0) << joined(a_lines);
  EXPECT_TRUE(has_line(a_lines, "layouts right 3 of 3; rung 600 completed 600 failed 0"))
      << joined(a_lines);
  EXPECT_TRUE(has_line(a_lines,
                       "enqueue_push_pull: enqueue_push_pull: micro-batch 0 is not armed "
                       "with layout 3 (arm_device)"))
      << joined(a_lines);
  EXPECT_TRUE(has_line(a_lines,
                       "enqueue_push_pull: enqueue_push_pull: micro-batch 0 is not armed "
                       "with layout 64"))
      << joined(a_lines);
  EXPECT_TRUE(has_line(a_lines, "arm_device: arm_device: layout 64 (0..63)")) << joined(a_lines);
  auto f_lines = lines_until_exit(f);
  EXPECT_EQ(f.wait(kTimeout).exit_code, 0) << joined(f_lines);
}

// The F dies in replay 5: that replay and every later one fail naming it, no stream hangs, and the
// replays before were right.
TEST(AfdDeviceTriggerTest, AnFfnKilledWhileAReplayWaitsReleasesTheStreamNamingIt) {
  test::ChildJob job;
  ChildProcess& f = job.instances.start("ffn", 0, {"20", "die-at", "5"});
  ChildProcess& a = job.instances.start("attention", 0, {"20"});
  auto lines = lines_until_exit(a);
  EXPECT_EQ(a.wait(kTimeout).exit_code, 0) << joined(lines);
  EXPECT_TRUE(has_line(lines, "replay 5: ")) << joined(lines);
  EXPECT_TRUE(has_line(lines, "): ffn 0 lost: ")) << joined(lines);
  EXPECT_TRUE(has_line(lines,
                       "replay 6: 8 failed: micro-batch 0: not sent: attention 0: push_pull "
                       "of micro-batch 0: ffn 0 lost: "))
      << joined(lines);
  EXPECT_FALSE(has_line(lines, "replay 4: ")) << joined(lines);
  EXPECT_TRUE(has_line(lines, "replay 19: ")) << joined(lines);
  EXPECT_TRUE(has_line(lines, "replays 20 right 5")) << joined(lines);
  EXPECT_EQ(f.wait(kTimeout).signal, SIGKILL);
}

// An F that never answers: the A's finish() lets its waiting stream go and says the round trip
// failed because the engine was finished.
TEST(AfdDeviceTriggerTest, FinishReleasesAStreamThatWaits) {
  test::ChildJob job;
  ChildProcess& f = job.instances.start("ffn", 0, {"0", "idle"});
  ChildProcess& a = job.instances.start("attention", 0, {"0", "finish"});
  auto lines = lines_until_exit(a);
  EXPECT_EQ(a.wait(kTimeout).exit_code, 0) << joined(lines);
  EXPECT_TRUE(has_line(lines, "stream ready before finish: 0")) << joined(lines);
  EXPECT_TRUE(has_line(lines,
                       "after finish: rung 1 failed 1: micro-batch 0 (sequence 1): "
                       "attention 0 was finished"))
      << joined(lines);
  EXPECT_EQ(f.wait(kTimeout).exit_code, 0);
}

}  // namespace
}  // namespace hetmesh::afd

int main(int argc, char** argv) {
  if (argc > 2 && std::strcmp(argv[1], "--role") == 0) return hetmesh::afd::child_main(argc, argv);
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
