// The writer's end of a connection's outgoing staging ring: a write that cannot go straight into
// the peer's memory is copied slot by slot into the ring, each slot announced by a chunk frame;
// the peer lands the chunk in its region and hands the slot back on the ring's credit channel.
// Only the connection's completion thread writes through it.
#pragma once

#include "ipc/ipc_link.hpp"
#include "ipc/ipc_shared.hpp"

#include <atomic>
#include <cstdint>
#include <optional>

namespace hetmesh::detail {

class RingWriter {
 public:
  explicit RingWriter(IpcLink& link);

  // Copies [src_offset, +length) of `src` through the ring into region `region` of the peer at
  // `dst_offset`, the last chunk carrying `notify`. Throws Error as IpcLink::send does, and if
  // the peer returns no slot within kProgressTimeout or returns the wrong one.
  void send(const IpcRegion& src, uint64_t src_offset, uint32_t region, uint64_t dst_offset,
            uint64_t length, std::optional<uint32_t> notify);
  // Registers the outgoing ring with `device`'s plugin now, for chunks from that device's regions
  // (else at the first such chunk).
  void register_with(const Device& device) { registered_.ensure(device); }
  // Waits until the peer has handed back every slot, i.e. landed every chunk sent so far.
  void drain();
  // Every chunk sent so far has been landed by the peer. Read by write() under the connection's
  // queue lock, written by the completion thread.
  bool drained() const { return drained_; }

 private:
  uint16_t take_slot();
  void await_credit();

  IpcLink& link_;
  RingLink& rings_;  // the link's
  uint32_t credits_;
  uint32_t next_slot_ = 0;
  uint32_t returned_slot_ = 0;
  HostRegistrations registered_;  // the outgoing ring, with the sources' plugins
  std::atomic<bool> drained_{true};
};

}  // namespace hetmesh::detail
