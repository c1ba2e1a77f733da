// Reaching a registered region's bytes from the host: directly when the host can address them,
// otherwise through a pinned bounce buffer and the device's copy engine, chunk by chunk.
#pragma once

#include <hetmesh/device.hpp>

#include <functional>
#include <mutex>

namespace hetmesh::detail {

// True if host code may read and write [ptr, ptr+size) of `device`'s memory.
bool host_addressable(const Device& device, const void* ptr);

class HostAccess {
 public:
  static constexpr uint64_t kChunk = 4 << 20;

  // Sets up a bounce buffer and stream if the region is not host-addressable (at registration,
  // never on the hot path).
  HostAccess(const Device& device, void* base, uint64_t size);

  bool direct() const { return !stream_; }

  // Hands the bytes [offset, offset+length) to `sink` in host-readable chunks, in order.
  void read(uint64_t offset, uint64_t length,
            const std::function<void(const uint8_t*, uint64_t)>& sink);
  // Fills [offset, offset+length) from `source`, which writes each host chunk in order.
  void write(uint64_t offset, uint64_t length,
             const std::function<void(uint8_t*, uint64_t)>& source);

 private:
  uint8_t* base_;
  std::mutex mutex_;  // one bounce buffer per region
  Stream stream_;
  Buffer bounce_;
  std::vector<uint8_t> plain_bounce_;  // when the plugin has no pinned memory
  uint8_t* bounce_data_ = nullptr;
};

}  // namespace hetmesh::detail
