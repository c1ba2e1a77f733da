// The ipc transport's shared memory, per connection direction, each a sealed memfd created by the
// writer and handed to the reader over the connection's unix socket (SCM_RIGHTS), so no file
// system path or /proc access is involved:
//  - the staging ring (SharedRing), cut into equal slots; which slot holds what is said by the
//    frames of the message ring, never by the slots themselves;
//  - the message ring (MessageRing), which carries those frames: a lock-free single-producer,
//    single-consumer ring of records with a wake-up handshake.
// Both processes can write the message ring's positions, so each side checks every value it reads
// from shared memory before trusting it.
#pragma once

#include "common/socket_link.hpp"

#include <atomic>
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
  // Maps a peer's ring, read-write so that a copy engine can register it (this side only reads
  // it). Throws Error(kStatusProtocolError) unless `fd` is a memfd sealed against shrinking and at
  // least slots × slot_bytes long.
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

// A ring of `capacity` bytes (a power of two) behind one page of positions: the producer's
// position (bytes published so far), the consumer's (bytes consumed so far) and the consumer's
// wake-up request, each on its own cache line, so that the producer's look at the request after
// every publish stays in its cache while the consumer moves its position. Records are written at
// the producer's position and become visible together when it publishes; the consumer copies them
// out before handing the bytes back. Neither side blocks here: waiting, and the wake-up it needs,
// is the caller's.
//
// The wake-up handshake ("sleeping flag"): a consumer about to sleep requests a wake-up, then
// checks for data once more; a producer publishes, then checks for a request, and if there is one
// takes it and wakes the consumer (the caller sends a byte on the socket). Sequentially consistent
// fences on both sides mean at least one of them sees the other, so no record is left unseen, and
// a busy consumer that never requests one costs the producer no system call.
class MessageRing {
 public:
  static constexpr uint64_t kHeaderBytes = 4096;

  MessageRing() = default;
  MessageRing(MessageRing&& other) noexcept;
  MessageRing& operator=(MessageRing&& other) noexcept;
  MessageRing(const MessageRing&) = delete;
  ~MessageRing();

  // A new, empty ring whose consumer requests a wake-up (it has not started polling yet).
  static MessageRing create(uint64_t capacity);
  // Maps a peer's ring read-write (the consumer writes its position). Throws
  // Error(kStatusProtocolError) unless `fd` is a memfd sealed against shrinking and large enough.
  static MessageRing adopt(Fd fd, uint64_t capacity);

  int fd() const { return fd_.get(); }
  uint64_t capacity() const { return capacity_; }

  // ---- the producer ----
  // Whether `size` more bytes may be written now. Reads the consumer's position only when the one
  // read last leaves too little room, so a producer that keeps ahead touches the consumer's cache
  // line only to look for a wake-up request. Throws Error(kStatusProtocolError) if that position
  // is impossible.
  bool has_room(uint64_t size);
  // Copies `size` bytes to `offset` past the producer's position, not yet visible; the caller
  // checked has_room().
  void put(uint64_t offset, const void* data, uint64_t size);
  // Makes `size` more bytes visible. True if the consumer had requested a wake-up: the request is
  // taken, and the caller must wake the consumer.
  bool publish(uint64_t size);
  // Takes a pending wake-up request without publishing; true if there was one.
  bool take_wakeup_request();

  // ---- the consumer ----
  // Whether bytes are waiting (a cheap check, no validation).
  bool has_data() const {
    return std::atomic_ref<uint64_t>(header()->produced).load(std::memory_order_relaxed) !=
           consumed_;
  }
  // Bytes published and not consumed yet. Throws Error(kStatusProtocolError) if the producer's
  // position is impossible.
  uint64_t readable();
  // Copies `size` bytes from `offset` past the consumer's position; the caller checked readable().
  void get(uint64_t offset, void* data, uint64_t size) const;
  // Moves past `size` bytes; they go back to the producer at the next hand_back().
  void consume(uint64_t size) { consumed_ += size; }
  // Publishes the consumer's position: the bytes consumed so far may be written again.
  void hand_back();
  // Requests (true) or withdraws (false) a wake-up on the next publish. A request is followed by a
  // full fence, so a has_data() after it sees every record published before the producer could
  // have missed the request. Withdrawing one that is not there writes nothing (the producer reads
  // the request's cache line after every publish).
  void request_wakeup(bool requested);

 private:
  struct Header {
    alignas(64) uint64_t produced;
    alignas(64) uint64_t consumed;
    alignas(64) uint32_t wakeup_requested;
  };
  static_assert(sizeof(Header) <= kHeaderBytes);
  static_assert(std::atomic_ref<uint64_t>::is_always_lock_free &&
                std::atomic_ref<uint32_t>::is_always_lock_free);

  Header* header() const { return reinterpret_cast<Header*>(base_); }
  uint8_t* data() const { return base_ + kHeaderBytes; }
  void unmap();

  Fd fd_;
  uint8_t* base_ = nullptr;
  uint64_t capacity_ = 0;
  uint64_t produced_ = 0;  // the producer's own position; the shared copy is only published
  uint64_t room_end_ =
      0;  // the producer may write up to here (consumer position last read + capacity)
  uint64_t consumed_ = 0;  // the consumer's own position
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
