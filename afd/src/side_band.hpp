// Side-band messages between engines (AttentionEngine::send_message, FfnEngine::send_message): a
// peer's messages travel on its connection's control channel, framed so they are never taken for
// a control word, and go out through the peer's sender in order with the data. The transports
// order data and control messages only among themselves, so each header carries how many messages
// its sender had sent this receiver before it (WireHeader::messages): a notification that
// overtook one of them is held here until that message has arrived.
#pragma once

#include <hetmesh/afd/engine.hpp>
#include <hetmesh/transport/transport.hpp>

#include <cstdint>
#include <deque>
#include <optional>
#include <span>
#include <vector>

namespace hetmesh::afd {

// The frame of a message's body on the control channel; the body of a frame, or nullopt for
// anything else (a control word).
std::vector<uint8_t> message_frame(std::span<const uint8_t> body);
std::optional<std::span<const uint8_t>> message_body(std::span<const uint8_t> frame);

// An engine's own frame on the same channel, counted and ordered as messages are, but never handed
// to the application: a registration of the caller's memory that the peer is to write into
// (caller_buffers.hpp), announced before the first header that names it.
struct RegionFrame {
  uint32_t id = 0;
  RegionDescriptor descriptor;
};
std::vector<uint8_t> region_frame(uint32_t id, const RegionDescriptor& descriptor);
std::optional<RegionFrame> region_of(std::span<const uint8_t> frame);

// One engine's messages to and from its peers (of `peer_role`). Every call holds the engine's
// mutex.
class SideBand {
 public:
  SideBand(Role self, int self_rank, Role peer_role, int peers);

  // Queues a message to `peer` for its sender; throws Error(INVALID_ARGUMENT) for a body over
  // kMaxMessageBytes or when kMaxQueued of them wait already.
  void queue_locked(int peer, std::span<const uint8_t> body);
  // The sender's next frame for `peer` (one was queued), counted as sent.
  std::vector<uint8_t> take_frame_locked(int peer);
  // Messages sent to `peer` so far (low 32 bits), for the next header to it.
  uint32_t sent_locked(int peer) const { return sent_[static_cast<size_t>(peer)]; }
  // The sender sent `peer` a frame of the engine's own (a region): counted as a message is.
  void note_sent_locked(int peer) { ++sent_[static_cast<size_t>(peer)]; }

  // A notification in `slot` from `peer`, whose header says `messages_before`: true if it may be
  // handled now, false if it is held until those messages are in (or others of the peer's are
  // held before it).
  bool admit_locked(int peer, uint32_t slot, uint32_t messages_before);
  // A message from `peer` arrived: it is queued for receive, and the notifications it releases
  // are returned, in their order.
  std::vector<uint32_t> arrived_locked(int peer, std::span<const uint8_t> body);
  // A frame of the engine's own from `peer` arrived (and was handled): counted only.
  std::vector<uint32_t> counted_locked(int peer);
  std::optional<Message> receive_locked();
  bool has_message_locked() const { return !inbox_.empty(); }
  // `peer` was replaced: the counts, its queued messages and its held notifications start afresh.
  void restart_locked(int peer);

  static constexpr size_t kMaxMessageBytes = 60 * 1024;  // below the control channel's 64 KiB
  static constexpr size_t kMaxQueued = 64;               // per peer, waiting for its sender

 private:
  struct Held {
    uint32_t slot;
    uint32_t messages_before;
  };
  Role self_;
  int self_rank_;
  Role peer_role_;
  std::vector<std::deque<std::vector<uint8_t>>> outbox_;  // [peer]
  std::vector<uint32_t> sent_, received_;                 // [peer]
  std::vector<std::deque<Held>> held_;                    // [peer]
  std::deque<Message> inbox_;
};

}  // namespace hetmesh::afd
