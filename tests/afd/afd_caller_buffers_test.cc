// The application's own buffers in place of the engine's slots, vLLM's A-to-F mapping and an
// explicit map, with
// real processes over each transport: an A sends from its tensors and receives each F's answer into
// its own, an F responds from a buffer of its own, each registered once at first sight (row slices
// of varying length find that registration), and the counters say no byte went through a slot.
#include "child_job.hpp"
#include "small_engine_job.hpp"
#include "verbs_support.hpp"

#include <hetmesh/afd/engine.hpp>
#include <hetmesh/core/log.hpp>
#include <hetmesh/core/subprocess.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <cstring>
#include <iostream>
#include <set>

namespace hetmesh::afd {
namespace {

using test::has_line;
using test::joined;

constexpr auto kTimeout = test::kSmallJobTimeout;
constexpr int kSteps = 6;
constexpr uint32_t kRows[kSteps] = {8, 3, 8, 1, 5, 8};  // tokens per step: row slices
// Rows of each step's answers (PushOptions::result_rows): the first rows of the F's output, as an
// F that returns a shard would; 0 is an answer of the header alone.
constexpr uint32_t kAnswerRows[kSteps] = {8, 1, 4, 1, 0, 8};

uint64_t sum(const uint32_t (&rows)[kSteps]) {
  uint64_t total = 0;
  for (uint32_t r : rows)
    total += r;
  return total;
}

uint8_t token_byte(int step, uint64_t i) {
  return static_cast<uint8_t>(i * 7 + step);
}

// F answers out[i] = in[i] + rank + 1, from its slot (F 0) or from a buffer of its own (F 1), and
// checks that the routing came whole: expert = row, weight = step.
int run_ffn(const EngineSpec& spec, KeyValueStore& store) {
  Device device = PluginRegistry::load().device("cpu:0");
  FfnEngine engine(spec, device, store);
  std::vector<uint8_t> own(uint64_t{spec.tokens} * spec.hidden * spec.f2a_bytes);
  bool routing_whole = true;
  while (auto batch = engine.get_batch(kTimeout)) {
    for (auto& part : batch->parts) {
      if (spec.rank == 1) part.output = own.data();
      test::answer_plus_rank(spec, part);
      const auto* routing = static_cast<const int32_t*>(part.routing_data());
      for (uint32_t t = 0; t < part.tokens; ++t) {
        float weight;
        std::memcpy(&weight, &routing[t * 2 * spec.top_k + 1], 4);
        routing_whole &= routing[t * 2 * spec.top_k] == static_cast<int32_t>(t) &&
                         weight == static_cast<float>(part.tag);
      }
    }
    engine.respond(*batch);
  }
  DataCounters c = engine.counters();
  std::cout << fmt::format("routing {}; caller bytes {}, slot bytes {}, buffers {}",
                           routing_whole ? "whole" : "damaged", c.caller_bytes, c.slot_bytes,
                           c.caller_buffers)
            << std::endl;
  engine.finish();
  return 0;
}

// Sends each step's tokens from a plain host vector and its routing from a row slice of a larger
// device buffer, and takes both Fs' answers (kAnswerRows rows) into two halves of one device
// buffer of its own, nothing past them written; the engine's own result slots must stay as they
// were.
int run_attention(const EngineSpec& spec, KeyValueStore& store) {
  Device device = PluginRegistry::load().device("cpu:0");
  AttentionEngine engine(spec, device, store);
  const uint64_t row_in = uint64_t{spec.hidden} * spec.a2f_bytes;
  const uint64_t row_out = uint64_t{spec.hidden} * spec.f2a_bytes;
  const uint64_t row_routing = spec.routing_bytes_per_token();
  std::vector<uint8_t> tokens(spec.tokens * row_in);
  Buffer routing_store = device.allocate(4096 + spec.tokens * row_routing);
  auto* routing = static_cast<uint8_t*>(routing_store.data()) + 4096;
  Buffer results = device.allocate(2 * spec.tokens * row_out);
  void* into[2] = {results.data(), static_cast<uint8_t*>(results.data()) + spec.tokens * row_out};
  for (int mb = 0; mb < spec.micro_batches; ++mb)
    for (int f = 0; f < spec.ffn; ++f)
      std::memset(engine.result(mb, f), 0xee, spec.tokens * row_out);
  int good = 0;
  for (int step = 0; step < kSteps; ++step) {
    const uint32_t rows = kRows[step];
    for (uint64_t i = 0; i < rows * row_in; ++i)
      tokens[i] = token_byte(step, i);
    for (uint32_t t = 0; t < rows; ++t)
      for (uint32_t k = 0; k < spec.top_k; ++k) {
        const int32_t expert = static_cast<int32_t>(t);
        const auto weight = static_cast<float>(step);
        std::memcpy(routing + t * row_routing + k * 8, &expert, 4);
        std::memcpy(routing + t * row_routing + k * 8 + 4, &weight, 4);
      }
    std::memset(results.data(), 0xee, results.size());
    PushOptions push;
    push.tag = static_cast<uint64_t>(step);
    push.result_rows = kAnswerRows[step];
    const PushTensor from[] = {{tokens.data()}, {routing}};
    push.tensors = from;
    push.results_into = into;
    engine.wait(engine.push_pull(step % spec.micro_batches, rows, push), kTimeout);
    bool right = true;
    for (int f = 0; f < spec.ffn; ++f)
      for (uint64_t i = 0; i < spec.tokens * row_out; ++i)
        right &=
            static_cast<const uint8_t*>(into[f])[i] ==
            (i < kAnswerRows[step] * row_out ? static_cast<uint8_t>(token_byte(step, i) + f + 1)
                                             : 0xee);
    good += right;
  }
  bool slots_untouched = true;
  for (int mb = 0; mb < spec.micro_batches; ++mb)
    for (int f = 0; f < spec.ffn; ++f)
      for (uint64_t i = 0; i < spec.tokens * row_out; ++i)
        slots_untouched &= static_cast<const uint8_t*>(engine.result(mb, f))[i] == 0xee;
  DataCounters c = engine.counters();
  std::cout << fmt::format("steps right {}/{}; result slots {}", good, kSteps,
                           slots_untouched ? "untouched" : "written")
            << std::endl;
  std::cout << fmt::format("caller bytes {}, slot bytes {}, buffers {}", c.caller_bytes,
                           c.slot_bytes, c.caller_buffers)
            << std::endl;
  // Buffers it cannot use are refused by name, and nothing is sent.
  auto refused = [&](const char* what, const PushOptions& push, uint32_t rows) {
    try {
      engine.push_pull(0, rows, push);
      std::cout << what << ": accepted" << std::endl;
    } catch (const Error& e) {
      std::cout << what << ": " << status_name(e.status()) << ": " << e.what() << std::endl;
    }
  };
  PushOptions one_for_two;
  one_for_two.results_into = std::span<void* const>(into, 1);
  refused("one buffer for two", one_for_two, spec.tokens);
  Buffer small = device.allocate(row_in);
  PushOptions past_end;
  const PushTensor small_tokens[] = {{small.data()}, {}};
  past_end.tensors = small_tokens;
  refused("past the end", past_end, 2);
  engine.finish();
  return 0;
}

// vLLM's mapping (JobTopology::groups, 4A2F): F k serves As 2k and 2k+1 alone and answers their
// full result, in + k + 1, which lands in the A's own buffer; it says which As it served.
int run_group_ffn(const EngineSpec& spec, KeyValueStore& store) {
  Device device = PluginRegistry::load().device("cpu:0");
  FfnEngine engine(spec, device, store);
  std::set<int> served;
  while (auto batch = engine.get_batch(kTimeout)) {
    for (const auto& part : batch->parts) {
      served.insert(part.rank);
      test::answer_plus_rank(spec, part);
    }
    engine.respond(*batch);
  }
  uint64_t row_spaces = 0;
  for (const auto& [name, bytes] : engine.registered())
    if (name == "a2f_receive") row_spaces = bytes;
  int windows = 0;  // of the As its row spaces hold
  while (windows < spec.attention &&
         spec.micro_batches * spec.a2f_block_bytes(uint64_t{spec.tokens} * windows) != row_spaces)
    ++windows;
  std::cout << fmt::format("served attention {}; row spaces of {} As", fmt::join(served, ","),
                           windows)
            << std::endl;
  engine.finish();
  return 0;
}

int run_group_attention(const EngineSpec& spec, KeyValueStore& store) {
  Device device = PluginRegistry::load().device("cpu:0");
  AttentionEngine engine(spec, device, store);
  const uint64_t bytes = uint64_t{spec.tokens} * spec.hidden * spec.a2f_bytes;
  std::vector<uint8_t> x(bytes);
  std::vector<void*> into(static_cast<size_t>(spec.ffn), nullptr);
  const int mine = spec.rank / (spec.attention / spec.ffn);
  into[static_cast<size_t>(mine)] = x.data();  // its F's answer, in place; the other F: none
  int good = 0;
  for (int step = 0; step < 4; ++step) {
    for (uint64_t i = 0; i < bytes; ++i)
      x[i] = token_byte(step + spec.rank, i);
    PushOptions push;
    const PushTensor from[] = {{x.data()}, {}};
    push.tensors = from;
    push.results_into = into;
    engine.wait(engine.push_pull(step % spec.micro_batches, spec.tokens, push), kTimeout);
    bool right = true;
    for (uint64_t i = 0; i < bytes; ++i)
      right &= x[i] == static_cast<uint8_t>(token_byte(step + spec.rank, i) + mine + 1);
    good += right;
  }
  std::cout << fmt::format("attention {}: {}/4 answered by ffn {} alone", spec.rank, good, mine)
            << std::endl;
  engine.finish();
  return 0;
}

// An explicit map (JobTopology::map, 3A2F: A 0 to F 0, A 1 to both, A 2 to F 1): each A gets an
// answer from each of its Fs alone, in its result slot for that F.
int run_map_attention(const EngineSpec& spec, KeyValueStore& store) {
  Device device = PluginRegistry::load().device("cpu:0");
  AttentionEngine engine(spec, device, store);
  const uint64_t bytes = uint64_t{spec.tokens} * spec.hidden * spec.a2f_bytes;
  const std::vector<int>& mine = spec.ffns_of[static_cast<size_t>(spec.rank)];
  int good = 0;
  for (int step = 0; step < 4; ++step) {
    const int mb = step % spec.micro_batches;
    auto* x = static_cast<uint8_t*>(engine.tokens(mb));
    for (uint64_t i = 0; i < bytes; ++i)
      x[i] = token_byte(step + spec.rank, i);
    engine.wait(engine.push_pull(mb, spec.tokens), kTimeout);
    bool right = true;
    for (int f : mine) {
      const auto* answer = static_cast<const uint8_t*>(engine.result(mb, f));
      for (uint64_t i = 0; i < bytes; ++i)
        right &= answer[i] == static_cast<uint8_t>(token_byte(step + spec.rank, i) + f + 1);
    }
    good += right;
  }
  std::cout << fmt::format("attention {}: {}/4 answered by ffn {}", spec.rank, good,
                           fmt::join(mine, ","))
            << std::endl;
  engine.finish();
  return 0;
}

int child_main(int argc, char** argv) {
  // --role ROLE --rank RANK --store STORE --out DIR TRANSPORT [groups]
  if (argc < 10) return 2;
  const std::string role = argv[2];
  EngineSpec spec = test::small_spec(1, 2, parse_transport_kind(argv[9]));
  spec.rank = std::stoi(argv[4]);
  const bool groups = argc > 10 && std::string(argv[10]) == "groups";
  const bool map = argc > 10 && std::string(argv[10]) == "map";
  if (groups) {
    spec.attention = 4;
    spec.topology = JobTopology::groups;
  }
  if (map) {
    spec.attention = 3;
    spec.topology = JobTopology::map;
    spec.ffns_of = {{0}, {0, 1}, {1}};
  }
  set_log_identity(fmt::format("{}:{}", role, spec.rank));
  try {
    auto store = connect_tcp_store(argv[6], kTimeout);
    if (role == "ffn") {
      spec.role = Role::ffn;
      return groups || map ? run_group_ffn(spec, *store) : run_ffn(spec, *store);
    }
    spec.role = Role::attention;
    if (map) return run_map_attention(spec, *store);
    return groups ? run_group_attention(spec, *store) : run_attention(spec, *store);
  } catch (const Error& e) {
    std::cout << "error " << status_name(e.status()) << ": " << e.what() << std::endl;
    return 1;
  }
}

class AfdCallerBuffersTest : public testing::TestWithParam<TransportKind> {};

TEST_P(AfdCallerBuffersTest, TheApplicationsOwnBuffersTravelInPlace) {
  HETMESH_SKIP_UNLESS_USABLE(GetParam());
  test::ChildJob job;
  const std::string kind = to_string(GetParam());
  ChildProcess& f0 = job.instances.start("ffn", 0, {kind});
  ChildProcess& f1 = job.instances.start("ffn", 1, {kind});
  ChildProcess& a = job.instances.start("attention", 0, {kind});
  auto lines = test::lines_until_exit(a, kTimeout * 2);
  EXPECT_EQ(a.wait(kTimeout).exit_code, 0) << joined(lines);
  EXPECT_TRUE(
      has_line(lines, fmt::format("steps right {}/{}; result slots untouched", kSteps, kSteps)))
      << joined(lines);
  // Every byte sent came from the application's buffers and every answer went into them: tokens
  // and routing to both Fs, answers from both. Three allocations, each registered once.
  const EngineSpec spec = test::small_spec(1, 2, GetParam());
  const uint64_t rows = sum(kRows), answer_rows = sum(kAnswerRows);
  const uint64_t sent = rows * spec.a2f_bytes_per_token() * spec.ffn;
  const uint64_t received = answer_rows * spec.hidden * spec.f2a_bytes * spec.ffn;
  EXPECT_TRUE(
      has_line(lines, fmt::format("caller bytes {}, slot bytes 0, buffers 3", sent + received)))
      << joined(lines);
  EXPECT_TRUE(has_line(lines,
                       "one buffer for two: HM_ERR_INVALID_ARGUMENT: push_pull: 1 result "
                       "buffers for 2 ffn instance(s)"))
      << joined(lines);
  EXPECT_TRUE(has_line(lines,
                       "past the end: HM_ERR_INVALID_ARGUMENT: attention 0: push_pull's "
                       "tokens"))
      << joined(lines);
  EXPECT_TRUE(has_line(lines, "runs past the end of its allocation")) << joined(lines);
  // F 0 answered from its slot, F 1 from its own buffer (one registration).
  const uint64_t answered = answer_rows * spec.hidden * spec.f2a_bytes;
  const uint64_t got = rows * spec.a2f_bytes_per_token();
  auto f0_lines = test::lines_until_exit(f0, kTimeout);
  EXPECT_EQ(f0.wait(kTimeout).exit_code, 0) << joined(f0_lines);
  EXPECT_TRUE(has_line(f0_lines, fmt::format("routing whole; caller bytes 0, slot bytes {}, "
                                             "buffers 0",
                                             got + answered)))
      << joined(f0_lines);
  auto f1_lines = test::lines_until_exit(f1, kTimeout);
  EXPECT_EQ(f1.wait(kTimeout).exit_code, 0) << joined(f1_lines);
  EXPECT_TRUE(has_line(f1_lines, fmt::format("routing whole; caller bytes {}, slot bytes {}, "
                                             "buffers 1",
                                             answered, got)))
      << joined(f1_lines);
}

// Each A sends only to its F, which answers the full result into the A's own buffer, and each F
// is sent only its As' parts.
TEST(AfdTopologyTest, GroupsSendEachAttentionToItsFfnAlone) {
  test::ChildJob job;
  ChildProcess& f0 = job.instances.start("ffn", 0, {"ipc", "groups"});
  ChildProcess& f1 = job.instances.start("ffn", 1, {"ipc", "groups"});
  std::vector<ChildProcess*> as;
  for (int a = 0; a < 4; ++a)
    as.push_back(&job.instances.start("attention", a, {"ipc", "groups"}));
  for (int a = 0; a < 4; ++a) {
    auto lines = test::lines_until_exit(*as[static_cast<size_t>(a)], kTimeout * 2);
    EXPECT_EQ(as[static_cast<size_t>(a)]->wait(kTimeout).exit_code, 0) << joined(lines);
    EXPECT_TRUE(
        has_line(lines, fmt::format("attention {}: 4/4 answered by ffn {} alone", a, a / 2)))
        << joined(lines);
  }
  auto f0_lines = test::lines_until_exit(f0, kTimeout);
  EXPECT_EQ(f0.wait(kTimeout).exit_code, 0) << joined(f0_lines);
  EXPECT_TRUE(has_line(f0_lines, "served attention 0,1; row spaces of 2 As")) << joined(f0_lines);
  auto f1_lines = test::lines_until_exit(f1, kTimeout);
  EXPECT_EQ(f1.wait(kTimeout).exit_code, 0) << joined(f1_lines);
  EXPECT_TRUE(has_line(f1_lines, "served attention 2,3; row spaces of 2 As")) << joined(f1_lines);
}

// An explicit map: each A sends to the Fs it names and gets each one's answer; each F is sent only
// the parts of the As that name it, and holds rows for those alone.
TEST(AfdTopologyTest, AMapSendsEachAttentionToTheFfnsItNames) {
  test::ChildJob job;
  ChildProcess& f0 = job.instances.start("ffn", 0, {"ipc", "map"});
  ChildProcess& f1 = job.instances.start("ffn", 1, {"ipc", "map"});
  std::vector<ChildProcess*> as;
  for (int a = 0; a < 3; ++a)
    as.push_back(&job.instances.start("attention", a, {"ipc", "map"}));
  const char* expected[] = {"attention 0: 4/4 answered by ffn 0",
                            "attention 1: 4/4 answered by ffn 0,1",
                            "attention 2: 4/4 answered by ffn 1"};
  for (int a = 0; a < 3; ++a) {
    auto lines = test::lines_until_exit(*as[static_cast<size_t>(a)], kTimeout * 2);
    EXPECT_EQ(as[static_cast<size_t>(a)]->wait(kTimeout).exit_code, 0) << joined(lines);
    EXPECT_TRUE(has_line(lines, expected[a])) << joined(lines);
  }
  auto f0_lines = test::lines_until_exit(f0, kTimeout);
  EXPECT_EQ(f0.wait(kTimeout).exit_code, 0) << joined(f0_lines);
  EXPECT_TRUE(has_line(f0_lines, "served attention 0,1; row spaces of 2 As")) << joined(f0_lines);
  auto f1_lines = test::lines_until_exit(f1, kTimeout);
  EXPECT_EQ(f1.wait(kTimeout).exit_code, 0) << joined(f1_lines);
  EXPECT_TRUE(has_line(f1_lines, "served attention 1,2; row spaces of 2 As")) << joined(f1_lines);
}

INSTANTIATE_TEST_SUITE_P(Transports, AfdCallerBuffersTest,
                         testing::Values(TransportKind::ipc, TransportKind::tcp,
                                         TransportKind::verbs),
                         [](const testing::TestParamInfo<TransportKind>& p) {
                           return std::string(to_string(p.param));
                         });

}  // namespace
}  // namespace hetmesh::afd

int main(int argc, char** argv) {
  if (argc > 2 && std::strcmp(argv[1], "--role") == 0) return hetmesh::afd::child_main(argc, argv);
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
