// What the two ends of a fabric connection send each other, byte for byte: the hello on the
// out-of-band socket, the control frames after it, and the notices on the fabric endpoint (the
// message that follows a write's RMA writes where the peer must act on it). Both
// ends run the same code, so the structs go out as they are in memory; a magic and a version
// catch a stranger, and every field is checked before it is used.
#pragma once

#include <cstdint>

namespace hetmesh::detail {

// The hello, once each way on the socket after the link handshake: where to send fabric
// messages, and what to put in them so that the receiver knows the sender (an RDM endpoint
// takes messages from anyone who knows its address; the token is known only to the peer that
// proved the job's secret).
constexpr uint32_t kHelloMagic = 0x48464d48;  // "HMFH"
constexpr uint16_t kHelloVersion = 2;
constexpr uint32_t kMaxFabricAddress = 256;
enum HelloFlags : uint32_t {
  kTakesNotifyData = 1,  // the sender takes notifications as an RMA write's remote CQ data
};
struct FabricHello {
  uint32_t magic;
  uint16_t version;
  uint16_t address_length;  // bytes of `address` used
  // The sender's number for this connection, random (a stranger's message or write with data
  // must guess it): messages and notification data to the sender carry it.
  uint32_t link;
  uint32_t flags;                      // HelloFlags
  uint64_t token;                      // messages to the sender of this hello carry it
  uint8_t address[kMaxFabricAddress];  // fi_getname of the sender's endpoint
};
static_assert(sizeof(FabricHello) == 24 + kMaxFabricAddress);

// Control frames on the socket.
constexpr uint32_t kControlMagic = 0x43464d48;  // "HMFC"
struct ControlFrame {
  uint32_t magic;
  uint32_t length;
};
static_assert(sizeof(ControlFrame) == 8);

// Messages on the fabric endpoint.
constexpr uint32_t kMessageMagic = 0x4d464d48;  // "HMFM"
constexpr uint8_t kMessageVersion = 1;
enum MessageType : uint8_t {
  kNotice = 2,  // the write went by RMA ahead of this message
};
enum MessageFlags : uint8_t {
  kNotify = 1,  // raise a notification with `value`
};
struct MessageHeader {
  uint32_t magic;
  uint8_t version;
  uint8_t type;
  uint8_t flags;
  uint8_t reserved;
  uint32_t link;  // the receiver's id for the connection (its hello's `link`)
  uint32_t region;
  uint64_t token;  // the receiver's hello's token
  uint64_t offset;
  uint64_t length;
  uint32_t value;
  uint32_t reserved2;
};
static_assert(sizeof(MessageHeader) == 48);

// A notification carried by the write itself, as its remote CQ data (fi_writedata), where both
// ends take it (kTakesNotifyData): the receiver's link number in the high half, then a set bit
// and the value (below 2^31). One operation instead of a write and a notice. A write with data
// needs the region's key besides, which only a peer that proved the job's secret was given.
constexpr uint64_t kDataNotify = uint64_t{1} << 31;
constexpr uint64_t notify_data(uint32_t link, uint32_t value) {
  return uint64_t{link} << 32 | kDataNotify | value;
}

// A message buffer. Every message is a header; the room beyond it only turns a longer message
// (a stranger's) into a truncation error rather than a fit.
constexpr uint64_t kMessageBytes = 256;

}  // namespace hetmesh::detail
