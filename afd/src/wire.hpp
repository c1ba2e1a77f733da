// The AFD wire format. The header: 128 bytes in host memory beside every payload slot, written
// after the payload on the same connection (so its notification implies the payload landed) and
// checked against the receiver's slot table before anything is read from the slot; made by
// make_header, its notification's slot index checked by check_slot. The control words engines
// send each other beside the slots (ControlWord).
#pragma once

#include <hetmesh/afd/engine.hpp>
#include <hetmesh/core/error.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

namespace hetmesh::afd {

constexpr uint32_t kWireMagic = 0x46414d48;  // "HMAF"
// 2: the sender's epoch and the application's tag; 3: messages; 4: the caller's result buffers
constexpr uint16_t kWireVersion = 4;
enum class MessageKind : uint16_t { a2f = 1, f2a = 2 };

// The control messages between engines, on a connection's control channel beside the slots.
enum class ControlWord {
  heartbeat,  // a sign of life while no data is due (PeerGroup's Heartbeat)
  leave,      // an A is done: its going is no failure
  quit,       // an A ended after a failure of its own: count it lost, do not wait for it
};

// The bytes of `word` on the wire ("hb", "leave", "quit").
inline std::span<const uint8_t> encode(ControlWord word) {
  static constexpr std::string_view kWords[] = {"hb", "leave", "quit"};
  std::string_view text = kWords[static_cast<int>(word)];
  return {reinterpret_cast<const uint8_t*>(text.data()), text.size()};
}

// The word a control message carries; nullopt for anything else (a peer's unknown word is
// ignored, as a newer peer's may be).
inline std::optional<ControlWord> decode_control(std::span<const uint8_t> payload) {
  for (ControlWord word : {ControlWord::heartbeat, ControlWord::leave, ControlWord::quit}) {
    auto bytes = encode(word);
    if (std::equal(payload.begin(), payload.end(), bytes.begin(), bytes.end())) return word;
  }
  return std::nullopt;
}

// Sender-side timestamps (ns, the sender's steady clock) carried for the skew-free metrics.
enum Stamp : int {
  kAttentionStart = 0,  // A2F: the caller's attention start (0 when not given)
  kPushStart = 1,       // A2F: push_pull() called
  kPosted = 2,          // both: writes posted by the comm thread
  kReceived = 3,        // F2A: when F saw the A2F header of this micro-batch
  kBatchReady = 4,      // F2A: when F's batch holding it was complete
  kComputeStart = 5,    // F2A: respond() says compute started (0 when not given)
  kComputeEnd = 6,      // F2A: respond() called
  kStampCount = 7
};

struct WireHeader {
  uint32_t magic;
  uint16_t version;
  uint16_t kind;         // MessageKind
  uint32_t source;       // sender's rank in its role
  uint32_t micro_batch;  // slot index
  uint64_t sequence;     // per (sender, receiver, micro-batch) slot, starting at 1
  uint32_t tokens;
  uint32_t hidden;
  uint32_t top_k;
  uint32_t epoch;          // the sender's incarnation (membership.hpp), low 32 bits
  uint64_t payload_bytes;  // tokens (and for A2F, routing) bytes at the start of the slot
  uint64_t stamps[kStampCount];
  uint64_t tag;  // A2F: the application's value for the micro-batch (push_pull), e.g. a layer
  // Side-band messages the sender had sent this receiver before this header (low 32 bits): the
  // receiver handles the header only once they are in (side_band.hpp).
  uint32_t messages;
  // A2F: where the F writes its answer: 0, the A's result slot; else the A's registration of
  // that number (a region frame on the side band announced it), at reply_offset.
  uint32_t reply_region;
  uint64_t reply_offset;
};
static_assert(sizeof(WireHeader) == 128);

// What a receiver knows about the slot a header arrived in.
struct SlotLimits {
  MessageKind kind;
  uint32_t senders;  // number of peers in the sender's role
  uint32_t micro_batches;
  uint32_t max_tokens;
  uint32_t hidden;
  uint32_t top_k;
  uint64_t capacity;         // payload bytes the slot holds
  uint64_t bytes_per_token;  // payload bytes per token (including routing for A2F)
};

// Throws Error(kStatusProtocolError) naming the field unless `h` fits `limits` and arrived in the
// slot of (`source`, `micro_batch`) from the sender's incarnation `epoch` (an older one's header,
// written by a process that was replaced, is refused).
inline void validate(const WireHeader& h, const SlotLimits& limits, uint32_t source, uint64_t epoch,
                     uint32_t micro_batch, const char* where) {
  auto bad = [&](const std::string& what) {
    throw Error(kStatusProtocolError, fmt::format("{}: refused header: {}", where, what));
  };
  if (h.magic != kWireMagic) bad(fmt::format("magic {:08x}", h.magic));
  if (h.version != kWireVersion)
    bad(fmt::format("version {} (this build speaks {})", h.version, kWireVersion));
  if (h.kind != static_cast<uint16_t>(limits.kind)) bad(fmt::format("kind {}", h.kind));
  if (h.source != source) bad(fmt::format("source {} in the slot of sender {}", h.source, source));
  if (h.epoch != static_cast<uint32_t>(epoch))
    bad(fmt::format("epoch {} from the sender's incarnation {}", h.epoch, epoch));
  if (h.micro_batch != micro_batch)
    bad(fmt::format("micro-batch {} in the slot of micro-batch {}", h.micro_batch, micro_batch));
  if (h.tokens > limits.max_tokens)
    bad(fmt::format("{} tokens (slot holds 0..{})", h.tokens, limits.max_tokens));
  if (h.hidden != limits.hidden)
    bad(fmt::format("hidden {} (job has {})", h.hidden, limits.hidden));
  if (h.top_k != limits.top_k) bad(fmt::format("top_k {} (job has {})", h.top_k, limits.top_k));
  // By division, never by multiplying: tokens x bytes_per_token of a hostile header could wrap
  // 64 bits to a size that fits.
  const uint64_t per_token = limits.bytes_per_token;
  if (per_token == 0 || h.payload_bytes > limits.capacity || h.payload_bytes % per_token != 0 ||
      h.payload_bytes / per_token != h.tokens)
    bad(fmt::format("payload of {} bytes for {} tokens (slot holds {} bytes)", h.payload_bytes,
                    h.tokens, limits.capacity));
}

// The header of a message from this instance (spec.role, spec.rank, `epoch`) in micro-batch slot
// `mb`, stamps and tag zero.
inline WireHeader make_header(const EngineSpec& spec, uint64_t epoch, MessageKind kind, int mb,
                              uint64_t sequence, uint32_t tokens, uint64_t payload_bytes) {
  WireHeader h{};
  h.magic = kWireMagic;
  h.version = kWireVersion;
  h.kind = static_cast<uint16_t>(kind);
  h.source = static_cast<uint32_t>(spec.rank);
  h.epoch = static_cast<uint32_t>(epoch);
  h.micro_batch = static_cast<uint32_t>(mb);
  h.sequence = sequence;
  h.tokens = tokens;
  h.hidden = spec.hidden;
  h.top_k = spec.top_k;
  h.payload_bytes = payload_bytes;
  return h;
}

// Checks a notification's slot index against `limit`; throws a protocol error otherwise.
inline void check_slot(uint32_t slot, uint32_t limit, const std::string& from) {
  if (slot >= limit)
    throw Error(kStatusProtocolError,
                fmt::format("{} notified slot {}, but only {} slots exist", from, slot, limit));
}

}  // namespace hetmesh::afd
