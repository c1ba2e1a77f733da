#include "ipc/shm_ring.hpp"

#include <fmt/format.h>

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace hetmesh::detail {
namespace {

constexpr int kRequiredSeals = F_SEAL_SHRINK | F_SEAL_GROW;
constexpr size_t kMaxFds = 4;  // per message

uint64_t ring_bytes(uint32_t slots, uint64_t slot_bytes) {
  return uint64_t{slots} * slot_bytes;
}

uint8_t* map_ring(int fd, uint64_t bytes, int protection, const char* what) {
  void* p = mmap(nullptr, bytes, protection, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED)
    throw Error(HM_ERR_OUT_OF_MEMORY, fmt::format("mapping the {} ring of {} bytes failed: {}",
                                                  what, bytes, std::strerror(errno)));
  return static_cast<uint8_t*>(p);
}

// A memfd of `bytes`, sealed against resizing.
Fd sealed_memfd(const char* name, uint64_t bytes) {
  Fd fd(memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd)
    throw Error(HM_ERR_OUT_OF_MEMORY,
                fmt::format("memfd_create for {} failed: {}", name, describe_errno(errno)));
  if (ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0 ||
      fcntl(fd.get(), F_ADD_SEALS, kRequiredSeals | F_SEAL_SEAL) != 0)
    throw Error(HM_ERR_OUT_OF_MEMORY,
                fmt::format("sizing {} to {} bytes failed: {}", name, bytes, std::strerror(errno)));
  return fd;
}

// Refuses a peer's ring that could shrink under our mapping or is smaller than announced.
void check_peer_memfd(int fd, uint64_t bytes, const std::string& announced) {
  int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & kRequiredSeals) != kRequiredSeals)
    throw Error(kStatusProtocolError,
                "the peer's ring is not a memfd sealed against resizing; refused");
  struct stat st {};
  if (fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) < bytes)
    throw Error(kStatusProtocolError,
                fmt::format("the peer's ring has {} bytes, its hello announced {}",
                            static_cast<uint64_t>(st.st_size), announced));
}

}  // namespace

SharedRing::SharedRing(SharedRing&& other) noexcept
    : fd_(std::move(other.fd_)),
      base_(std::exchange(other.base_, nullptr)),
      slots_(std::exchange(other.slots_, 0)),
      slot_bytes_(std::exchange(other.slot_bytes_, 0)) {}

SharedRing& SharedRing::operator=(SharedRing&& other) noexcept {
  if (this != &other) {
    unmap();
    fd_ = std::move(other.fd_);
    base_ = std::exchange(other.base_, nullptr);
    slots_ = std::exchange(other.slots_, 0);
    slot_bytes_ = std::exchange(other.slot_bytes_, 0);
  }
  return *this;
}

SharedRing::~SharedRing() {
  unmap();
}

void SharedRing::unmap() {
  if (base_ != nullptr) munmap(base_, ring_bytes(slots_, slot_bytes_));
  base_ = nullptr;
}

SharedRing SharedRing::create(uint32_t slots, uint64_t slot_bytes) {
  uint64_t bytes = ring_bytes(slots, slot_bytes);
  Fd fd = sealed_memfd("hetmesh-ipc-ring", bytes);
  SharedRing ring;
  ring.base_ = map_ring(fd.get(), bytes, PROT_READ | PROT_WRITE, "outgoing");
  ring.fd_ = std::move(fd);
  ring.slots_ = slots;
  ring.slot_bytes_ = slot_bytes;
  return ring;
}

SharedRing SharedRing::adopt(Fd fd, uint32_t slots, uint64_t slot_bytes) {
  uint64_t bytes = ring_bytes(slots, slot_bytes);
  check_peer_memfd(fd.get(), bytes, fmt::format("{} × {}", slots, slot_bytes));
  SharedRing ring;
  // Read-write, though this side only copies out of the peer's ring: a copy engine registers only
  // writable memory (cuMemHostRegister refuses a read-only mapping), and the writer never reads
  // its slots back, so nothing written here reaches the peer.
  ring.base_ = map_ring(fd.get(), bytes, PROT_READ | PROT_WRITE, "incoming");
  ring.fd_ = std::move(fd);
  ring.slots_ = slots;
  ring.slot_bytes_ = slot_bytes;
  return ring;
}

// ---- MessageRing ----

MessageRing::MessageRing(MessageRing&& other) noexcept
    : fd_(std::move(other.fd_)),
      base_(std::exchange(other.base_, nullptr)),
      capacity_(std::exchange(other.capacity_, 0)),
      produced_(std::exchange(other.produced_, 0)),
      room_end_(std::exchange(other.room_end_, 0)),
      consumed_(std::exchange(other.consumed_, 0)) {}

MessageRing& MessageRing::operator=(MessageRing&& other) noexcept {
  if (this != &other) {
    unmap();
    fd_ = std::move(other.fd_);
    base_ = std::exchange(other.base_, nullptr);
    capacity_ = std::exchange(other.capacity_, 0);
    produced_ = std::exchange(other.produced_, 0);
    room_end_ = std::exchange(other.room_end_, 0);
    consumed_ = std::exchange(other.consumed_, 0);
  }
  return *this;
}

MessageRing::~MessageRing() {
  unmap();
}

void MessageRing::unmap() {
  if (base_ != nullptr) munmap(base_, kHeaderBytes + capacity_);
  base_ = nullptr;
}

MessageRing MessageRing::create(uint64_t capacity) {
  if (capacity == 0 || (capacity & (capacity - 1)) != 0)
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("message ring of {} bytes: not a power of two", capacity));
  Fd fd = sealed_memfd("hetmesh-ipc-messages", kHeaderBytes + capacity);
  MessageRing ring;
  ring.base_ = map_ring(fd.get(), kHeaderBytes + capacity, PROT_READ | PROT_WRITE, "message");
  ring.fd_ = std::move(fd);
  ring.capacity_ = capacity;
  // The memfd starts zeroed: both positions are 0. Until its consumer polls, wake it.
  std::atomic_ref<uint32_t>(ring.header()->wakeup_requested).store(1, std::memory_order_relaxed);
  return ring;
}

MessageRing MessageRing::adopt(Fd fd, uint64_t capacity) {
  if (capacity == 0 || (capacity & (capacity - 1)) != 0)
    throw Error(kStatusProtocolError,
                fmt::format("the peer's message ring of {} bytes is not a power of two", capacity));
  check_peer_memfd(fd.get(), kHeaderBytes + capacity,
                   fmt::format("a message ring of {} bytes", capacity));
  MessageRing ring;
  ring.base_ = map_ring(fd.get(), kHeaderBytes + capacity, PROT_READ | PROT_WRITE, "message");
  ring.fd_ = std::move(fd);
  ring.capacity_ = capacity;
  return ring;
}

bool MessageRing::has_room(uint64_t size) {
  if (produced_ + size <= room_end_) return true;
  uint64_t consumed = std::atomic_ref<uint64_t>(header()->consumed).load(std::memory_order_acquire);
  if (produced_ - consumed > capacity_)
    throw Error(kStatusProtocolError,
                fmt::format("the peer reports consuming to byte {} of its message ring, but {} "
                            "were published (capacity {})",
                            consumed, produced_, capacity_));
  room_end_ = consumed + capacity_;
  return produced_ + size <= room_end_;
}

void MessageRing::put(uint64_t offset, const void* data, uint64_t size) {
  uint64_t at = (produced_ + offset) & (capacity_ - 1);
  uint64_t first = std::min(size, capacity_ - at);
  std::memcpy(this->data() + at, data, first);
  if (first < size)
    std::memcpy(this->data(), static_cast<const uint8_t*>(data) + first, size - first);
}

bool MessageRing::publish(uint64_t size) {
  produced_ += size;
  std::atomic_ref<uint64_t>(header()->produced).store(produced_, std::memory_order_release);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  return take_wakeup_request();
}

bool MessageRing::take_wakeup_request() {
  std::atomic_ref<uint32_t> requested(header()->wakeup_requested);
  return requested.load(std::memory_order_relaxed) != 0 &&
         requested.exchange(0, std::memory_order_acq_rel) != 0;
}

uint64_t MessageRing::readable() {
  uint64_t produced = std::atomic_ref<uint64_t>(header()->produced).load(std::memory_order_acquire);
  uint64_t available = produced - consumed_;
  if (available > capacity_)
    throw Error(kStatusProtocolError,
                fmt::format("the peer reports publishing to byte {} of its message ring, {} were "
                            "consumed (capacity {})",
                            produced, consumed_, capacity_));
  return available;
}

void MessageRing::get(uint64_t offset, void* data, uint64_t size) const {
  uint64_t at = (consumed_ + offset) & (capacity_ - 1);
  uint64_t first = std::min(size, capacity_ - at);
  std::memcpy(data, this->data() + at, first);
  if (first < size) std::memcpy(static_cast<uint8_t*>(data) + first, this->data(), size - first);
}

void MessageRing::hand_back() {
  std::atomic_ref<uint64_t>(header()->consumed).store(consumed_, std::memory_order_release);
}

void MessageRing::request_wakeup(bool requested) {
  std::atomic_ref<uint32_t> request(header()->wakeup_requested);
  if (!requested) {
    if (request.load(std::memory_order_relaxed) != 0) request.store(0, std::memory_order_relaxed);
    return;
  }
  request.store(1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

void send_with_fds(int socket, const void* data, size_t size, std::span<const int> fds,
                   const char* what) {
  if (fds.size() > kMaxFds)
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("{}: {} descriptors exceed {}", what, fds.size(), kMaxFds));
  iovec part{const_cast<void*>(data), size};
  alignas(cmsghdr) char control[CMSG_SPACE(kMaxFds * sizeof(int))] = {};
  msghdr message{};
  message.msg_iov = &part;
  message.msg_iovlen = 1;
  message.msg_control = control;
  message.msg_controllen = CMSG_SPACE(fds.size() * sizeof(int));
  cmsghdr* header = CMSG_FIRSTHDR(&message);
  header->cmsg_level = SOL_SOCKET;
  header->cmsg_type = SCM_RIGHTS;
  header->cmsg_len = CMSG_LEN(fds.size() * sizeof(int));
  std::memcpy(CMSG_DATA(header), fds.data(), fds.size() * sizeof(int));
  ssize_t n;
  do {
    n = sendmsg(socket, &message, MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  if (n < 0)
    throw Error(kStatusPeerLost, fmt::format("sending {} failed: {}", what, std::strerror(errno)));
  // The descriptors travel with the first byte; any rest is plain data.
  if (static_cast<size_t>(n) < size)
    send_all(socket, static_cast<const uint8_t*>(data) + n, size - static_cast<size_t>(n), what);
}

std::vector<Fd> receive_with_fds(int socket, void* data, size_t size, size_t count,
                                 std::chrono::milliseconds timeout, const char* what) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  auto* p = static_cast<uint8_t*>(data);
  std::vector<Fd> received;
  while (size > 0) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    pollfd readable{socket, POLLIN, 0};
    int ready = left.count() > 0 ? ::poll(&readable, 1, static_cast<int>(left.count())) : 0;
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0)
      throw Error(HM_ERR_TIMEOUT,
                  fmt::format("{} did not arrive within {} ms", what, timeout.count()));
    iovec part{p, size};
    alignas(cmsghdr) char control[CMSG_SPACE(kMaxFds * sizeof(int))] = {};
    msghdr message{};
    message.msg_iov = &part;
    message.msg_iovlen = 1;
    message.msg_control = control;
    message.msg_controllen = sizeof control;
    ssize_t n = recvmsg(socket, &message, MSG_CMSG_CLOEXEC);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      throw Error(kStatusPeerLost,
                  fmt::format("receiving {} failed: {}", what,
                              n < 0 ? std::strerror(errno) : "peer closed the connection"));
    for (cmsghdr* h = CMSG_FIRSTHDR(&message); h != nullptr; h = CMSG_NXTHDR(&message, h)) {
      if (h->cmsg_level != SOL_SOCKET || h->cmsg_type != SCM_RIGHTS) continue;
      size_t fds = (h->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < fds; ++i) {
        int fd;
        std::memcpy(&fd, CMSG_DATA(h) + i * sizeof(int), sizeof fd);
        received.emplace_back(fd);  // owned from here on, even if we refuse the hello
      }
    }
    if ((message.msg_flags & MSG_CTRUNC) != 0)  // also where this process had no room for them
      throw Error(kStatusProtocolError,
                  fmt::format("{} came with more descriptors than it may carry, or this process "
                              "is out of file descriptors to receive them (raise its limit, "
                              "ulimit -n)",
                              what));
    p += n;
    size -= static_cast<size_t>(n);
  }
  if (received.size() != count)
    throw Error(kStatusProtocolError,
                fmt::format("{} came with {} descriptors, not {}", what, received.size(), count));
  return received;
}

}  // namespace hetmesh::detail
