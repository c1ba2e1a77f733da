// Maps any address to the allocation that contains it: the core of pointer_query.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <shared_mutex>

namespace hm::kit {

template <typename Allocation>
class AllocationTable {
 public:
  // Allocation must provide `uint64_t size`.
  void insert(const void* base, Allocation allocation) {
    std::unique_lock lock(mutex_);
    by_base_.insert_or_assign(key(base), std::move(allocation));
  }

  // Removes the allocation starting exactly at `base`.
  std::optional<Allocation> erase(const void* base) {
    std::unique_lock lock(mutex_);
    auto it = by_base_.find(key(base));
    if (it == by_base_.end()) return std::nullopt;
    Allocation allocation = std::move(it->second);
    by_base_.erase(it);
    return allocation;
  }

  struct Hit {
    uintptr_t base;
    Allocation allocation;
  };

  // The allocation containing `address`, if any.
  std::optional<Hit> find(const void* address) const {
    std::shared_lock lock(mutex_);
    uintptr_t a = key(address);
    auto it = by_base_.upper_bound(a);
    if (it == by_base_.begin()) return std::nullopt;
    --it;
    if (a - it->first >= it->second.size) return std::nullopt;
    return Hit{it->first, it->second};
  }

  // True if [address, address+size) lies inside one allocation.
  std::optional<Hit> find_range(const void* address, uint64_t size) const {
    auto hit = find(address);
    if (!hit) return std::nullopt;
    uint64_t offset = key(address) - hit->base;
    if (size > hit->allocation.size - offset) return std::nullopt;
    return hit;
  }

  // True if [address, address+size) shares a byte with any allocation.
  bool overlaps(const void* address, uint64_t size) const {
    if (find(address)) return true;
    std::shared_lock lock(mutex_);
    auto next = by_base_.upper_bound(key(address));
    return next != by_base_.end() && next->first - key(address) < size;
  }

  size_t count() const {
    std::shared_lock lock(mutex_);
    return by_base_.size();
  }

 private:
  static uintptr_t key(const void* p) { return reinterpret_cast<uintptr_t>(p); }

  mutable std::shared_mutex mutex_;
  std::map<uintptr_t, Allocation> by_base_;
};

}  // namespace hm::kit
