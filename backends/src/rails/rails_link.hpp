// One connection of a rails transport (rails_transport.cc): a connection of every rail's transport
// to the peer's rail of the same index, and the striping of writes over them.
//
// A write below kStripeMin is one piece on the lead rail (rail 0 to begin with). A larger one is
// cut into one stripe per rail that is up. Every piece goes with a notification, and the peer's
// rails layer answers them with acknowledgements (a control message on that rail carrying how many
// of its notifications have landed, with their staged copies done); a write is done once each of
// its pieces was acknowledged, so a piece on a rail that fails goes again on another. A piece's
// notification is the user's (the lead's, below 2^31) or the layer's own (kStripeNote, never
// passed up). The lead's stripe goes at once but for its last bytes, which carry the user's
// notification and wait ("held") until every stripe of another rail issued before them is
// acknowledged, whatever the rails' transports are (verbs completes a write once it is placed,
// tcp once it is sent). Pieces for the lead issued after a held one wait behind it. So: a
// notification is raised only after every byte written before it has landed; the writes
// themselves may land in any order (a stripe can overtake an earlier write's bytes on the lead,
// or bytes sent there again after a rail failed), so a write must not overlap one whose landing
// the peer has not confirmed. The lead's user notifications and the user's control messages
// (numbered, each acknowledged) are the user's. Writes are done in the order they were issued, and
// never while a rail's sender thread is still inside the write that reads a piece's memory.
//
// A rail that fails (its connection lost, a write failed, a malformed message) is taken out: its
// pieces not yet acknowledged go again on the lead, which rewrites the same bytes where they had
// landed already. The lead itself moves ("lead_down"): to the lowest rail still up, where the
// layer tells the peer (kLead, with the move's number: a late one of an older move is ignored)
// and holds its user notifications and control messages until the peer answers with how many of
// each it passed up (kLeadAck); the peer first takes its old lead out, so nothing more of it is
// passed up. The old lead's pieces before the last user notification passed up have landed, the
// rest go again on the new lead, and so do the control messages not passed up. A user
// notification is numbered when it first goes, so the numbers are the peer's count. A message
// queued for a connection of a rail since replaced is not sent on the next (RailsPost::generation).
// A move the peer has not answered within io_timeout moves on to the next rail.
// Only a link with no rail left is lost (peer_lost). After a
// cooldown (kCooldown, doubled after each try and each failure that follows a try, up to
// kCooldownMost, and back to kCooldown once the rail carried a stripe again; every wait but the
// first drawn from half to one and a half of it, so that two ends that missed each other once do
// not miss each other at every try) both ends connect a failed rail again, each on its own, as
// connect() did; once its new connection is made it takes
// stripes again, once each end heard the other on it (an acknowledgement of nothing, sent by each
// as it has the connection), its counts starting from zero (a generation later: remote regions
// are imported on it again when first written).
#pragma once

#include "common/event_queue.hpp"

#include <hetmesh/transport/transport.hpp>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace hetmesh::detail {

constexpr uint64_t kStripeMin = 512 << 10;  // smaller writes take the first rail alone
constexpr uint64_t kStripeAlign = 4096;
constexpr uint64_t kNotifyTail = 64;  // the lead's last bytes, with the notification
constexpr uint32_t kStripeNote =
    0x80000000u;  // the layer's own notification: user values are below
// User control messages the peer has not acknowledged yet, at most (kept to send again after a move
// of the lead): a peer that never acknowledges is lost, not a cause of unbounded memory.
constexpr size_t kMaxControlLog = 16384;
constexpr size_t kMaxControlLogBytes = 64 << 20;
constexpr std::chrono::milliseconds kCooldown{1000};      // before a failed rail is tried again
constexpr std::chrono::milliseconds kCooldownMost{8000};  // the longest wait between two tries
constexpr std::chrono::milliseconds kReviveWindow{2000};  // one try's connect

// Shared (register_memory and import_region make them so): a piece a rail's sender is writing
// keeps its regions, and their rails' regions, alive until that write returns, however soon the
// user lets go of them.
class RailsRegion final : public Region, public std::enable_shared_from_this<RailsRegion> {
 public:
  RailsRegion(const Device& device, void* base, uint64_t size,
              std::vector<std::shared_ptr<Region>> rails);
  RegionDescriptor describe() const override;
  const Region& rail(size_t i) const { return *rails_[i]; }

 private:
  std::vector<std::shared_ptr<Region>> rails_;
};

// A peer's region: its descriptor's part for each rail, and that part imported on the rail's
// connection of some generation (none for a rail that was down when it was needed).
class RailsRemoteRegion final : public RemoteRegion,
                                public std::enable_shared_from_this<RailsRemoteRegion> {
 public:
  struct Imported {
    uint64_t generation = 0;
    std::shared_ptr<RemoteRegion> remote;
    bool failed = false;  // the import on that generation failed: not tried again
  };
  RailsRemoteRegion(uint64_t size, std::vector<std::vector<uint8_t>> descriptor_parts,
                    std::vector<Imported> imported)
      : RemoteRegion(size), parts(std::move(descriptor_parts)), rails(std::move(imported)) {}
  const std::vector<std::vector<uint8_t>> parts;
  mutable std::vector<Imported> rails;  // guarded by the transport's mutex
};

// One child write.
struct RailsPiece {
  uint64_t write;  // the user write's sequence number
  size_t rail;
  std::shared_ptr<const RailsRegion> src;
  uint64_t src_offset;
  std::shared_ptr<const RailsRemoteRegion> dst;
  std::shared_ptr<const RemoteRegion> dst_rail;  // dst on this piece's rail's connection
  uint64_t dst_offset;
  uint64_t length;
  uint32_t notify = kStripeNote;  // the user's (on the lead), or the layer's own
  // The user's notification: its number (1, 2, ...) from when it first went, else 0. The numbers
  // are the peer's count of what it passed up, so one numbered is passed up or the link is lost.
  uint64_t user_seq = 0;
  // On the lead: the number of the first user notification sent there after it, so the piece has
  // landed once the peer passed that one up. Elsewhere none (UINT64_MAX).
  uint64_t mark = UINT64_MAX;
  std::vector<uint64_t> fence;  // held, notifying: each rail's issued count to await
  bool writing = false;         // a sender thread is inside the write that reads it
  // Done (acknowledged, failed, or sent again elsewhere) while writing: settled, with this status,
  // once the sender is back.
  bool abandoned = false;
  hm_status abandoned_status = HM_OK;
  std::string abandoned_message;
};

// What a rail's sender thread does next for a link: a piece, or a message of the layer's.
struct RailsPost {
  enum class Kind : uint8_t { piece, acknowledge, lead, lead_ack, control };
  Kind kind = Kind::piece;
  uint64_t piece = 0;    // piece
  uint64_t control = 0;  // control: the user's control message of this number (in the log),
  uint64_t epoch = 0;    // queued in this epoch of the link's control messages
  // The rail's connection it was queued for (enqueue sets it): one queued for a connection since
  // gone is not sent on the rail's next.
  uint64_t generation = 0;
};

// A link's state; every member is guarded by the transport's mutex.
struct RailsLink : std::enable_shared_from_this<RailsLink> {
  struct Rail {
    std::string name;                                // the NIC, for messages
    std::shared_ptr<Connection> connection;          // null while the rail is down
    uint64_t generation = 0;                         // connections made so far, less one
    std::chrono::milliseconds cooldown = kCooldown;  // before the next try, while down
    std::chrono::steady_clock::time_point down_since;
    // Both ends have this connection: it was made by connect(), or the peer's first control
    // message on it came (a tcp dialer's connection is made before the other end asks for it).
    bool ready = true;
    // Counts of this connection of the rail: a new one starts from zero.
    uint64_t issued = 0;           // pieces issued, each acknowledged by the peer
    uint64_t posted = 0;           // of those, handed to the rail's transport
    uint64_t acked = 0;            // of those, acknowledged
    uint64_t landed = 0;           // the peer's notifications that landed here
    bool ack_queued = false;       // an acknowledgement waits in the sender's queue
    std::deque<uint64_t> unacked;  // ids of pieces issued, not yet acknowledged
  };
  struct Control {
    uint64_t seq;
    std::vector<uint8_t> payload;
  };
  struct UserWrite {
    uint64_t cookie;
    int open = 0;  // pieces not yet done
    hm_status status = HM_OK;
    std::string message;
  };

  ConnectionId id = 0;
  EndpointDescriptor peer;                       // the peer's whole endpoint
  std::vector<std::vector<uint8_t>> peer_parts;  // and each rail's part of it
  std::vector<Rail> rails;
  std::map<uint64_t, RailsPiece> pieces;  // open pieces by id (the child's cookie)
  uint64_t next_piece = 1;
  std::deque<UserWrite> writes;  // open user writes, in issue order
  uint64_t first_write = 0;      // the sequence number of writes.front()
  std::deque<uint64_t> held;     // lead pieces waiting, in order, behind a fence or a move
  bool lost = false;
  // Sending: the lead, its moves so far, and whether it is moving (kLead sent, kLeadAck awaited);
  // the pieces of the leads that failed, not yet acknowledged, in the order they were sent; the
  // user's notifications numbered so far, and the last one that went to a lead.
  size_t lead = 0;
  uint64_t moves = 0;
  bool moving = false;
  std::chrono::steady_clock::time_point move_deadline;  // unanswered by then: the lead moves on
  std::deque<uint64_t> stranded;
  uint64_t notes_numbered = 0, notes_sent = 0;
  // The user's control messages: numbered so far, not yet acknowledged (resent after a move), and
  // how many queued for the lead's sender are not yet sent (a direct send would overtake them).
  // A move begins and ends an epoch: what was queued before goes no more (it is queued again, in
  // order, once the peer answered). `sending` serializes direct sends, so they go out in their
  // numbers' order; taken before the mutex.
  uint64_t controls_numbered = 0;
  std::deque<Control> control_log;
  size_t control_log_bytes = 0;
  int controls_queued = 0;
  uint64_t control_epoch = 0;
  std::mutex sending;
  std::condition_variable controls_sent;  // controls_queued fell, or the link moved or was lost
  // Receiving: the rail the peer's user notifications and control messages come on (its move
  // that made it so: older moves, late on another rail, are ignored), and how many of each were
  // passed up here.
  size_t peer_lead = 0;
  uint64_t peer_moves = 0;
  // The answer to the peer's move waiting in a sender's queue (one is enough: it carries the
  // counts of when it goes): its rail and that rail's connection.
  bool lead_ack_queued = false;
  size_t lead_ack_rail = 0;
  uint64_t lead_ack_generation = 0;
  uint64_t notes_delivered = 0, controls_delivered = 0;
};

}  // namespace hetmesh::detail
