#include "ipc/ipc_ring_writer.hpp"

#include <fmt/format.h>

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>

namespace hetmesh::detail {
namespace {

// A ring slot not back after this long: the peer's progress thread is woken (await_credit).
constexpr int kNudgeAfterMs = 1;

}  // namespace

RingWriter::RingWriter(IpcLink& link)
    : link_(link),
      rings_(link.rings()),
      credits_(rings_.outgoing.slots()),
      registered_(rings_.outgoing.slot(0),
                  uint64_t{rings_.outgoing.slots()} * rings_.outgoing.slot_bytes(),
                  fmt::format("ipc: the staging ring to peer {}", link.peer_id())) {}

// A slot is taken before the source is touched: the source's bounce buffer is then held only for
// the copy, never while waiting on the peer, whose progress may need our reader thread to land a
// chunk through that same buffer.
void RingWriter::send(const IpcRegion& src, uint64_t src_offset, uint32_t region,
                      uint64_t dst_offset, uint64_t length, std::optional<uint32_t> notify) {
  if (length == 0) {
    link_.check_open();
    if (notify) link_.send_notification(*notify);
    return;
  }
  drained_ = false;  // before the first chunk: write() must never see it too early
  for (uint64_t sent = 0; sent < length;) {
    uint64_t n = std::min(length - sent, rings_.outgoing.slot_bytes());
    uint16_t slot = take_slot();
    // Straight into the slot: by the host, or by the source device's copy engine (the ring
    // registered with it), while the peer lands the chunk before.
    if (!src.access().direct()) registered_.ensure(src.device());
    src.access().copy_out(src_offset + sent, n, rings_.outgoing.slot(slot));
    Frame f = make_frame(kChunk);
    f.slot = slot;
    f.region = region;
    f.offset = dst_offset + sent;
    f.length = n;
    sent += n;
    if (sent == length) {
      f.flags = kLastChunk | (notify ? kWithNotify : 0);
      f.value = notify.value_or(0);
    }
    link_.send(f);
  }
}

void RingWriter::drain() {
  if (drained_) return;
  while (credits_ < rings_.outgoing.slots())
    await_credit();
  drained_ = true;
}

// A free slot of the outgoing ring, waiting for the peer to return one if none is. The peer
// handles chunks in order, so slots come back in the order they went out and the next free slot
// is always the oldest.
uint16_t RingWriter::take_slot() {
  while (credits_ == 0)
    await_credit();
  --credits_;
  auto slot = static_cast<uint16_t>(next_slot_);
  next_slot_ = (next_slot_ + 1) % rings_.outgoing.slots();
  return slot;
}

// Waits for the peer to hand back a slot. A slot that is not back within kNudgeAfterMs may be
// waiting for a reader that is not there (the peer's application stopped polling and its poller
// left without asking for wake-ups): its progress thread is woken to land the chunks.
void RingWriter::await_credit() {
  int fd = rings_.credits_in.get();
  pollfd readable{fd, POLLIN, 0};
  int ready;
  do {
    ready = ::poll(&readable, 1, kNudgeAfterMs);
  } while (ready < 0 && errno == EINTR);
  if (ready == 0) {
    link_.check_open();
    link_.nudge();
    do {
      ready = ::poll(&readable, 1, static_cast<int>(kProgressTimeout.count() * 1000));
    } while (ready < 0 && errno == EINTR);
  }
  link_.check_open();  // woken by close() or lose()
  if (ready == 0)
    throw Error(HM_ERR_TIMEOUT, fmt::format("peer {} returned no ring slot within {} s",
                                            link_.peer_id(), kProgressTimeout.count()));
  uint32_t slot = 0;
  ssize_t n = recv(fd, &slot, sizeof slot, MSG_DONTWAIT);
  if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR))
    throw Error(kStatusPeerLost, "the peer closed its ring credit channel");
  if (n < 0) return;  // spurious wake-up
  if (n != sizeof slot || slot != returned_slot_)
    throw Error(kStatusProtocolError,
                fmt::format("peer returned ring slot {}, expected slot {}", slot, returned_slot_));
  returned_slot_ = (returned_slot_ + 1) % rings_.outgoing.slots();
  ++credits_;
}

}  // namespace hetmesh::detail
