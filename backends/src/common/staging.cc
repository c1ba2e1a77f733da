#include "common/staging.hpp"

#include <hetmesh/core/log.hpp>

#include <algorithm>
#include <cstring>

namespace hetmesh::detail {

namespace {
constexpr std::chrono::seconds kCopyTimeout{60};
}

bool host_addressable(const Device& device, const void* ptr) {
  switch (device.query(ptr).kind) {
    case HM_MEM_UNKNOWN:
    case HM_MEM_PINNED_HOST:
    case HM_MEM_REGISTERED_HOST:
    case HM_MEM_IPC_MAPPED_HOST:
      return true;
    default:
      return device.has(HM_CAP_HOST_ADDRESSABLE_DEVICE_MEMORY);
  }
}

HostAccess::HostAccess(const Device& device, void* base, uint64_t size)
    : base_(static_cast<uint8_t*>(base)) {
  if (host_addressable(device, base)) return;
  set_up(to_host_, device, 2 * std::max<uint64_t>(1, std::min(size, kPiece)));
  set_up(to_device_, device, 2 * std::max<uint64_t>(1, std::min(size, kPiece)));
}

void HostAccess::set_up(Lane& lane, const Device& device, uint64_t bytes) {
  lane.bytes = bytes;
  lane.stream = device.create_stream();
  lane.data = lane.buffer.emplace(device, bytes).data();
}

// The bounce buffer's two halves take turns, a piece at a time: the copy engine fills (or
// empties) one while the caller's sink (or source) works on the other, so a staged send overlaps
// the socket or the NIC with the device copy of the next piece.
uint64_t HostAccess::piece(const Lane& lane) {
  return lane.bytes / 2;
}

bool HostAccess::Lane::drain() noexcept {
  if (!stream) return true;
  try {
    stream.synchronize(kCopyTimeout);
    return true;
  } catch (const std::exception& e) {
    try {
      log(LogLevel::error, "staging: a copy through the bounce buffer did not finish: {}",
          e.what());
    } catch (...) {  // no memory for the words: the verdict stands
    }
    return false;
  }
}

HostAccess::Lane::~Lane() {
  if (buffer && !drain()) {
    // A device copy may still reach the buffer: freeing it would let the copy write into memory
    // reused by then. Keep it for the process's life (a device this late is failing anyway).
    new HostBuffer(std::move(*buffer));  // NOLINT: deliberately never freed
  }
}

void HostAccess::read(uint64_t offset, uint64_t length,
                      const std::function<void(const uint8_t*, uint64_t)>& sink) {
  if (direct()) return sink(base_ + offset, length);
  std::lock_guard lock(to_host_.mutex);
  const uint64_t step = piece(to_host_);
  uint8_t* half[2] = {to_host_.data, to_host_.data + step};
  uint64_t n = std::min(length, step);
  try {
    to_host_.stream.copy(half[0], base_ + offset, n);
    to_host_.stream.synchronize(kCopyTimeout);
    for (uint64_t done = 0, k = 0; done < length; ++k) {
      const uint64_t next = std::min(length - done - n, step);
      if (next > 0) to_host_.stream.copy(half[(k + 1) % 2], base_ + offset + done + n, next);
      sink(half[k % 2], n);
      if (next > 0) to_host_.stream.synchronize(kCopyTimeout);
      done += n;
      n = next;
    }
  } catch (...) {
    to_host_.drain();  // the next piece's copy may still be filling the other half
    throw;
  }
}

void HostAccess::write(uint64_t offset, uint64_t length,
                       const std::function<void(uint8_t*, uint64_t)>& source) {
  if (direct()) return source(base_ + offset, length);
  std::lock_guard lock(to_device_.mutex);
  const uint64_t step = piece(to_device_);
  uint8_t* half[2] = {to_device_.data, to_device_.data + step};
  try {
    for (uint64_t done = 0, k = 0; done < length; ++k) {
      const uint64_t n = std::min(length - done, step);
      source(half[k % 2], n);  // while the piece before is still on its way to the device
      if (k > 0) to_device_.stream.synchronize(kCopyTimeout);  // that piece's half is free again
      to_device_.stream.copy(base_ + offset + done, half[k % 2], n);
      done += n;
    }
    to_device_.stream.synchronize(kCopyTimeout);
  } catch (...) {
    to_device_.drain();  // the piece before may still be reading its half
    throw;
  }
}

void HostAccess::copy_out(uint64_t offset, uint64_t length, uint8_t* host) {
  if (direct()) {
    std::memcpy(host, base_ + offset, length);
    return;
  }
  std::lock_guard lock(to_host_.mutex);
  to_host_.stream.copy(host, base_ + offset, length);
  to_host_.stream.synchronize(kCopyTimeout);
}

void HostAccess::copy_in(uint64_t offset, const uint8_t* host, uint64_t length) {
  if (direct()) {
    std::memcpy(base_ + offset, host, length);
    return;
  }
  std::lock_guard lock(to_device_.mutex);
  to_device_.stream.copy(base_ + offset, host, length);
  to_device_.stream.synchronize(kCopyTimeout);
}

bool HostRegistrations::ensure(const Device& device) {
  if (!device.has(HM_CAP_HOST_REGISTER)) return true;
  std::lock_guard lock(mutex_);
  auto [it, first] = done_.try_emplace(&device.plugin());
  if (!first) return it->second.has_value();
  try {
    it->second.emplace(device, base_, size_);
    log(LogLevel::debug, "{} ({} bytes) registered with {} for its copy engine", what_, size_,
        device.selector());
  } catch (const Error& e) {
    log(LogLevel::info, "{} cannot be registered with {}: {}", what_, device.selector(), e.what());
  }
  return it->second.has_value();
}

}  // namespace hetmesh::detail
