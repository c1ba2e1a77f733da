// Side-band messages between engines (AttentionEngine::send_message, FfnEngine::send_message): a
// peer's messages travel on its connection's control channel, framed so they are never taken for
// a control word, and go out through the peer's sender in order with the data. The transports
// order data and control messages only among themselves, so each header carries how many messages
// its sender had sent this receiver before it (WireHeader::messages): a notification that
// overtook one of them is held here until that message has arrived.
#pragma once

#include "peer.hpp"

#include <hetmesh/afd/engine.hpp>
#include <hetmesh/core/error.hpp>
#include <hetmesh/transport/transport.hpp>

#include <fmt/format.h>

#include <chrono>

#include <array>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
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

// An F's frame to an A: from now on the A's rows of micro-batch `micro_batch` land in the F's
// layout of receive buffers `landing` (FfnEngine::receive_into): per A2F tensor, the F's
// registration of that number (a region frame announced it; 0: the F's own row space) at offset.
struct LandingFrame {
  uint32_t micro_batch = 0;
  uint32_t landing = 0;
  std::array<uint32_t, kMaxA2fTensors> region{};
  std::array<uint64_t, kMaxA2fTensors> offset{};
};
std::vector<uint8_t> landing_frame(const LandingFrame& landing);
std::optional<LandingFrame> landing_of(std::span<const uint8_t> frame);

// The registrations of its own memory each peer announced (region frames), imported on that
// peer's current link, by number: what its headers and landings name. Every call holds the
// engine's mutex.
class PeerRegions {
 public:
  PeerRegions(Role peer_role, int peers)
      : peer_role_(peer_role), regions_(static_cast<size_t>(peers)) {}
  // Keeps `peer`'s registration `id`; throws Error(kStatusProtocolError) for a number out of
  // 1..CallerBuffers::kMaxRegistrations or one announced before.
  void add_locked(int peer, uint32_t id, std::shared_ptr<RemoteRegion> region);
  // Throws as add_locked for a number out of range (before its descriptor is read).
  void check_id(int peer, uint32_t id) const;
  // Null for a number `peer` never announced.
  std::shared_ptr<RemoteRegion> find_locked(int peer, uint32_t id) const;
  // `peer` was replaced: its registrations were imported on the old link.
  void clear_locked(int peer) { regions_[static_cast<size_t>(peer)].clear(); }

 private:
  Role peer_role_;
  std::vector<std::map<uint32_t, std::shared_ptr<RemoteRegion>>> regions_;  // [peer]
};

class SideBand;
// A region frame from `peer`'s current `link`: its number checked, imported on that link (the
// comm thread's, as only it replaces a link), kept in `regions` and counted as a message; returns
// the notifications that waited for it. Takes the engine's `mutex`.
std::vector<uint32_t> receive_region(PeerRegions& regions, SideBand& side_band, std::mutex& mutex,
                                     int peer, const Link& link, const RegionFrame& frame);

// Which of an engine's own registrations (the caller's memory a peer writes into) it announced to
// each peer's current incarnation. Every call holds the engine's mutex.
class AnnouncedRegions {
 public:
  explicit AnnouncedRegions(int peers) : announced_(static_cast<size_t>(peers)) {}
  // True the first time for (`peer`, `id`): the region frame goes out now.
  bool first_locked(int peer, uint32_t id) {
    std::vector<bool>& known = announced_[static_cast<size_t>(peer)];
    if (known.size() <= id) known.resize(id + 1, false);
    if (known[id]) return false;
    known[id] = true;
    return true;
  }
  bool has_locked(int peer, uint32_t id) const {
    const std::vector<bool>& known = announced_[static_cast<size_t>(peer)];
    return id < known.size() && known[id];
  }
  void clear_locked(int peer) { announced_[static_cast<size_t>(peer)].clear(); }

 private:
  std::vector<std::vector<bool>> announced_;  // [peer][id]
};

// One engine's messages to and from its peers (of `peer_role`). Every call holds the engine's
// mutex.
class SideBand {
 public:
  SideBand(Role self, int self_rank, Role peer_role, int peers);

  // Queues a message to `peer` for its sender; throws Error(INVALID_ARGUMENT) for a body over
  // kMaxMessageBytes or when kMaxQueued frames wait already.
  void queue_locked(int peer, std::span<const uint8_t> body);
  // Queues frames of the engine's own (regions, a landing), as messages are: all of them, or
  // none (Error(INVALID_ARGUMENT), as queue_locked) when they do not fit.
  void queue_frames_locked(int peer, std::vector<std::vector<uint8_t>> frames);
  // The sender's next frame for `peer` (one was queued), counted as sent.
  std::vector<uint8_t> take_frame_locked(int peer);
  // Frames that may still be queued for `peer`.
  size_t room_locked(int peer) const {
    return kMaxQueued - outbox_[static_cast<size_t>(peer)].size();
  }
  // Messages sent to `peer` so far (low 32 bits), for the next header to it.
  uint32_t sent_locked(int peer) const { return sent_[static_cast<size_t>(peer)]; }
  // The sender sent `peer` a frame of the engine's own (a region): counted as a message is.
  void note_sent_locked(int peer) { ++sent_[static_cast<size_t>(peer)]; }

  // A notification in `slot` from `peer`, whose header says `messages_before`: true if it may be
  // handled now, false if it is held until those messages are in (or others of the peer's are
  // held before it).
  bool admit_locked(int peer, uint32_t slot, uint32_t messages_before);
  // A message from `peer` arrived: it is queued for receive, and the notifications it releases
  // are returned, in their order. Throws Error(kStatusProtocolError) naming the peer when
  // kMaxUnread of its messages are waiting for receive_message already (a peer that floods, or an
  // application that does not read them, must not take the host's memory).
  std::vector<uint32_t> arrived_locked(int peer, std::span<const uint8_t> body);
  // A frame of the engine's own from `peer` arrived (and was handled): counted only.
  std::vector<uint32_t> counted_locked(int peer);
  std::optional<Message> receive_locked();
  bool has_message_locked() const { return !inbox_.empty(); }
  // `peer` was replaced: the counts, its queued messages and its held notifications start afresh.
  void restart_locked(int peer);

  static constexpr size_t kMaxMessageBytes = 60 * 1024;  // below the control channel's 64 KiB
  static constexpr size_t kMaxQueued = 64;               // per peer, waiting for its sender
  static constexpr size_t kMaxUnread = 1024;             // per peer, waiting for receive

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
  std::vector<size_t> unread_;                            // [peer]: its messages in inbox_
  std::deque<Message> inbox_;
};

// What both engines do with their side band, on an engine's State (its mutex, condition
// variable `changed`, side_band, failure, closed flag, spec and peers).

// A sender's turn: the next frame queued for `peer` goes out on its link (nothing once the engine
// failed or the peer is lost; a peer lost under the send is its loss to report).
template <typename State>
void send_next_frame(State& s, int peer, Role peer_role) {
  std::vector<uint8_t> frame;
  std::shared_ptr<const Link> link;
  {
    std::lock_guard lock(s.mutex);
    frame = s.side_band.take_frame_locked(peer);
    const Peer& p = s.peers->at(peer);
    if (frame.empty() || s.failure.has() || p.lost) return;
    link = p.link;
  }
  try {
    link->connection->send_control(frame);
  } catch (const Error& e) {
    if (e.status() != kStatusPeerLost) rethrow_for_peer(e, peer_role, peer);
  }
}

// receive_message: the next message from any peer, or nullopt after `timeout`; the engine's
// error, or Error(kStatusClosed) once it was finished and no message is left.
template <typename State>
std::optional<Message> receive_next_message(State& s, std::chrono::milliseconds timeout) {
  std::unique_lock lock(s.mutex);
  s.changed.wait_for(lock, timeout, [&] {
    return s.side_band.has_message_locked() || s.failure.has() || s.closed;
  });
  if (auto message = s.side_band.receive_locked()) return message;
  s.failure.throw_if_set();
  if (s.closed)
    throw Error(kStatusClosed, fmt::format("{}: receive_message after finish()",
                                           peer_name(s.spec.role, s.spec.rank)));
  return std::nullopt;
}

}  // namespace hetmesh::afd
