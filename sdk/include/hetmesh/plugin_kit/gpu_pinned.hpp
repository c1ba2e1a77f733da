// Pinned host memory that another process can open: memfd pages registered with the runtime
// (V::register_host / V::unregister_host), page-locked like the runtime's own pinned allocations.
// The IPC handle of such memory names the exporter's fd, which the importer opens through
// /proc/<pid>/fd/<fd> (memfd.hpp) and registers in turn.
#pragma once

#include "gpu_state.hpp"
#include "memfd.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <string>

namespace hm::kit::gpu {

// Maps `size` bytes of `fd` and registers them; fills out->fd and out->mapped. Closes `fd` on
// failure.
template <typename V>
void* map_pinned(int32_t device, int fd, uint64_t size, Allocation* out) {
  uint64_t mapped = round_up(size, page_size());
  void* ptr = nullptr;
  try {
    ptr = map_memfd(fd, size, PROT_READ | PROT_WRITE);
    out->device_address = V::register_host(device, ptr, mapped);
  } catch (...) {
    unmap(ptr, size);
    close(fd);
    throw;
  }
  out->fd = fd;
  out->mapped = mapped;
  return ptr;
}

// Page-locked, shareable host memory of `size` bytes.
template <typename V>
void* alloc_memfd_pinned(int32_t device, uint64_t size, Allocation* out) {
  std::string name = std::string(V::kInfo.name) + "-pinned";
  return map_pinned<V>(device, create_memfd(name.c_str(), size), size, out);
}

// Another process's memfd-backed pinned memory, mapped and registered here.
template <typename V>
void* open_memfd_pinned(int32_t device, int32_t pid, int32_t fd, uint64_t size, Allocation* out) {
  int ours = open_peer_memfd(pid, fd, size);
  out->host = true;
  return map_pinned<V>(device, ours, size, out);
}

// Unregisters, unmaps and closes memfd-backed memory (ours or a peer's); reports a failed
// unregistration only once the mapping and the fd are gone.
template <typename V>
void release_memfd_mapping(void* ptr, const Allocation& a) {
  struct Unmap {
    void* base;
    const Allocation& allocation;
    ~Unmap() {
      munmap(base, allocation.mapped);
      close(allocation.fd);
    }
  } unmap_after{ptr, a};
  V::unregister_host(ptr);
}

}  // namespace hm::kit::gpu
