// The wire of one ipc connection: its unix socket, its shared-memory rings, and the reading of
// what the peer sends.
//
// Frames go each way through a MessageRing in shared memory. The socket carries only wake-up
// bytes and tells us when the peer dies (EOF). Two threads may read a link's incoming ring, one at
// a time (the "reader role"):
//  - the thread in Transport::poll, which claims the role of every link while it spins, reads
//    frames straight into its output (a notification costs no system call and no thread hop), and
//    hands the role back; it asks for wake-ups only when it is about to block, since a poller that
//    returns with events comes back for more, and a wake-up per frame would cost the writer a
//    system call and this side a thread hop each (a fifth of the time of a 4 KiB write);
//  - the link's progress thread, which sleeps on the socket and reads what arrives while nobody
//    polls, into the event queue. It is woken by a writer when this side asked for wake-ups, or
//    when the writer itself waits on this side (for room in the message ring, or for a staging
//    slot to come back: nudge()), so ring chunks land and credits return even when the
//    application has stopped polling.
// Events from one link stay in order: the progress thread queues what it read before it hands the
// role back, and a poller holding the role empties the queue before it reads the ring.
#pragma once

#include "common/socket_link.hpp"
#include "ipc/ipc_shared.hpp"
#include "ipc/ipc_wire.hpp"
#include "ipc/shm_ring.hpp"

#include <hetmesh/core/error.hpp>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace hetmesh::detail {

// The shared memory of a connection. Staging rings: ours (we write, the peer reads) with the
// channel on which the peer returns its slots, and the peer's (mapped read-only) with the channel
// on which we return them; credits have their own SOCK_SEQPACKET channels so that the writer reads
// them right where it waits for them. Message rings: ours (we produce) and the peer's (we consume).
struct RingLink {
  SharedRing outgoing;
  Fd credits_in;
  SharedRing incoming;
  Fd credits_out;
  MessageRing messages_out;
  MessageRing messages_in;
};

// Exchanges hellos on a freshly connected socket: our outgoing rings and the peer's end of our
// credit channel travel to the peer; the peer's rings and our end of its channel arrive here.
RingLink exchange_rings(const Fd& socket, const std::string& peer_id, uint32_t slots,
                        uint64_t slot_bytes, std::chrono::milliseconds timeout);

class IpcLink {
 public:
  IpcLink(ConnectionId id, std::shared_ptr<IpcShared> shared, std::string peer_id, Fd socket,
          RingLink rings);
  IpcLink(const IpcLink&) = delete;
  IpcLink& operator=(const IpcLink&) = delete;

  ConnectionId id() const { return id_; }
  const std::string& peer_id() const { return peer_id_; }
  bool alive() const { return alive_.load(std::memory_order_relaxed); }
  bool closing() const { return closing_.load(std::memory_order_relaxed); }
  // Throws Error(kStatusPeerLost) for a write still pending when the connection closes or the
  // peer is lost.
  void check_open() const {
    if (closing()) throw Error(kStatusPeerLost, "the connection was closed before the write ended");
    if (!alive()) throw Error(kStatusPeerLost, "the peer was lost before the write ended");
  }
  // The staging rings and credit channels; the outgoing side belongs to the connection's
  // completion thread.
  RingLink& rings() { return rings_; }

  // ---- sending (callers serialise their frames' order; this serialises the ring) ----

  // Appends a frame and its payload to the peer's message ring, waiting (bounded) for room, and
  // wakes the peer if it asked. With `more`, the frame is held (not yet visible) until the next
  // send without it, which makes every held frame visible at once: one publication, one fence and
  // one look at the peer's wake-up request for the lot. Throws Error(kStatusPeerLost) if the link
  // is closed or lost, Error(HM_ERR_TIMEOUT) if the peer reads nothing for kProgressTimeout.
  void send(const Frame& frame, const void* payload = nullptr, size_t size = 0, bool more = false);
  // Registers the incoming ring with `device`'s plugin now, for the chunks it lands in that
  // device's regions (else at the first such chunk).
  void register_ring_with(const Device& device) { ring_registered_.ensure(device); }
  // Makes the frames that sends with `more` held visible, if any (a write without `more` and
  // without a notification of its own ends the run). Throws Error(kStatusPeerLost) if waking the
  // peer fails.
  void flush() {
    std::lock_guard lock(send_mutex_);
    publish_held();
  }
  void send_notification(uint32_t value, bool more = false) {
    Frame f = make_frame(kNotify);
    f.value = value;
    send(f, nullptr, 0, more);
  }
  // Wakes the peer's progress thread whether or not it asked: we wait on the peer (a staging slot
  // to come back), and its application may have stopped polling. Throws as send does.
  void nudge();

  // ---- reading, by a poller ----

  // Takes the reader role if it is free (and the link is open), withdrawing the wake-up request.
  bool claim();
  // Whether frames wait in the incoming ring (a cheap hint).
  bool has_messages() const { return rings_.messages_in.has_data(); }
  // With the role: appends an event for each frame waiting. A malformed frame loses the peer.
  void read(std::vector<TransportEvent>& out);
  // Hands the role back. A poller about to block (`will_block`) asks for wake-ups first, and reads
  // what came before the request took effect into `out` (or the event queue if null); one that
  // returns with events leaves the frames that come meanwhile for its next poll.
  void unclaim(std::vector<TransportEvent>* out, bool will_block);

  // ---- the progress thread ----
  // Sleeps on the socket, reads while nobody polls, reports the peer lost at EOF. Returns once the
  // link is closed or lost.
  void run_progress();

  // ---- ending ----
  // Reports the peer lost once, with the first reason, and wakes everything that waits on it.
  void lose(const std::string& reason);
  // A send or a write failed: the connection ends. What the peer published before it went is
  // delivered before the loss, as when the progress thread finds it gone: read here if nobody
  // holds the ring's reader role; else, if the peer closed its end, left to the progress thread,
  // which reads first (the closed socket wakes it). Never call it holding the role.
  void lost_on_send(const std::string& reason);
  // Marks the link closing (no more peer_lost events or reads) and wakes its waiters.
  void close();
  // After close(): waits until no poller reads this link any more.
  void quiesce() { std::lock_guard role(role_); }

 private:
  void read_frames(std::vector<TransportEvent>& out);
  bool read_into_queue(std::vector<TransportEvent>& batch);
  void receive_chunk(const Frame& f, std::vector<TransportEvent>& out);
  void return_slot(uint16_t slot);
  void await_room(uint64_t bytes);
  // Makes the frames held by sends with `more` visible. Caller holds send_mutex_.
  void publish_held();
  void wake_peer();
  void wake_progress();
  // Empties the socket of wake-up bytes; false at EOF or on an error (then `why` says which).
  bool drain_wakeups(std::string& why);

  ConnectionId id_;
  std::shared_ptr<IpcShared> shared_;
  std::string peer_id_;
  Fd socket_;
  Fd self_wake_;  // eventfd: a poller that leaves frames behind wakes the progress thread
  RingLink rings_;
  HostRegistrations ring_registered_;  // the incoming ring, with the regions' plugins (reader's)
  std::atomic<bool> alive_{true};
  std::atomic<bool> closing_{false};
  std::mutex send_mutex_;  // the outgoing message ring
  uint64_t held_ = 0;      // bytes put in it and not yet published (send with `more`)
  std::mutex role_;        // the reader role of the incoming message ring
};

}  // namespace hetmesh::detail
