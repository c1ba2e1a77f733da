// What a push carries and where it lands, with real processes over each transport: extra A2F
// tensors of their own row sizes (router logits, scales) and no routing (top_k = 0), a tensor left
// out of a push (a dense layer's router logits), As that push at agreed row offsets so that the F
// sees one packed batch, an F that receives a micro-batch into a buffer of its own, the refusals
// of pushes that do not fit, and As whose rows overlap a part the F still holds.
#include "child_job.hpp"
#include "small_engine_job.hpp"
#include "verbs_support.hpp"

#include <hetmesh/afd/engine.hpp>
#include <hetmesh/core/log.hpp>
#include <hetmesh/core/subprocess.hpp>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstring>
#include <iostream>

namespace hetmesh::afd {
namespace {

using test::has_line;
using test::joined;

constexpr auto kTimeout = test::kSmallJobTimeout;
constexpr int kAttention = 3;
constexpr int kSteps = 6;
// Tokens of each A per step: every A knows them all (as a framework's step metadata says), so
// each pushes at the sum of the rows of the As before it.
constexpr uint32_t kCounts[kSteps][kAttention] = {{8, 3, 5}, {0, 8, 1}, {2, 2, 2},
                                                  {8, 8, 8}, {1, 0, 7}, {5, 6, 0}};
constexpr int kLogits = 2, kScales = 3;  // the extra tensors' indices

// 3 As, 1 F; no routing; router logits of 6 bytes a row (odd: no alignment is assumed) and
// scales of 4.
EngineSpec tensors_spec(TransportKind kind) {
  EngineSpec spec = test::small_spec(kAttention, 1, kind);
  spec.gather_window = kTimeout;  // whole batches only, however late an A starts
  spec.hidden = 16;
  spec.top_k = 0;
  spec.a2f_extra = {{"router_logits", 6}, {"scales", 4}};
  return spec;
}

uint32_t offset_of(int step, int a) {
  uint32_t offset = 0;
  for (int b = 0; b < a; ++b)
    offset += kCounts[step][b];
  return offset;
}

// Byte i of row r of tensor t that A a sends at `step`.
uint8_t sent_byte(int t, int a, int step, uint64_t r, uint64_t i) {
  return static_cast<uint8_t>(t * 64 + a * 31 + step * 7 + r * 3 + i);
}

// Router logits travel on odd steps only (the MoE layers); scales always.
bool logits_at(int step) {
  return step % 2 == 1;
}

// F: every batch packed (the As' rows back to back, every tensor in one buffer), each byte what
// its A sent; the answer out = tokens + 1, computed over the whole batch at once. Micro-batch 0
// lands in a buffer of the F's own from its second push on (told after the first answer).
int run_ffn(const EngineSpec& spec, KeyValueStore& store) {
  Device device = PluginRegistry::load().device("cpu:0");
  FfnEngine engine(spec, device, store);
  std::vector<uint8_t> own(spec.ffn_rows(spec.rank) * spec.a2f_row_bytes(kTokensTensor));
  int right = 0, landed = 0;
  uint64_t landed_bytes = 0;  // of the tokens of every part in the F's buffer
  std::string wrong;
  while (auto batch = engine.get_batch(kTimeout)) {
    const int step = static_cast<int>(batch->parts.at(0).tag);
    uint32_t total = 0;
    for (uint32_t n : kCounts[step])
      total += n;
    bool ok = batch->packed && batch->packed_rows == total && batch->parts.size() == kAttention;
    if (!ok) wrong += fmt::format(" step {}: packed {} rows {};", step, batch->packed, total);
    for (const Batch::FromAttention& part : batch->parts) {
      const uint32_t n = kCounts[step][part.rank];
      ok &= part.row_offset == offset_of(step, part.rank) && part.tokens == n &&
            part.routing_data() == nullptr && part.rows[kLogits] == (logits_at(step) ? n : 0) &&
            part.rows[kScales] == n;
      const bool in_own = part.tokens_data() == own.data() + uint64_t{part.row_offset} * 32;
      const auto* row_space =
          static_cast<uint8_t*>(engine.inputs(batch->micro_batch, kTokensTensor));
      ok &= in_own || part.tokens_data() == row_space + uint64_t{part.row_offset} * 32;
      landed += in_own && batch->micro_batch == 0 && part.sequence >= 2;
      landed_bytes += in_own ? uint64_t{part.tokens} * 32 : 0;
      for (int t : {int{kTokensTensor}, kLogits, kScales}) {
        // Through the batch's first part: the rows of every A follow each other.
        const auto* rows = static_cast<const uint8_t*>(batch->parts[0].inputs[t]);
        const uint64_t row_bytes = spec.a2f_row_bytes(t);
        for (uint64_t r = 0; r < part.rows[t]; ++r)
          for (uint64_t i = 0; i < row_bytes; ++i)
            ok &=
                rows[(part.row_offset + r) * row_bytes + i] == sent_byte(t, part.rank, step, r, i);
      }
    }
    const auto* in = static_cast<const uint8_t*>(batch->parts[0].tokens_data());
    auto* out = static_cast<uint8_t*>(batch->parts[0].output);
    for (uint64_t i = 0; i < uint64_t{total} * spec.f2a_bytes_per_token(); ++i)
      out[i] = static_cast<uint8_t>(in[i] + 1);
    right += ok;
    engine.respond(*batch);
    // After the first answer: each A hears of the buffer before its next answer, so from its
    // next push of micro-batch 0 on (step 2), never in the middle of a step.
    if (step == 0) engine.receive_into(0, kTokensTensor, own.data(), own.size());
  }
  DataCounters c = engine.counters();
  std::cout << fmt::format(
                   "batches right {}/{}; landed in its own buffer {}; caller bytes {}{}", right,
                   kSteps, landed,
                   c.caller_bytes == landed_bytes ? "right" : std::to_string(c.caller_bytes), wrong)
            << std::endl;
  engine.finish();
  return 0;
}

int run_attention(const EngineSpec& spec, KeyValueStore& store) {
  Device device = PluginRegistry::load().device("cpu:0");
  AttentionEngine engine(spec, device, store);
  const int a = spec.rank;
  int right = 0;
  for (int step = 0; step < kSteps; ++step) {
    const int mb = step % spec.micro_batches;
    const uint32_t n = kCounts[step][a];
    for (int t : {int{kTokensTensor}, kLogits, kScales}) {
      auto* slot = static_cast<uint8_t*>(engine.tensor(mb, t));
      for (uint64_t r = 0; r < n; ++r)
        for (uint64_t i = 0; i < spec.a2f_row_bytes(t); ++i)
          slot[r * spec.a2f_row_bytes(t) + i] = sent_byte(t, a, step, r, i);
    }
    PushTensor tensors[4] = {};
    tensors[kLogits].rows = logits_at(step) ? n : 0;
    PushOptions push;
    push.tag = static_cast<uint64_t>(step);
    push.tensors = tensors;
    push.row_offset = offset_of(step, a);
    engine.wait(engine.push_pull(mb, n, push), kTimeout);
    bool ok = true;
    const auto* result = static_cast<const uint8_t*>(engine.result(mb, 0));
    for (uint64_t i = 0; i < uint64_t{n} * spec.f2a_bytes_per_token(); ++i)
      ok &=
          result[i] == static_cast<uint8_t>(sent_byte(kTokensTensor, a, step, i / 32, i % 32) + 1);
    right += ok;
  }
  std::cout << fmt::format("answers right {}/{}", right, kSteps) << std::endl;
  // Pushes that do not fit are refused by name, and nothing is sent.
  auto refused = [&](const char* what, uint32_t tokens, const PushOptions& push) {
    try {
      engine.push_pull(0, tokens, push);
      std::cout << what << ": accepted" << std::endl;
    } catch (const Error& e) {
      std::cout << what << ": " << status_name(e.status()) << ": " << e.what() << std::endl;
    }
  };
  PushOptions past_end;
  past_end.row_offset = 20;
  refused("past the row spaces", 5, past_end);
  PushTensor with_routing[4] = {};
  with_routing[kRoutingTensor].rows = 2;
  PushOptions routing;
  routing.tensors = with_routing;
  refused("routing without top_k", 2, routing);
  PushTensor two[2] = {};
  PushOptions too_few;
  too_few.tensors = two;
  refused("two tensors of four", 2, too_few);
  PushTensor more_logits[4] = {};
  more_logits[kLogits].rows = 9;
  PushOptions logits;
  logits.tensors = more_logits;
  refused("nine rows of logits", 2, logits);
  engine.finish();
  return 0;
}

// Two As, one F: A 0's part, served alone after the gather window, is held while A 1 pushes
// over its rows.
int run_overlap_ffn(const EngineSpec& spec, KeyValueStore& store) {
  Device device = PluginRegistry::load().device("cpu:0");
  FfnEngine engine(spec, device, store);
  auto held = engine.get_batch(kTimeout);
  std::cout << "holding attention " << held->parts.at(0).rank << std::endl;
  engine.send_message(1, std::vector<uint8_t>{'g', 'o'});
  try {
    engine.get_batch(kTimeout);
    std::cout << "served it" << std::endl;
  } catch (const Error& e) {
    std::cout << "error " << status_name(e.status()) << ": " << e.what() << std::endl;
  }
  return 0;
}

int run_overlap_attention(const EngineSpec& spec, KeyValueStore& store) {
  Device device = PluginRegistry::load().device("cpu:0");
  AttentionEngine engine(spec, device, store);
  PushOptions push;
  if (spec.rank == 1) {
    engine.receive_message(kTimeout);  // A 0's part is held now
    push.row_offset = 4;               // rows 4..12, over A 0's 0..8
  }
  try {
    engine.wait(engine.push_pull(0, spec.tokens, push), kTimeout);
    std::cout << "answered" << std::endl;
  } catch (const Error& e) {
    std::cout << "error " << status_name(e.status()) << ": " << e.what() << std::endl;
  }
  return 0;
}

int child_main(int argc, char** argv) {
  // --role ROLE --rank RANK --store STORE --out DIR TRANSPORT CASE
  if (argc < 11) return 2;
  const std::string role = argv[2];
  const bool overlap = std::string(argv[10]) == "overlap";
  EngineSpec spec = overlap ? test::small_spec(2, 1, parse_transport_kind(argv[9]))
                            : tensors_spec(parse_transport_kind(argv[9]));
  if (overlap) {  // A 0's part goes out alone once it waited a millisecond for A 1's
    spec.gather_window = std::chrono::milliseconds(1);
    spec.micro_batches = 1;
  }
  spec.rank = std::stoi(argv[4]);
  set_log_identity(fmt::format("{}:{}", role, spec.rank));
  try {
    auto store = connect_tcp_store(argv[6], kTimeout);
    if (role == "ffn") {
      spec.role = Role::ffn;
      return overlap ? run_overlap_ffn(spec, *store) : run_ffn(spec, *store);
    }
    spec.role = Role::attention;
    return overlap ? run_overlap_attention(spec, *store) : run_attention(spec, *store);
  } catch (const Error& e) {
    std::cout << "error " << status_name(e.status()) << ": " << e.what() << std::endl;
    return 1;
  }
}

class AfdTensorsTest : public testing::TestWithParam<TransportKind> {};

TEST_P(AfdTensorsTest, ExtraTensorsTravelPackedAndLandWhereTheFfnSays) {
  HETMESH_SKIP_UNLESS_USABLE(GetParam());
  test::ChildJob job;
  const std::string kind = to_string(GetParam());
  ChildProcess& f = job.instances.start("ffn", 0, {kind, "tensors"});
  std::vector<ChildProcess*> as;
  for (int a = 0; a < kAttention; ++a)
    as.push_back(&job.instances.start("attention", a, {kind, "tensors"}));
  for (int a = 0; a < kAttention; ++a) {
    ChildProcess& child = *as[static_cast<size_t>(a)];
    auto lines = test::lines_until_exit(child, kTimeout * 2);
    EXPECT_EQ(child.wait(kTimeout).exit_code, 0) << joined(lines);
    EXPECT_TRUE(has_line(lines, fmt::format("answers right {}/{}", kSteps, kSteps)))
        << joined(lines);
    if (a != 0) continue;
    EXPECT_TRUE(has_line(lines,
                         "past the row spaces: HM_ERR_INVALID_ARGUMENT: push_pull: rows 20..25 at "
                         "row_offset 20: ffn 0's row spaces of a micro-batch hold 24 rows (3 As x "
                         "8 tokens)"))
        << joined(lines);
    EXPECT_TRUE(has_line(lines,
                         "routing without top_k: HM_ERR_INVALID_ARGUMENT: push_pull: 2 rows of "
                         "routing (the job has none: top_k is 0)"))
        << joined(lines);
    EXPECT_TRUE(has_line(lines,
                         "two tensors of four: HM_ERR_INVALID_ARGUMENT: push_pull: 2 tensors for "
                         "the job's 4 (tokens, routing, then its extra tensors: one each)"))
        << joined(lines);
    EXPECT_TRUE(has_line(lines,
                         "nine rows of logits: HM_ERR_INVALID_ARGUMENT: push_pull: 9 rows of "
                         "router_logits (0..8)"))
        << joined(lines);
  }
  // Micro-batch 0's pushes after its first (steps 2 and 4, 3 As each) landed in the F's own
  // buffer; the counters count exactly their tokens as the application's bytes.
  auto lines = test::lines_until_exit(f, kTimeout);
  EXPECT_EQ(f.wait(kTimeout).exit_code, 0) << joined(lines);
  EXPECT_TRUE(has_line(
      lines, fmt::format("batches right {}/{}; landed in its own buffer 6; caller bytes right",
                         kSteps, kSteps)))
      << joined(lines);
}

INSTANTIATE_TEST_SUITE_P(Transports, AfdTensorsTest,
                         testing::Values(TransportKind::ipc, TransportKind::tcp,
                                         TransportKind::verbs),
                         [](const testing::TestParamInfo<TransportKind>& p) {
                           return std::string(to_string(p.param));
                         });

// An A whose rows land over a part the F still holds: the bytes are there before the header, so
// the F cannot refuse them; it fails saying which As and rows, rather than compute over them.
TEST(AfdTensorsOverlap, RowsOverAPartTheFfnHoldsAreAProtocolErrorNamingBoth) {
  test::ChildJob job;
  ChildProcess& f = job.instances.start("ffn", 0, {"ipc", "overlap"});
  ChildProcess& a0 = job.instances.start("attention", 0, {"ipc", "overlap"});
  ChildProcess& a1 = job.instances.start("attention", 1, {"ipc", "overlap"});
  auto lines = test::lines_until_exit(f, kTimeout * 2);
  EXPECT_EQ(f.wait(kTimeout).exit_code, 0) << joined(lines);
  EXPECT_TRUE(has_line(lines, "holding attention 0")) << joined(lines);
  EXPECT_TRUE(has_line(lines,
                       "error PROTOCOL_ERROR: attention 1 pushed micro-batch 0 at rows 4..12, "
                       "over the rows 0..8 of attention 0's part that this F still holds"))
      << joined(lines);
  // Both As end by themselves, each told its F is gone.
  for (ChildProcess* a : {&a0, &a1}) {
    auto a_lines = test::lines_until_exit(*a, kTimeout * 2);
    EXPECT_EQ(a->wait(kTimeout).exit_code, 0) << joined(a_lines);
    EXPECT_TRUE(has_line(a_lines, "error PEER_LOST")) << joined(a_lines);
  }
}

}  // namespace
}  // namespace hetmesh::afd

int main(int argc, char** argv) {
  if (argc > 2 && std::strcmp(argv[1], "--role") == 0) return hetmesh::afd::child_main(argc, argv);
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
