// The ipc transport's wire format: the hello that opens a connection and the frames of its message
// rings. Shared by the link (which sends and receives frames) and the connection (which builds
// them).
#pragma once

#include <chrono>
#include <cstdint>

namespace hetmesh::detail {

constexpr uint32_t kHelloMagic = 0x48504948;  // "HIPH"
constexpr uint32_t kFrameMagic = 0x46504948;  // "HIPF"
// 2: frames travel in a shared-memory message ring; the socket carries wake-ups only.
// 3: the message ring's wake-up request has a cache line of its own.
constexpr uint16_t kProtocolVersion = 3;

// The staging ring's geometry comes from TransportOptions (staging_slots, staging_slot_bytes).
constexpr uint32_t kMinRingSlots = 2;
constexpr uint64_t kMinSlotBytes = 4 << 10;
// The message ring this side creates: thousands of frames, and always room for the largest
// control message.
constexpr uint64_t kMessageRingBytes = 256 << 10;
// Limits on a peer's announced geometry.
constexpr uint32_t kMaxRingSlots = 64;
constexpr uint64_t kMaxSlotBytes = 64 << 20;
constexpr uint64_t kMinMessageRingBytes = 128 << 10;
constexpr uint64_t kMaxMessageRingBytes = 16 << 20;

// Bound of every wait on progress: a copy engine finishing, ring credit, queue or ring space.
constexpr std::chrono::seconds kProgressTimeout{30};

enum FrameType : uint8_t { kNotify = 1, kChunk = 2, kControl = 3 };
enum FrameFlags : uint8_t { kLastChunk = 1, kWithNotify = 2 };

// Every record in a message ring is one of these, a control frame followed by its payload padded
// to kRecordAlign, so a frame never straddles the ring's end.
struct Frame {
  uint32_t magic;
  uint8_t type;
  uint8_t flags;
  uint16_t slot;    // kChunk
  uint32_t region;  // kChunk
  uint32_t value;   // kNotify; kChunk with kWithNotify
  uint64_t offset;  // kChunk
  uint64_t length;  // kChunk, kControl
};
static_assert(sizeof(Frame) == 32);
constexpr uint64_t kRecordAlign = sizeof(Frame);
static_assert(kMinMessageRingBytes >= sizeof(Frame) + (64 << 10));  // the largest control message

// The bytes a record with a payload of `payload` bytes takes in the ring.
constexpr uint64_t record_bytes(uint64_t payload) {
  return sizeof(Frame) + (payload + kRecordAlign - 1) / kRecordAlign * kRecordAlign;
}

inline Frame make_frame(FrameType type) {
  Frame f{};
  f.magic = kFrameMagic;
  f.type = type;
  return f;
}

// Sent once each way after the socket connects, with the sender's outgoing staging ring, the
// peer's end of its credit channel and its outgoing message ring attached.
struct Hello {
  uint32_t magic;
  uint16_t version;
  uint16_t ring_slots;
  uint64_t slot_bytes;
  uint64_t message_ring_bytes;
};
static_assert(sizeof(Hello) == 24);

}  // namespace hetmesh::detail
