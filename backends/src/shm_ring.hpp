// The ipc transport's staging ring: one sealed memfd per connection direction, created by the
// writer and handed to the reader over the connection's unix socket (SCM_RIGHTS), so no file
// system path or /proc access is involved. The ring is cut into equal slots; which slot holds what
// is said by the frames on the socket, never by the shared memory itself.
#pragma once

#include "socket_link.hpp"

#include <chrono>
#include <cstdint>
#include <span>
#include <vector>

namespace hetmesh::detail {

class SharedRing {
 public:
  SharedRing() = default;
  SharedRing(SharedRing&& other) noexcept;
  SharedRing& operator=(SharedRing&& other) noexcept;
  SharedRing(const SharedRing&) = delete;
  ~SharedRing();

  // A new ring of `slots` × `slot_bytes`, mapped read-write and sealed against resizing, so a
  // reader that maps it can never fault on a page that vanished.
  static SharedRing create(uint32_t slots, uint64_t slot_bytes);
  // Maps a peer's ring read-only. Throws Error(kStatusProtocolError) unless `fd` is a memfd sealed
  // against shrinking and at least slots × slot_bytes long.
  static SharedRing adopt(Fd fd, uint32_t slots, uint64_t slot_bytes);

  int fd() const { return fd_.get(); }
  uint32_t slots() const { return slots_; }
  uint64_t slot_bytes() const { return slot_bytes_; }
  uint8_t* slot(uint32_t index) const { return base_ + uint64_t{index} * slot_bytes_; }

 private:
  void unmap();
  Fd fd_;
  uint8_t* base_ = nullptr;
  uint32_t slots_ = 0;
  uint64_t slot_bytes_ = 0;
};

// Sends `size` bytes with `fds` attached (SCM_RIGHTS). Throws Error(kStatusPeerLost) naming `what`.
void send_with_fds(int socket, const void* data, size_t size, std::span<const int> fds,
                   const char* what);
// Receives `size` bytes and the `count` descriptors sent with them, waiting at most `timeout`.
// Throws Error(HM_ERR_TIMEOUT) when they do not come in time, Error(kStatusPeerLost) if the peer
// closed, Error(kStatusProtocolError) if other than `count` descriptors came with the bytes.
std::vector<Fd> receive_with_fds(int socket, void* data, size_t size, size_t count,
                                 std::chrono::milliseconds timeout, const char* what);

}  // namespace hetmesh::detail
