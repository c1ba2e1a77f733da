// The AFD wire format. The header: 176 bytes in host memory beside every payload slot, written
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
#include <vector>

namespace hetmesh::afd {

constexpr uint32_t kWireMagic = 0x46414d48;  // "HMAF"
// 2: the sender's epoch and the application's tag; 3: messages; 4: the caller's result buffers;
// 5: several A2F tensors with their rows, row offsets, the F's receive buffers, the job's layout;
// 6: the rows of the answer an A asks for
constexpr uint16_t kWireVersion = 6;
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
  uint64_t payload_bytes;  // A2F: the rows of every tensor; F2A: the answer's
  uint64_t stamps[kStampCount];
  uint64_t tag;  // A2F: the application's value for the micro-batch (push_pull), e.g. a layer
  // Side-band messages the sender had sent this receiver before this header (low 32 bits): the
  // receiver handles the header only once they are in (side_band.hpp).
  uint32_t messages;
  // A2F: where the F writes its answer: 0, the A's result slot; else the A's registration of
  // that number (a region frame on the side band announced it), at reply_offset.
  uint32_t reply_region;
  uint64_t reply_offset;
  uint32_t layout;  // job_layout() of the sender's job: both ends must run the same shapes
  // A2F: the row the part's rows start at in the F's row spaces, and which of the F's layouts of
  // receive buffers they landed in (0: its own row spaces; FfnEngine::receive_into).
  uint32_t row_offset;
  uint32_t landing;
  uint32_t result_rows;           // A2F: rows of the answer (F2A: `tokens` says them)
  uint32_t rows[kMaxA2fTensors];  // A2F: rows of each tensor (tokens for kTokensTensor)
};
static_assert(sizeof(WireHeader) == 176);

// A digest of what both ends of a job must agree on for the slots to line up: the model's sizes
// and dtypes, the A2F tensors (names and row bytes), the instances and which As each F serves. An
// engine computes it once (a map's costs a pass over every A's list) and hands it to make_header
// and validate.
inline uint32_t job_layout(const EngineSpec& spec) {
  uint32_t hash = 2166136261u;  // FNV-1a
  auto mix = [&hash](const void* data, size_t size) {
    for (size_t i = 0; i < size; ++i)
      hash = (hash ^ static_cast<const uint8_t*>(data)[i]) * 16777619u;
  };
  const uint64_t values[] = {spec.tokens,
                             spec.hidden,
                             spec.top_k,
                             spec.a2f_bytes,
                             spec.f2a_bytes,
                             static_cast<uint64_t>(spec.attention),
                             static_cast<uint64_t>(spec.ffn),
                             static_cast<uint64_t>(spec.topology),
                             spec.a2f_extra.size()};
  mix(values, sizeof values);
  for (const ExtraTensor& t : spec.a2f_extra) {
    mix(t.name.data(), t.name.size() + 1);
    mix(&t.row_bytes, sizeof t.row_bytes);
  }
  if (spec.topology == JobTopology::map)
    for (const std::vector<int>& ffns : spec.ffns_of) {
      const uint64_t count = ffns.size();
      mix(&count, sizeof count);
      mix(ffns.data(), ffns.size() * sizeof(int));
    }
  return hash;
}

// Offsets in F f's own memory: A2F tensor `tensor`'s row `row` of micro-batch mb in its input row
// spaces, and output row `row` of mb.
inline uint64_t ffn_input_offset(const EngineSpec& spec, int f, int mb, int tensor, uint64_t row) {
  const uint64_t rows = spec.ffn_rows(f);
  return static_cast<uint64_t>(mb) * spec.a2f_block_bytes(rows) +
         spec.a2f_tensor_offset(rows, tensor) + row * spec.a2f_row_bytes(tensor);
}
inline uint64_t ffn_output_offset(const EngineSpec& spec, int f, int mb, uint64_t row) {
  return (static_cast<uint64_t>(mb) * spec.ffn_rows(f) + row) * spec.f2a_bytes_per_token();
}

// The most rows any tensor of an A2F header carries (what of the F's row spaces it covers).
inline uint32_t header_rows(const WireHeader& h) {
  return *std::max_element(std::begin(h.rows), std::end(h.rows));
}

// Throws Error(kStatusProtocolError) naming the field unless `h` fits the receiver's job `spec`
// (kind `kind`; spec.rank is the receiver's) and arrived in the slot of (`source`, `micro_batch`)
// from the sender's incarnation `epoch` (an older one's header, written by a process that was
// replaced, is refused).
inline void validate(const WireHeader& h, const EngineSpec& spec, uint32_t layout, MessageKind kind,
                     uint32_t source, uint64_t epoch, uint32_t micro_batch, const char* where) {
  auto bad = [&](const std::string& what) {
    throw Error(kStatusProtocolError, fmt::format("{}: refused header: {}", where, what));
  };
  if (h.magic != kWireMagic) bad(fmt::format("magic {:08x}", h.magic));
  if (h.version != kWireVersion)
    bad(fmt::format("version {} (this build speaks {})", h.version, kWireVersion));
  if (h.kind != static_cast<uint16_t>(kind)) bad(fmt::format("kind {}", h.kind));
  if (h.source != source) bad(fmt::format("source {} in the slot of sender {}", h.source, source));
  if (h.epoch != static_cast<uint32_t>(epoch))
    bad(fmt::format("epoch {} from the sender's incarnation {}", h.epoch, epoch));
  if (h.micro_batch != micro_batch)
    bad(fmt::format("micro-batch {} in the slot of micro-batch {}", h.micro_batch, micro_batch));
  if (h.tokens > spec.tokens)
    bad(fmt::format("{} tokens (slot holds 0..{})", h.tokens, spec.tokens));
  if (h.hidden != spec.hidden) bad(fmt::format("hidden {} (job has {})", h.hidden, spec.hidden));
  if (h.top_k != spec.top_k) bad(fmt::format("top_k {} (job has {})", h.top_k, spec.top_k));
  if (h.layout != layout)
    bad(
        fmt::format("the sender's job has other shapes (its A2F tensors, sizes or dtypes: layout "
                    "{:08x}, this job's {:08x})",
                    h.layout, layout));
  // Each tensor's rows are at most the job's tokens (checked in the loop before they are added), so
  // the sum is at most a slot's bytes, which the engine computed with overflow checks: no wrap.
  uint64_t payload = uint64_t{h.tokens} * spec.f2a_bytes_per_token();
  if (kind == MessageKind::a2f) {
    if (h.rows[kTokensTensor] != h.tokens)
      bad(fmt::format("{} rows of tokens for {} tokens", h.rows[kTokensTensor], h.tokens));
    payload = 0;
    for (int t = 0; t < kMaxA2fTensors; ++t) {
      if (h.rows[t] > (t < spec.a2f_tensors() && spec.a2f_row_bytes(t) > 0 ? spec.tokens : 0))
        bad(fmt::format("{} rows of tensor {} ({}: the job's holds 0..{})", h.rows[t], t,
                        t < spec.a2f_tensors() ? spec.a2f_tensor_name(t) : "none",
                        t < spec.a2f_tensors() && spec.a2f_row_bytes(t) > 0 ? spec.tokens : 0));
      payload += uint64_t{h.rows[t]} * spec.a2f_row_bytes(t);
    }
    if (h.result_rows > spec.tokens)
      bad(fmt::format("an answer of {} rows (0..{})", h.result_rows, spec.tokens));
    // The receiver is the F whose row spaces (and output rows) these are.
    const uint64_t covered = std::max(header_rows(h), h.result_rows);
    if (uint64_t{h.row_offset} + covered > spec.ffn_rows(spec.rank))
      bad(fmt::format("rows {}..{} (the row spaces hold {})", h.row_offset,
                      uint64_t{h.row_offset} + covered, spec.ffn_rows(spec.rank)));
  }
  if (h.payload_bytes != payload)
    bad(fmt::format("payload of {} bytes for its rows ({} bytes)", h.payload_bytes, payload));
}

// The header of a message from this instance (spec.role, spec.rank, `epoch`) in micro-batch slot
// `mb`, stamps and tag zero.
inline WireHeader make_header(const EngineSpec& spec, uint32_t layout, uint64_t epoch,
                              MessageKind kind, int mb, uint64_t sequence, uint32_t tokens,
                              uint64_t payload_bytes) {
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
  h.layout = layout;
  return h;
}

// Checks a notification's slot index against `limit`; throws a protocol error otherwise.
inline void check_slot(uint32_t slot, uint32_t limit, const std::string& from) {
  if (slot >= limit)
    throw Error(kStatusProtocolError,
                fmt::format("{} notified slot {}, but only {} slots exist", from, slot, limit));
}

}  // namespace hetmesh::afd
