// Reaching a registered region's bytes from the host: directly when the host can address them,
// otherwise through a pinned bounce buffer and the device's copy engine, chunk by chunk.
#pragma once

#include <hetmesh/core/device.hpp>

#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>

namespace hetmesh::detail {

// True if host code may read and write [ptr, ptr+size) of `device`'s memory.
bool host_addressable(const Device& device, const void* ptr);

class HostAccess {
 public:
  // The bounce buffer holds two pieces of this size (or of the region's, if smaller).
  static constexpr uint64_t kPiece = 512 << 10;

  // Sets up a bounce buffer and stream if the region is not host-addressable (at registration,
  // never on the hot path).
  HostAccess(const Device& device, void* base, uint64_t size);

  bool direct() const { return !to_host_.stream; }

  // Hands the bytes [offset, offset+length) to `sink` in host-readable chunks, in order.
  void read(uint64_t offset, uint64_t length,
            const std::function<void(const uint8_t*, uint64_t)>& sink);
  // Fills [offset, offset+length) from `source`, which writes each host chunk in order.
  void write(uint64_t offset, uint64_t length,
             const std::function<void(uint8_t*, uint64_t)>& source);

  // One copy between the region and host memory, with no bounce buffer: by the host where it can
  // address the region, else by the device's copy engine (host memory of any kind, HM-R25; at
  // full speed where it is pinned or registered with the plugin, HostRegistrations). Returns once
  // the bytes are there.
  void copy_out(uint64_t offset, uint64_t length, uint8_t* host);
  void copy_in(uint64_t offset, const uint8_t* host, uint64_t length);

 private:
  // One bounce buffer and stream per direction. A read's sink and a write's source may block on a
  // socket; with a single lock for both, two peers echoing into each other's staged regions wait
  // on each other in a cycle.
  struct Lane {
    std::mutex mutex;
    Stream stream;
    std::optional<HostBuffer> buffer;
    uint8_t* data = nullptr;
    uint64_t bytes = 0;
    // Waits for the copies in flight before the bounce buffer goes: a sink or source that threw
    // (a peer lost mid-write) leaves the next piece's copy running into it.
    ~Lane();
    // Blocks until no copy of this lane is in flight; false if the device did not finish in time.
    bool drain() noexcept;
  };
  void set_up(Lane& lane, const Device& device, uint64_t bytes);
  static uint64_t piece(const Lane& lane);

  uint8_t* base_;
  Lane to_host_, to_device_;
};

// Host memory (a staging ring, a region, a peer's mapped memory) registered with each plugin
// whose copy engine copies in or out of it, on first use and while this lives. Where a plugin
// refuses, its engine may still reach it as plain host memory (HM-R25), only slower; the caller
// decides whether that will do. Safe to share between threads.
class HostRegistrations {
 public:
  HostRegistrations(void* base, uint64_t size, std::string what)
      : base_(base), size_(size), what_(std::move(what)) {}
  // Registers the memory with `device`'s plugin on first use, where the plugin registers host
  // memory: true if it is registered or need not be, false if the plugin refused (logged once).
  bool ensure(const Device& device);

 private:
  void* base_;
  uint64_t size_;
  std::string what_;
  std::mutex mutex_;
  std::map<const Plugin*, std::optional<HostRegistration>> done_;  // nullopt: refused
};

}  // namespace hetmesh::detail
