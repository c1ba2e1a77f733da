// What the two ends of a verbs connection send each other, byte for byte: the QP information
// swapped at setup and the control frames on the out-of-band socket, and the SEND that follows a
// write into a staged region on the queue pair. Both ends run the same code, so the structs go
// out as they are in memory (a magic and a version catch a stranger).
#pragma once

#include <cstdint>

namespace hetmesh::detail {

// Control frames on the out-of-band socket.
constexpr uint32_t kFrameMagic = 0x42564d48;  // "HMVB"
constexpr uint8_t kFrameVersion = 1;
enum FrameType : uint8_t { kControl = 1 };
struct FrameHeader {
  uint32_t magic;
  uint8_t version;
  uint8_t type;
  uint16_t reserved;
  uint64_t length;
};
static_assert(sizeof(FrameHeader) == 16);

// What each side tells the other to connect its QP.
constexpr uint32_t kQpInfoMagic = 0x51564d48;  // "HMVQ"
constexpr uint16_t kQpInfoVersion = 1;
struct QpInfo {
  uint32_t magic;
  uint16_t version;
  uint8_t ethernet;
  uint8_t mtu;  // ibv_mtu
  uint32_t qpn;
  uint32_t psn;
  uint16_t lid;
  uint16_t reserved;
  uint32_t recv_depth;
  uint8_t gid[16];
};
static_assert(sizeof(QpInfo) == 40);

// The SEND that follows a write into a staged region.
constexpr uint32_t kStagedMagic = 0x53564d48;  // "HMVS"
constexpr uint8_t kStagedNotify = 1;
struct StagedMessage {
  uint32_t magic;
  uint8_t flags;
  uint8_t reserved[3];
  uint32_t region;
  uint32_t value;
  uint64_t offset;
  uint64_t length;
};
static_assert(sizeof(StagedMessage) == 32);
constexpr uint32_t kSlotBytes = 64;  // a receive (or non-inline send) slot; holds a StagedMessage

}  // namespace hetmesh::detail
