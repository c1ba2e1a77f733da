// One connection of a rails transport (rails_transport.cc): a connection of every rail's transport
// to the peer's rail of the same index, and the striping of writes over them.
//
// A write below kStripeMin is one piece on the first rail. A larger one is cut into one stripe per
// rail that is up; the stripes of the other rails each go with a notification of their own, which
// the peer's rails layer never passes up: it answers it with an acknowledgement (a control message
// on that rail carrying how many of that rail's stripes have landed, with their staged copies
// done). The first rail's stripe goes at once but for its last bytes, which carry the user's
// notification and wait ("held") until every stripe of another rail issued before them is
// acknowledged, whatever the rails' transports are (verbs completes a write once it is placed,
// tcp once it is sent). Pieces for the first rail issued after a held one wait behind it. So:
// a notification is raised only after every byte written before it has landed; the writes
// themselves may land in any order (unlike one transport's, whose writes all land in order: a
// stripe can overtake an earlier write's bytes on the first rail, or bytes sent there again after
// a rail failed), so a write must not overlap one whose landing the peer has not confirmed.
// The first rail's notifications and control messages are the user's. A write is done once each
// of its pieces on the first rail completed and each stripe of another rail was acknowledged;
// writes are done in the order they were issued, and never while a rail's sender thread is still
// inside the write that reads a piece's memory.
//
// A rail other than the first that fails (its connection lost, a write failed, a malformed
// acknowledgement) is taken out: its stripes not yet acknowledged go again on the first rail,
// ahead of anything held there, which rewrites the same bytes where they had landed already.
// After a cooldown (kCooldown, doubled after each try and each failure that follows a try, up to
// kCooldownMost, and back to kCooldown once the rail carried a stripe again) both ends
// connect that rail again, each on its own, as connect() did; once its new connection is made it
// takes stripes again, once each end heard the other on it (an acknowledgement of nothing, sent
// by each as it has the connection), its counts starting from zero (a generation later: remote
// regions are imported on it again when first written). A failed first rail fails the connection
// (peer_lost, naming it); moving the notifications to another rail is not built.
#pragma once

#include "common/event_queue.hpp"

#include <hetmesh/transport/transport.hpp>

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace hetmesh::detail {

constexpr uint64_t kStripeMin = 512 << 10;  // smaller writes take the first rail alone
constexpr uint64_t kStripeAlign = 4096;
constexpr uint64_t kNotifyTail = 64;  // the first rail's last bytes, with the notification
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
  std::optional<uint32_t> notify;  // the user's (first rail), or the stripe's own (0)
  std::vector<uint64_t> fence;     // first rail, notifying: each rail's issued count to await
  bool acknowledged = false;       // another rail's stripe: done by the peer's acknowledgement
  bool writing = false;            // a sender thread is inside the write that reads it
  // Done (acknowledged, failed, or sent again elsewhere) while writing: settled, with this status,
  // once the sender is back.
  bool abandoned = false;
  hm_status abandoned_status = HM_OK;
  std::string abandoned_message;
};

// What a rail's sender thread does next for a link.
struct RailsPost {
  uint64_t piece = 0;                   // a piece of the link's, or
  std::optional<uint64_t> acknowledge;  // the count of stripes landed here, to tell the peer
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
    uint64_t issued = 0;           // stripes issued that the peer acknowledges
    uint64_t posted = 0;           // of those, handed to the rail's transport
    uint64_t acked = 0;            // of those, acknowledged
    uint64_t landed = 0;           // the peer's stripes that landed here
    bool ack_queued = false;       // an acknowledgement waits in the sender's queue
    std::deque<uint64_t> unacked;  // ids of stripes issued, not yet acknowledged
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
  std::deque<uint64_t> held;     // first-rail pieces waiting, in order, behind a fence
  bool lost = false;
};

}  // namespace hetmesh::detail
