#include "staging.hpp"

#include <algorithm>

namespace hetmesh::detail {

namespace {
constexpr std::chrono::seconds kCopyTimeout{60};
}

bool host_addressable(const Device& device, const void* ptr) {
  switch (device.query(ptr).kind) {
    case HM_MEM_UNKNOWN:
    case HM_MEM_PINNED_HOST:
    case HM_MEM_REGISTERED_HOST:
      return true;
    default:
      return device.has(HM_CAP_HOST_ADDRESSABLE_DEVICE_MEMORY);
  }
}

HostAccess::HostAccess(const Device& device, void* base, uint64_t size)
    : base_(static_cast<uint8_t*>(base)) {
  if (host_addressable(device, base)) return;
  stream_ = device.create_stream();
  uint64_t bounce = std::min(size, kChunk);
  if (device.has(HM_CAP_PINNED_HOST_MEMORY)) {
    bounce_ = device.allocate(bounce, MemoryKind::pinned_host);
    bounce_data_ = static_cast<uint8_t*>(bounce_.data());
  } else {
    plain_bounce_.resize(bounce);
    bounce_data_ = plain_bounce_.data();
  }
}

void HostAccess::read(uint64_t offset, uint64_t length,
                      const std::function<void(const uint8_t*, uint64_t)>& sink) {
  if (direct()) return sink(base_ + offset, length);
  std::lock_guard lock(mutex_);
  for (uint64_t done = 0; done < length;) {
    uint64_t n = std::min(length - done, kChunk);
    stream_.copy(bounce_data_, base_ + offset + done, n);
    stream_.synchronize(kCopyTimeout);
    sink(bounce_data_, n);
    done += n;
  }
}

void HostAccess::write(uint64_t offset, uint64_t length,
                       const std::function<void(uint8_t*, uint64_t)>& source) {
  if (direct()) return source(base_ + offset, length);
  std::lock_guard lock(mutex_);
  for (uint64_t done = 0; done < length;) {
    uint64_t n = std::min(length - done, kChunk);
    source(bounce_data_, n);
    stream_.copy(base_ + offset + done, bounce_data_, n);
    stream_.synchronize(kCopyTimeout);
    done += n;
  }
}

}  // namespace hetmesh::detail
