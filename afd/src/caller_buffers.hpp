// The application's own memory as an engine sends from it and receives into it (PushOptions's
// buffers, an F's part outputs): registered with the engine's transport on first sight and kept
// for the engine's life, one registration per allocation. An allocation is what the device's
// plugin says contains the pointer (pointer_query), else, for memory the plugin does not know
// (plain host memory), the pages the range spans; a row slice of a registered tensor, or a later
// range inside it, finds that registration, so a framework's static buffers cost one registration
// each, at first sight, and the hot path a lookup.
#pragma once

#include <hetmesh/afd/engine.hpp>
#include <hetmesh/core/device.hpp>
#include <hetmesh/transport/transport.hpp>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace hetmesh::afd {

class CallerBuffers {
 public:
  // `owner` names the engine in errors and logs ("attention 0").
  CallerBuffers(Transport& transport, Device device, std::string owner);

  struct Found {
    std::shared_ptr<Region> region;
    uint32_t id = 0;      // 1, 2, ...: the registration's number in this engine
    uint64_t offset = 0;  // of the range in the region
    uint64_t size = 0;    // the registration's: [data - offset, +size)
    bool fresh = false;   // registered by this call
  };
  // The registration that holds [data, data + bytes), made now if none does. `what` names the
  // buffer in errors ("push_pull's tokens"). Throws Error(INVALID_ARGUMENT) for a null pointer, a
  // range that wraps, memory of another device, or a range that straddles the end of a
  // registered allocation; and the transport's error when it cannot register the memory.
  Found find_or_register(const void* data, uint64_t bytes, const char* what);
  // Registrations so far, and the bytes they cover.
  size_t count() const;
  uint64_t bytes() const;

  // The most registrations an engine keeps: a framework's buffers are few and static; more means
  // buffers are allocated per step, which a registration cache cannot serve (each would pin
  // memory until the engine ends).
  static constexpr size_t kMaxRegistrations = 4096;

 private:
  struct Entry {
    uintptr_t base;
    uint64_t size;
    uint32_t id;
    std::shared_ptr<Region> region;
  };
  const Entry* find_locked(uintptr_t begin, uintptr_t end) const;

  Transport& transport_;
  Device device_;
  std::string owner_;
  mutable std::mutex mutex_;
  std::vector<Entry> entries_;  // sorted by base; most lookups hit the last one found
  mutable size_t last_ = 0;
};

}  // namespace hetmesh::afd

namespace hetmesh::afd {

// DataCounters as an engine's threads add to them.
struct MovedBytes {
  std::atomic<uint64_t> caller{0}, slot{0}, staged{0};
  // `bytes` moved from or into `region`, the application's memory or the engine's slot.
  void add(const Region& region, bool application, uint64_t bytes) {
    if (bytes == 0) return;
    (application ? caller : slot).fetch_add(bytes, std::memory_order_relaxed);
    if (region.path() == RegistrationPath::staging)
      staged.fetch_add(bytes, std::memory_order_relaxed);
  }
  DataCounters read(const CallerBuffers* buffers) const {
    return {caller.load(std::memory_order_relaxed), slot.load(std::memory_order_relaxed),
            staged.load(std::memory_order_relaxed), buffers ? buffers->count() : 0};
  }
};

}  // namespace hetmesh::afd
