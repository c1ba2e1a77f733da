// What an address is, and the host-memory registration the memory and IPC slots share.
#pragma once

#include "rocm_state.hpp"

#include <cstdint>

namespace hm::rocm {

// An address classified: the plugin's own table first, then HIP itself (memory another HIP user of
// this process allocated). Managed memory and unknown pointers are HM_MEM_UNKNOWN.
struct Memory {
  int32_t kind = HM_MEM_UNKNOWN;
  int32_t device = -1;
  uintptr_t base = 0;
  uint64_t size = 0;
  bool host = false;  // host RAM: pinned, registered, or a peer's mapped pinned memory
};

Memory classify(const void* ptr);

// Page-locks [ptr, ptr + size) for every device (portable) and maps it for device access.
void register_host_range(int32_t device, void* ptr, uint64_t size);

// Page-locked, shareable host memory: a memfd mapping registered with HIP. Fills out->fd and
// out->mapped.
void* alloc_memfd_pinned(int32_t device, uint64_t size, Allocation* out);

// Unregisters, unmaps and closes memfd-backed memory (ours or a peer's).
void release_memfd_mapping(void* ptr, const Allocation& allocation);

}  // namespace hm::rocm
