// What an address is to a GPU plugin: its own table first (exact sizes as requested), then the
// runtime itself, through V::classify_foreign, for memory another user of the runtime in this
// process allocated. Also the checks of a dma-buf range.
#pragma once

#include "gpu_state.hpp"
#include "memfd.hpp"
#include "status.hpp"

#include <hetmesh/device_plugin.h>

#include <unistd.h>

#include <cstdint>

namespace hm::kit::gpu {

// Managed memory and unknown pointers are HM_MEM_UNKNOWN.
struct Memory {
  int32_t kind = HM_MEM_UNKNOWN;
  int32_t device = -1;
  uintptr_t base = 0;
  uint64_t size = 0;
  bool host = false;            // host RAM: pinned, registered, or a peer's mapped pinned memory
  uint64_t device_address = 0;  // device address of `base`; 0 if not known (yet)
};

template <typename V>
Memory classify(const void* ptr) {
  auto& s = V::state();
  Memory m;
  if (ptr == nullptr || s.devices.empty()) return m;
  if (auto hit = s.table.find(ptr)) {
    m.kind = hit->allocation.kind;
    m.device = hit->allocation.device;
    m.base = hit->base;
    m.size = hit->allocation.size;
    m.host = hit->allocation.host;
    m.device_address = hit->allocation.device_address;
    return m;
  }
  return V::classify_foreign(ptr);
}

// Fails if [ptr, ptr+size) starts in device memory of the plugin's own table and runs past its end
// (the table holds sizes as requested; the runtime may map more, a VMM allocation whole granules,
// and then would not notice). Host memory may run on into plain host memory, which copies take;
// memory the table does not know is the runtime's to check.
template <typename V>
void check_known_range(const void* ptr, uint64_t size, const char* what) {
  auto hit = V::state().table.find(ptr);
  if (!hit || hit->allocation.host) return;
  uint64_t offset = reinterpret_cast<uintptr_t>(ptr) - hit->base;
  if (size > hit->allocation.size - offset)
    fail(HM_ERR_INVALID_ARGUMENT,
         "%s range %p+%llu overruns its allocation (%llu bytes at offset %llu)", what, ptr,
         static_cast<unsigned long long>(size),
         static_cast<unsigned long long>(hit->allocation.size),
         static_cast<unsigned long long>(offset));
}

// What the runtime says of a pointer the plugin did not allocate: `kind` is HM_MEM_DEVICE (kept
// only on one of the plugin's `devices`), HM_MEM_PINNED_HOST (of the runtime's device `ordinal` if
// it is one of ours, else device 0) or HM_MEM_UNKNOWN (managed memory included).
inline Memory foreign_memory(int32_t kind, int ordinal, size_t devices, uintptr_t base,
                             uint64_t size) {
  Memory m;
  const bool ours = ordinal >= 0 && static_cast<size_t>(ordinal) < devices;
  if (size == 0) return m;
  if (kind == HM_MEM_DEVICE && ours) {
    m.device = ordinal;
    m.device_address = base;
  } else if (kind == HM_MEM_PINNED_HOST) {
    m.device = ours ? ordinal : 0;
    m.host = true;
  } else {
    return m;
  }
  m.kind = kind;
  m.base = base;
  m.size = size;
  return m;
}

// A dma-buf range: page-aligned, inside one allocation of device memory of a device with
// HM_CAP_DMABUF_EXPORT.
template <typename V>
Memory dmabuf_range(const void* ptr, uint64_t size, const hm_dmabuf* out) {
  require_struct(out, HM_DMABUF_SIZE_V1, "out");
  Memory m = classify<V>(ptr);
  if (m.kind != HM_MEM_DEVICE)
    fail(HM_ERR_INVALID_ARGUMENT, "%p is not device memory of this plugin", ptr);
  require(device_state(V::state(), m.device), HM_CAP_DMABUF_EXPORT, "dma-buf export");
  uint64_t page = page_size();
  auto start = reinterpret_cast<uintptr_t>(ptr);
  if (size == 0 || start % page != 0 || size % page != 0)
    fail(HM_ERR_INVALID_ARGUMENT, "dma-buf ranges must be page-aligned: %p + %llu (page size %llu)",
         ptr, static_cast<unsigned long long>(size), static_cast<unsigned long long>(page));
  if (size > m.size - (start - m.base))
    fail(HM_ERR_INVALID_ARGUMENT, "%p + %llu overruns its allocation (%llu bytes at %p)", ptr,
         static_cast<unsigned long long>(size), static_cast<unsigned long long>(m.size),
         reinterpret_cast<void*>(m.base));
  return m;
}

// dmabuf_release for plugins whose dma-buf is a descriptor of the caller's own (cuda's, and
// level_zero's duplicate): closed here.
inline hm_status close_dmabuf(const hm_dmabuf* dmabuf) {
  return guarded("dmabuf_release", [&] {
    require_struct(dmabuf, HM_DMABUF_SIZE_V1, "dmabuf");
    if (dmabuf->fd < 0 || close(dmabuf->fd) != 0)
      fail(HM_ERR_INVALID_ARGUMENT, "fd %d is not open", dmabuf->fd);
  });
}

}  // namespace hm::kit::gpu
