// The wire header's bounds check (afd/src/wire.hpp) against hostile headers: rows past a tensor's
// window or the F's row spaces, counts that do not add up to the payload, a sender of another
// shape or incarnation; and the engine spec's slot arithmetic throws instead of wrapping.
#include "wire.hpp"

#include <hetmesh/afd/engine.hpp>

#include <gtest/gtest.h>

#include <limits>

namespace hetmesh::afd {
namespace {

// The receiver's job: 2 As, StepMesh's per-A shape, router logits beside the routing.
EngineSpec receiver() {
  EngineSpec spec;
  spec.role = Role::ffn;
  spec.attention = 2;
  spec.tokens = 128;
  spec.hidden = 7168;
  spec.top_k = 8;
  spec.a2f_extra = {{"router_logits", 256 * 4}};
  return spec;
}

// An honest A2F header of `tokens` tokens, every tensor whole, at `row_offset`.
WireHeader header(const EngineSpec& spec, uint32_t tokens, uint32_t row_offset = 0) {
  WireHeader h = make_header(spec, job_layout(spec), 1, MessageKind::a2f, 0, 1, tokens, 0);
  h.source = 0;
  h.row_offset = row_offset;
  for (int t = 0; t < spec.a2f_tensors(); ++t) {
    h.rows[t] = tokens;
    h.payload_bytes += uint64_t{tokens} * spec.a2f_row_bytes(t);
  }
  return h;
}

// What validate() says of `h` in slot (sender 0, micro-batch 0) of a sender at `epoch`.
std::string refusal(const WireHeader& h, const EngineSpec& spec, uint64_t epoch = 1) {
  try {
    validate(h, spec, job_layout(spec), MessageKind::a2f, 0, epoch, 0, "test");
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), kStatusProtocolError);
    return e.what();
  }
  return "accepted";
}

bool says(const std::string& refusal, const std::string& what) {
  return refusal.find(what) != std::string::npos;
}

// A process that was replaced (epoch 1) must not be taken for its replacement (epoch 2).
TEST(WireValidate, AnOlderIncarnationsHeaderIsRefused) {
  const EngineSpec spec = receiver();
  const WireHeader h = header(spec, 4);
  EXPECT_EQ(refusal(h, spec, 1), "accepted");
  EXPECT_TRUE(says(refusal(h, spec, 2), "epoch 1 from the sender's incarnation 2"))
      << refusal(h, spec, 2);
}

TEST(WireValidate, HonestHeadersAreAccepted) {
  const EngineSpec spec = receiver();
  EXPECT_EQ(refusal(header(spec, 128), spec), "accepted");
  EXPECT_EQ(refusal(header(spec, 3, 128 + 5), spec), "accepted");  // in the second A's window
  EXPECT_EQ(refusal(header(spec, 0), spec), "accepted");           // an idle rank's empty push
  WireHeader dense = header(spec, 16);  // a dense layer: no router logits
  dense.rows[2] = 0;
  dense.payload_bytes -= 16 * spec.a2f_row_bytes(2);
  EXPECT_EQ(refusal(dense, spec), "accepted");
}

TEST(WireValidate, RowsAndPayloadThatDoNotAddUpAreRefused) {
  const EngineSpec spec = receiver();
  WireHeader h = header(spec, 3);
  h.payload_bytes += 1;
  EXPECT_TRUE(says(refusal(h, spec), "payload of")) << refusal(h, spec);
  EXPECT_TRUE(says(refusal(header(spec, 129), spec), "129 tokens"));
  h = header(spec, 4);
  h.rows[0] = 5;  // the tokens tensor always carries the push's tokens
  EXPECT_TRUE(says(refusal(h, spec), "5 rows of tokens for 4 tokens")) << refusal(h, spec);
  h = header(spec, 4);
  h.rows[2] = 1u << 31;  // a hostile count: never multiplied before it is bounded
  EXPECT_TRUE(says(refusal(h, spec), "rows of tensor 2")) << refusal(h, spec);
  h = header(spec, 4);
  h.rows[5] = 1;  // a tensor the job does not have
  EXPECT_TRUE(says(refusal(h, spec), "rows of tensor 5 (none: the job's holds 0..0)"))
      << refusal(h, spec);
  EngineSpec without_routing = spec;
  without_routing.top_k = 0;
  h = header(without_routing, 4);
  h.rows[kRoutingTensor] = 4;
  EXPECT_TRUE(says(refusal(h, without_routing), "rows of tensor 1 (routing: the job's holds 0..0)"))
      << refusal(h, without_routing);
}

TEST(WireValidate, RowsPastTheRowSpacesAreRefused) {
  const EngineSpec spec = receiver();  // 2 As x 128 rows
  EXPECT_TRUE(
      says(refusal(header(spec, 128, 129), spec), "rows 129..257 (the row spaces hold 256)"))
      << refusal(header(spec, 128, 129), spec);
  // An offset that wraps 32 bits with its rows is still past the end.
  EXPECT_TRUE(says(refusal(header(spec, 2, UINT32_MAX), spec), "the row spaces hold 256"));
}

TEST(WireValidate, ASenderOfAnotherShapeIsRefused) {
  const EngineSpec spec = receiver();
  EngineSpec other = spec;
  other.a2f_extra[0].row_bytes = 256 * 2;  // router logits in bf16 at one end, fp32 at the other
  EXPECT_TRUE(says(refusal(header(other, 4), spec), "the sender's job has other shapes"))
      << refusal(header(other, 4), spec);
  other = spec;
  other.a2f_extra[0].name = "router_logit";
  EXPECT_TRUE(says(refusal(header(other, 4), spec), "other shapes"));
}

TEST(EngineSpecSizes, OverflowThrowsInsteadOfWrapping) {
  EngineSpec spec;
  spec.tokens = std::numeric_limits<uint32_t>::max();
  spec.hidden = std::numeric_limits<uint32_t>::max();
  spec.top_k = std::numeric_limits<uint32_t>::max();
  spec.a2f_bytes = 4;
  spec.f2a_bytes = 4;
  EXPECT_THROW(spec.a2f_slot_bytes(), Error);
  EXPECT_THROW(spec.f2a_slot_bytes(), Error);
  EXPECT_THROW(spec.instance_slot_bytes(), Error);
  spec = EngineSpec{};  // StepMesh's shape: 128 x (7168 x 1 + 8 x 8) and 128 x 7168 x 2
  EXPECT_EQ(spec.a2f_slot_bytes(), 128u * (7168 + 64));
  EXPECT_EQ(spec.f2a_slot_bytes(), 128u * 7168 * 2);
  EXPECT_EQ(spec.instance_slot_bytes(), 3 * (spec.a2f_slot_bytes() + spec.f2a_slot_bytes()));
  spec.role = Role::ffn;
  spec.attention = 2;
  EXPECT_EQ(spec.instance_slot_bytes(), 2 * 3 * (spec.a2f_slot_bytes() + spec.f2a_slot_bytes()));
  // In groups, an F holds only its own As' rows.
  spec.ffn = 2;
  spec.topology = JobTopology::groups;
  EXPECT_EQ(spec.ffn_rows(0), 128u);
  EXPECT_EQ(spec.instance_slot_bytes(), 3 * (spec.a2f_slot_bytes() + spec.f2a_slot_bytes()));
  EXPECT_EQ(spec.window_of(1, 1), 0);
}

// The control words keep their bytes on the wire (peers of the previous build send the same), and
// anything else a peer sends on the control channel is no word at all.
TEST(WireControl, EachWordHasItsBytesAndReadsBackAsItself) {
  auto text = [](ControlWord w) {
    auto bytes = encode(w);
    return std::string(bytes.begin(), bytes.end());
  };
  EXPECT_EQ(text(ControlWord::heartbeat), "hb");
  EXPECT_EQ(text(ControlWord::leave), "leave");
  EXPECT_EQ(text(ControlWord::quit), "quit");
  for (ControlWord w : {ControlWord::heartbeat, ControlWord::leave, ControlWord::quit})
    EXPECT_EQ(decode_control(encode(w)), w);
}

TEST(WireControl, AnythingElseIsNoWord) {
  for (const std::string& other :
       std::vector<std::string>{"", "lea", "leaves", "QUIT", std::string("hb\0", 3)}) {
    std::vector<uint8_t> bytes(other.begin(), other.end());
    EXPECT_EQ(decode_control(bytes), std::nullopt) << other;
  }
}

}  // namespace
}  // namespace hetmesh::afd
