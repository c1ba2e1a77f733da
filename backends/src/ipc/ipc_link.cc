#include "ipc/ipc_link.hpp"

#include <fmt/format.h>

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>
#include <utility>

namespace hetmesh::detail {

RingLink exchange_rings(const Fd& socket, const std::string& peer_id, uint32_t slots,
                        uint64_t slot_bytes, std::chrono::milliseconds timeout) {
  RingLink link;
  link.outgoing = SharedRing::create(slots, slot_bytes);
  link.messages_out = MessageRing::create(kMessageRingBytes);
  int pair[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) != 0)
    throw Error(HM_ERR_BACKEND,
                fmt::format("socketpair for the ring credit channel: {}", describe_errno(errno)));
  link.credits_in = Fd(pair[0]);
  Fd peer_end(pair[1]);
  Hello mine{kHelloMagic, kProtocolVersion, static_cast<uint16_t>(slots), slot_bytes,
             kMessageRingBytes};
  int fds[] = {link.outgoing.fd(), peer_end.get(), link.messages_out.fd()};
  send_with_fds(socket.get(), &mine, sizeof mine, fds, "ipc hello");
  peer_end.reset();  // only the peer holds it now, so its death reads as EOF on credits_in

  Hello theirs{};
  std::vector<Fd> received =
      receive_with_fds(socket.get(), &theirs, sizeof theirs, 3, timeout, "ipc hello");
  if (theirs.magic != kHelloMagic || theirs.version != kProtocolVersion)
    throw Error(kStatusProtocolError,
                fmt::format("ipc peer {} sent a bad hello (magic {:08x}, version {}; expected "
                            "version {})",
                            peer_id, theirs.magic, theirs.version, kProtocolVersion));
  if (theirs.ring_slots == 0 || theirs.ring_slots > kMaxRingSlots || theirs.slot_bytes == 0 ||
      theirs.slot_bytes > kMaxSlotBytes)
    throw Error(
        kStatusProtocolError,
        fmt::format("ipc peer {} announced a ring of {} slots of {} bytes (limits: {} "
                    "slots of {} bytes)",
                    peer_id, theirs.ring_slots, theirs.slot_bytes, kMaxRingSlots, kMaxSlotBytes));
  if (theirs.message_ring_bytes < kMinMessageRingBytes ||
      theirs.message_ring_bytes > kMaxMessageRingBytes)
    throw Error(
        kStatusProtocolError,
        fmt::format("ipc peer {} announced a message ring of {} bytes (limits: {} to {})", peer_id,
                    theirs.message_ring_bytes, kMinMessageRingBytes, kMaxMessageRingBytes));
  int type = 0;
  socklen_t length = sizeof type;
  if (getsockopt(received[1].get(), SOL_SOCKET, SO_TYPE, &type, &length) != 0 ||
      type != SOCK_SEQPACKET)
    throw Error(
        kStatusProtocolError,
        fmt::format("ipc peer {} sent a credit channel that is not a SEQPACKET socket", peer_id));
  try {
    link.incoming = SharedRing::adopt(std::move(received[0]), theirs.ring_slots, theirs.slot_bytes);
    link.messages_in = MessageRing::adopt(std::move(received[2]), theirs.message_ring_bytes);
  } catch (const Error& e) {
    throw Error(e.status(), fmt::format("ipc peer {}: {}", peer_id, e.what()));
  }
  link.credits_out = std::move(received[1]);
  return link;
}

IpcLink::IpcLink(ConnectionId id, std::shared_ptr<IpcShared> shared, std::string peer_id, Fd socket,
                 RingLink rings)
    : id_(id),
      shared_(std::move(shared)),
      peer_id_(std::move(peer_id)),
      socket_(std::move(socket)),
      self_wake_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)),
      rings_(std::move(rings)),
      ring_registered_(rings_.incoming.slot(0),
                       uint64_t{rings_.incoming.slots()} * rings_.incoming.slot_bytes(),
                       fmt::format("ipc: the staging ring from peer {}", peer_id_)) {
  if (!self_wake_)
    throw Error(HM_ERR_BACKEND,
                fmt::format("eventfd for the ipc progress thread: {}", describe_errno(errno)));
}

// ---- sending ----

void IpcLink::send(const Frame& frame, const void* payload, size_t size, bool more) {
  std::lock_guard lock(send_mutex_);
  if (closing_) throw Error(kStatusPeerLost, "the connection was closed");
  if (!alive_) throw Error(kStatusPeerLost, fmt::format("the peer {} was lost", peer_id_));
  MessageRing& ring = rings_.messages_out;
  uint64_t bytes = record_bytes(size);
  if (!ring.has_room(held_ + bytes)) {
    // The peer can make room only from what it sees: what is held goes first.
    publish_held();
    if (!ring.has_room(bytes)) await_room(bytes);
  }
  ring.put(held_, &frame, sizeof frame);
  if (size > 0) ring.put(held_ + sizeof frame, payload, size);
  held_ += bytes;
  if (!more) publish_held();
}

void IpcLink::publish_held() {
  if (held_ == 0) return;
  const uint64_t bytes = std::exchange(held_, 0);
  if (rings_.messages_out.publish(bytes)) wake_peer();
}

// The peer reads its ring whenever it polls, and its progress thread does when it does not, so a
// full ring is a peer that is stopped or flooded: wait for it, politely and not forever.
void IpcLink::await_room(uint64_t bytes) {
  MessageRing& ring = rings_.messages_out;
  auto now = std::chrono::steady_clock::now();
  auto deadline = now + kProgressTimeout;
  auto nudge_at = now;
  auto nap = std::chrono::microseconds(5);
  while (!ring.has_room(bytes)) {
    if (closing_) throw Error(kStatusPeerLost, "the connection was closed");
    if (!alive_) throw Error(kStatusPeerLost, fmt::format("the peer {} was lost", peer_id_));
    now = std::chrono::steady_clock::now();
    if (now > deadline)
      throw Error(HM_ERR_TIMEOUT, fmt::format("peer {} read nothing of its message ring for {} s",
                                              peer_id_, kProgressTimeout.count()));
    // Whether or not the peer asked: its poller may have left without asking (unclaim).
    if (now >= nudge_at) {
      ring.take_wakeup_request();
      wake_peer();
      nudge_at = now + std::chrono::milliseconds(1);
    }
    std::this_thread::sleep_for(nap);
    nap = std::min<std::chrono::microseconds>(2 * nap, std::chrono::milliseconds(1));
  }
}

void IpcLink::wake_peer() {
  uint8_t byte = 1;
  for (;;) {
    ssize_t n = ::send(socket_.get(), &byte, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n == 1) return;
    if (n < 0 && errno == EINTR) continue;
    // A full socket holds wake-ups the peer has yet to read: it is awake, or will be.
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    throw Error(kStatusPeerLost, fmt::format("waking peer {} failed: {}", peer_id_,
                                             n < 0 ? std::strerror(errno) : "nothing sent"));
  }
}

void IpcLink::nudge() {
  if (closing_) throw Error(kStatusPeerLost, "the connection was closed");
  wake_peer();
}

void IpcLink::wake_progress() {
  uint64_t one = 1;
  // Only fails when the counter is about to overflow, i.e. a wake-up is pending anyway.
  [[maybe_unused]] ssize_t n = ::write(self_wake_.get(), &one, sizeof one);
}

// ---- reading ----

bool IpcLink::claim() {
  if (!role_.try_lock()) return false;
  if (closing_) {
    role_.unlock();
    return false;
  }
  rings_.messages_in.request_wakeup(false);  // we are watching: the peer need not call
  return true;
}

void IpcLink::unclaim(std::vector<TransportEvent>* out, bool will_block) {
  if (!will_block) {
    role_.unlock();
    return;
  }
  MessageRing& ring = rings_.messages_in;
  ring.request_wakeup(true);
  // Frames published before the request took effect come with no wake-up: read them now, and
  // leave any that keep coming to the progress thread.
  if (ring.has_data()) {
    if (out != nullptr) {
      read(*out);
    } else {
      std::vector<TransportEvent> batch;
      read_into_queue(batch);
    }
  }
  bool left = alive_ && ring.has_data();
  role_.unlock();
  if (left) wake_progress();
}

void IpcLink::read(std::vector<TransportEvent>& out) {
  try {
    read_frames(out);
  } catch (const Error& e) {
    lose(e.what());
  }
}

// Copies each frame out of shared memory before looking at it (the peer can change the ring under
// us), checks it, and acts on it. Reads what was published when it started, so a peer that keeps
// writing cannot keep us here.
void IpcLink::read_frames(std::vector<TransportEvent>& out) {
  MessageRing& ring = rings_.messages_in;
  if (!ring.has_data() || !alive_ || closing_) return;
  uint64_t available = ring.readable();
  while (available > 0 && alive_) {
    if (available < sizeof(Frame))
      throw Error(kStatusProtocolError,
                  fmt::format("the message ring ends in a partial frame of {} bytes", available));
    Frame f;
    ring.get(0, &f, sizeof f);
    if (f.magic != kFrameMagic)
      throw Error(kStatusProtocolError, fmt::format("bad frame (magic {:08x})", f.magic));
    uint64_t bytes = sizeof f;
    switch (f.type) {
      case kNotify: {
        TransportEvent& note = out.emplace_back();
        note.type = TransportEvent::Type::notification;
        note.connection = id_;
        note.value = f.value;
        break;
      }
      case kChunk:
        receive_chunk(f, out);
        break;
      case kControl: {
        if (f.length > Connection::kMaxControlBytes)
          throw Error(kStatusProtocolError, fmt::format("control message of {} bytes exceeds {}",
                                                        f.length, Connection::kMaxControlBytes));
        bytes = record_bytes(f.length);
        if (bytes > available)
          throw Error(kStatusProtocolError,
                      fmt::format("control message of {} bytes runs past the {} bytes published",
                                  f.length, available));
        TransportEvent control{TransportEvent::Type::control, id_};
        control.payload.resize(f.length);
        ring.get(sizeof f, control.payload.data(), f.length);
        out.push_back(std::move(control));
        break;
      }
      default:
        throw Error(kStatusProtocolError, fmt::format("unknown frame type {}", f.type));
    }
    ring.consume(bytes);
    available -= bytes;
  }
  ring.hand_back();
}

// Copies one ring slot into a region, after checking the frame names a slot, a region of ours and
// a range inside it: a bad frame ends the connection before a byte lands.
void IpcLink::receive_chunk(const Frame& f, std::vector<TransportEvent>& out) {
  const SharedRing& ring = rings_.incoming;
  if (f.slot >= ring.slots() || f.length > ring.slot_bytes())
    throw Error(kStatusProtocolError,
                fmt::format("ring chunk of {} bytes in slot {} does not fit the ring ({} slots "
                            "of {} bytes)",
                            f.length, f.slot, ring.slots(), ring.slot_bytes()));
  std::shared_ptr<IpcRegion> region = shared_->find_region(f.region);
  if (!region)
    throw Error(kStatusProtocolError,
                fmt::format("write to region {}, which is not registered here", f.region));
  if (f.offset > region->size() || f.length > region->size() - f.offset)
    throw Error(kStatusProtocolError,
                fmt::format("write to region {} at [{}, +{}) is outside its {} bytes; refused",
                            f.region, f.offset, f.length, region->size()));
  // Straight from the slot: by the host, or by the region's copy engine (the ring registered with
  // it where it can be), while the peer fills the next slot.
  if (!region->access().direct()) ring_registered_.ensure(region->device());
  region->access().copy_in(f.offset, ring.slot(f.slot), f.length);
  return_slot(f.slot);
  if ((f.flags & kLastChunk) && (f.flags & kWithNotify)) {
    TransportEvent& note = out.emplace_back();
    note.type = TransportEvent::Type::notification;
    note.connection = id_;
    note.value = f.value;
  }
}

// Never blocks: the peer has at most as many slots out as its ring holds, and a SEQPACKET socket
// buffers that many tiny messages.
void IpcLink::return_slot(uint16_t slot) {
  uint32_t message = slot;
  if (::send(rings_.credits_out.get(), &message, sizeof message, MSG_NOSIGNAL | MSG_DONTWAIT) !=
      static_cast<ssize_t>(sizeof message))
    throw Error(kStatusPeerLost,
                fmt::format("returning ring slot {} failed: {}", slot, std::strerror(errno)));
}

// ---- the progress thread ----

void IpcLink::run_progress() {
  MessageRing& ring = rings_.messages_in;
  std::vector<TransportEvent> batch;
  std::string why;
  for (;;) {
    bool more;
    {
      // Waits for a poller's spin at most: it then reads or hands the role back.
      std::lock_guard role(role_);
      if (!read_into_queue(batch)) return;
      ring.request_wakeup(true);
      more = ring.has_data();  // published before the request took effect: read it now
    }
    if (closing_ || !alive_) return;
    if (more) continue;
    pollfd waits[2] = {{socket_.get(), POLLIN, 0}, {self_wake_.get(), POLLIN, 0}};
    // Woken by the peer, a poller, close() or the peer's death; the timeout only bounds the
    // damage of a wake-up a misbehaving peer never sends.
    int ready = ::poll(waits, 2, 1000);
    if (closing_ || !alive_) return;
    if (ready < 0 && errno != EINTR) {
      lose(fmt::format("waiting on the socket failed: {}", std::strerror(errno)));
      return;
    }
    if (ready <= 0) continue;
    if (waits[1].revents != 0) {
      uint64_t count;
      [[maybe_unused]] ssize_t n = ::read(self_wake_.get(), &count, sizeof count);
    }
    if (waits[0].revents != 0 && !drain_wakeups(why)) {
      // The peer is gone: what it sent before it went is delivered first.
      std::lock_guard role(role_);
      if (read_into_queue(batch)) lose(why);
      return;
    }
  }
}

// With the role: queues the events of the frames waiting, before the role goes (a poller may read
// on right after). False if a malformed frame lost the peer, which is reported after the events
// of the frames before it.
bool IpcLink::read_into_queue(std::vector<TransportEvent>& batch) {
  try {
    read_frames(batch);
  } catch (const Error& e) {
    shared_->events.push_all(batch);
    lose(e.what());
    return false;
  }
  shared_->events.push_all(batch);
  return true;
}

bool IpcLink::drain_wakeups(std::string& why) {
  uint8_t bytes[256];
  for (;;) {
    ssize_t n = ::recv(socket_.get(), bytes, sizeof bytes, MSG_DONTWAIT);
    if (n > 0) continue;
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    why = n == 0 ? std::string("the peer closed the connection")
                 : fmt::format("receiving from the peer failed: {}", std::strerror(errno));
    return false;
  }
}

// ---- ending ----

void IpcLink::lose(const std::string& reason) {
  if (!alive_.exchange(false)) return;
  if (!closing_) {
    TransportEvent lost{TransportEvent::Type::peer_lost, id_};
    lost.status = kStatusPeerLost;
    lost.message = fmt::format("ipc peer {}: {}", peer_id_, reason);
    shared_->events.push(std::move(lost));
  }
  socket_.shutdown();
  rings_.credits_in.shutdown();
  wake_progress();
}

void IpcLink::lost_on_send(const std::string& reason) {
  if (!role_.try_lock()) {
    // A peer that closed its end is found by the progress thread, which reads first; any other
    // failure (a copy engine's) ends the connection now.
    if (net::hung_up(socket_.get()))
      wake_progress();
    else
      lose(reason);
    return;
  }
  std::vector<TransportEvent> batch;
  const bool read_well = read_into_queue(batch);  // a malformed frame loses the peer itself
  role_.unlock();
  if (read_well) lose(reason);
}

void IpcLink::close() {
  closing_ = true;
  socket_.shutdown();
  rings_.credits_in.shutdown();
  wake_progress();
}

}  // namespace hetmesh::detail
