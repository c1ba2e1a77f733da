// The wire header's bounds check (afd/src/wire.hpp) against hostile headers: sizes whose product
// wraps 64 bits must be refused, not accepted as a small payload that "fits"; and the engine
// spec's slot arithmetic throws instead of wrapping.
#include "wire.hpp"

#include <hetmesh/afd/engine.hpp>

#include <gtest/gtest.h>

#include <limits>

namespace hetmesh::afd {
namespace {

constexpr uint64_t kBytesPerToken = uint64_t{1} << 34;  // a hostile slot table's figure

SlotLimits wide_limits() {
  return {MessageKind::a2f,
          1,
          1,
          std::numeric_limits<uint32_t>::max(),
          7168,
          8,
          /*capacity=*/uint64_t{1} << 20,
          kBytesPerToken};
}

WireHeader header(uint32_t tokens, uint64_t payload_bytes) {
  WireHeader h{};
  h.magic = kWireMagic;
  h.version = kWireVersion;
  h.kind = static_cast<uint16_t>(MessageKind::a2f);
  h.tokens = tokens;
  h.hidden = 7168;
  h.top_k = 8;
  h.payload_bytes = payload_bytes;
  h.epoch = 1;
  return h;
}

// What validate() says of `h` in slot (sender 0, micro-batch 0) of a sender at `epoch`.
std::string refusal(const WireHeader& h, const SlotLimits& limits, uint64_t epoch = 1) {
  try {
    validate(h, limits, 0, epoch, 0, "test");
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), kStatusProtocolError);
    return e.what();
  }
  return "accepted";
}

// A process that was replaced (epoch 1) must not be taken for its replacement (epoch 2).
TEST(WireValidate, AnOlderIncarnationsHeaderIsRefused) {
  const SlotLimits slot{MessageKind::a2f, 1, 1, 16, 7168, 8, /*capacity=*/1600, 100};
  const WireHeader h = header(4, 400);
  EXPECT_EQ(refusal(h, slot, 1), "accepted");
  EXPECT_NE(refusal(h, slot, 2).find("epoch 1 from the sender's incarnation 2"), std::string::npos)
      << refusal(h, slot, 2);
}

TEST(WireValidate, ProductThatWrapsIsRefused) {
  // 2^30 tokens x 2^34 bytes = 2^64, which wraps to 0: a payload of 0 bytes "matched" and "fit".
  EXPECT_NE(refusal(header(1u << 30, 0), wide_limits()).find("refused header: payload of 0 bytes"),
            std::string::npos);
  // 2^31 tokens: 2^65 wraps to 0 as well.
  EXPECT_NE(refusal(header(1u << 31, 0), wide_limits()).find("refused header"), std::string::npos);
  // A product that wraps to a value within the capacity: (2^30 + 1) x 2^34 = 2^34 mod 2^64.
  SlotLimits roomy = wide_limits();
  roomy.capacity = kBytesPerToken;
  EXPECT_NE(refusal(header((1u << 30) + 1, kBytesPerToken), roomy).find("refused header"),
            std::string::npos);
}

TEST(WireValidate, HonestHeaderIsAccepted) {
  SlotLimits limits = wide_limits();
  limits.bytes_per_token = 7168 + 8 * 8;
  limits.capacity = 128 * limits.bytes_per_token;
  limits.max_tokens = 128;
  EXPECT_EQ(refusal(header(128, 128 * limits.bytes_per_token), limits), "accepted");
  EXPECT_EQ(refusal(header(3, 3 * limits.bytes_per_token), limits), "accepted");
  EXPECT_NE(refusal(header(3, 3 * limits.bytes_per_token + 1), limits).find("payload"),
            std::string::npos);
  EXPECT_NE(refusal(header(129, 129 * limits.bytes_per_token), limits).find("129 tokens"),
            std::string::npos);
  // An idle rank's empty push: the header alone.
  EXPECT_EQ(refusal(header(0, 0), limits), "accepted");
  EXPECT_NE(refusal(header(0, 1), limits).find("payload of 1 bytes for 0 tokens"),
            std::string::npos);
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
