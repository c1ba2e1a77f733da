// The application's memory, registered on first sight (caller_buffers.hpp).
#include "caller_buffers.hpp"

#include <hetmesh/core/error.hpp>
#include <hetmesh/core/log.hpp>

#include <fmt/format.h>

#include <unistd.h>

namespace hetmesh::afd {

CallerBuffers::CallerBuffers(Transport& transport, Device device, std::string owner)
    : transport_(transport), device_(std::move(device)), owner_(std::move(owner)) {}

const CallerBuffers::Entry* CallerBuffers::find_locked(uintptr_t begin, uintptr_t end) const {
  auto holds = [&](const Entry& e) { return begin >= e.base && end <= e.base + e.size; };
  if (last_ < entries_.size() && holds(entries_[last_])) return &entries_[last_];
  for (size_t i = 0; i < entries_.size(); ++i)
    if (holds(entries_[i])) {
      last_ = i;
      return &entries_[i];
    }
  return nullptr;
}

CallerBuffers::Found CallerBuffers::find_or_register(const void* data, uint64_t bytes,
                                                     const char* what) {
  const auto begin = reinterpret_cast<uintptr_t>(data);
  uintptr_t end;
  if (data == nullptr || __builtin_add_overflow(begin, bytes, &end))
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("{}: {} at {} ({} bytes) is no buffer", owner_, what, data, bytes));
  std::lock_guard lock(mutex_);
  if (const Entry* e = find_locked(begin, end))
    return {e->region, e->id, begin - e->base, e->size, false};

  // The allocation that holds it, as the plugin knows it; else the pages of plain host memory.
  PointerInfo info = device_.query(data);
  uintptr_t base;
  uint64_t size;
  if (info.kind != HM_MEM_UNKNOWN && info.base != nullptr) {
    if (info.device != device_.index() && info.kind == HM_MEM_DEVICE)
      throw Error(HM_ERR_INVALID_ARGUMENT,
                  fmt::format("{}: {} is memory of {}:{}, and this engine runs on {}", owner_, what,
                              device_.plugin().name(), info.device, device_.selector()));
    base = reinterpret_cast<uintptr_t>(info.base);
    size = info.size;
    if (begin < base || end > base + size)
      throw Error(HM_ERR_INVALID_ARGUMENT,
                  fmt::format("{}: {} [{}, +{}) runs past the end of its allocation [{:#x}, +{})",
                              owner_, what, data, bytes, base, size));
  } else {
    const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
    base = begin & ~(page - 1);
    size = ((end + page - 1) & ~(page - 1)) - base;
  }
  if (entries_.size() == kMaxRegistrations)
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("{}: {} would be the {}th buffer registered: buffers handed to the "
                            "engine must be long-lived (allocate them once and reuse them), as "
                            "each stays registered until the engine ends",
                            owner_, what, kMaxRegistrations + 1));
  std::shared_ptr<Region> region =
      transport_.register_memory(device_, reinterpret_cast<void*>(base), size);
  const auto id = static_cast<uint32_t>(entries_.size() + 1);
  entries_.push_back(Entry{base, size, id, region});
  last_ = entries_.size() - 1;
  log(LogLevel::info, "{}: registered the caller's buffer {:#x} (+{} bytes, first seen as {}): {}",
      owner_, base, size, what, to_string(region->path()));
  if (region->path() == RegistrationPath::staging)
    log(LogLevel::warn,
        "{}: {} cannot be reached directly ({}); its bytes go through one copy in host "
        "staging buffers",
        owner_, what, region->path_reason().empty() ? "no path" : region->path_reason());
  return {region, id, begin - base, size, true};
}

size_t CallerBuffers::count() const {
  std::lock_guard lock(mutex_);
  return entries_.size();
}

uint64_t CallerBuffers::bytes() const {
  std::lock_guard lock(mutex_);
  uint64_t total = 0;
  for (const Entry& e : entries_)
    total += e.size;
  return total;
}

}  // namespace hetmesh::afd
