// Device memory made of host pages: memfd-backed allocations with IPC through procfs and dma-buf
// through /dev/udmabuf. Used by the cpu plugin and the asic_stub simulator.
//
// With `hidden_device_memory`, device allocations are handed out as a PROT_NONE view, so host code
// that dereferences device memory crashes as it would on a real accelerator; the plugin's own
// engine reaches the bytes through host_view().
#pragma once

#include "allocation_table.hpp"
#include "ipc_kind.hpp"
#include "memfd.hpp"
#include "status.hpp"

#include <atomic>
#include <vector>

namespace hm::kit {

class HostMemory {
 public:
  struct Allocation {
    uint64_t size;
    int32_t kind;  // hm_memory_kind
    int32_t device;
    int fd;         // memfd, or -1 (registered host memory, or an IPC mapping)
    uint8_t* view;  // host-writable view of the same bytes
  };

  // `host` (the one given to initialize) decides how opened pinned memory is reported.
  HostMemory(uint32_t ipc_magic, bool hidden_device_memory, std::vector<uint64_t> device_capacity,
             const hm_host_api* host)
      : magic_(ipc_magic),
        hidden_(hidden_device_memory),
        pinned_mapping_kind_(host_pointer_mapping_kind(host)),
        capacity_(std::move(device_capacity)),
        used_(capacity_.size()) {}

  int32_t device_count() const { return static_cast<int32_t>(capacity_.size()); }
  uint64_t capacity(int32_t device) const { return capacity_.at(device); }

  void* alloc(int32_t device, uint64_t size, int32_t kind) {
    if (device < 0 || device >= device_count())
      fail(HM_ERR_INVALID_ARGUMENT, "device %d does not exist (%d devices)", device,
           device_count());
    if (size == 0) fail(HM_ERR_INVALID_ARGUMENT, "size is 0");
    if (kind != HM_MEM_DEVICE && kind != HM_MEM_PINNED_HOST)
      fail(HM_ERR_INVALID_ARGUMENT, "kind %d is not HM_MEM_DEVICE or HM_MEM_PINNED_HOST", kind);
    uint64_t pages = round_up(size, page_size());
    if (kind == HM_MEM_DEVICE) reserve(device, pages);
    int fd = -1;
    try {
      fd = create_memfd("memory", size);
      auto* view = static_cast<uint8_t*>(map_memfd(fd, size, PROT_READ | PROT_WRITE));
      void* handed_out = view;
      if (hidden_ && kind == HM_MEM_DEVICE) handed_out = map_hidden(fd, size, view);
      table_.insert(handed_out, Allocation{size, kind, device, fd, view});
      return handed_out;
    } catch (...) {
      if (fd >= 0) close(fd);
      if (kind == HM_MEM_DEVICE) used_[device] -= pages;
      throw;
    }
  }

  void free(void* ptr) {
    if (ptr == nullptr) return;
    auto hit = table_.find(ptr);
    if (!hit || hit->base != reinterpret_cast<uintptr_t>(ptr) ||
        (hit->allocation.kind != HM_MEM_DEVICE && hit->allocation.kind != HM_MEM_PINNED_HOST))
      fail(HM_ERR_INVALID_ARGUMENT, "%p is not the start of an allocation from mem_alloc", ptr);
    release(ptr, *table_.erase(ptr));
  }

  void query(const void* ptr, hm_pointer_info* info) const {
    require_struct(info, HM_POINTER_INFO_SIZE_V1, "info");
    auto hit = table_.find(ptr);
    info->kind = hit ? hit->allocation.kind : HM_MEM_UNKNOWN;
    info->device = hit ? hit->allocation.device : -1;
    info->base = hit ? reinterpret_cast<void*>(hit->base) : nullptr;
    info->size = hit ? hit->allocation.size : 0;
  }

  // Host-writable address of [ptr, ptr+size) if it is memory of this plugin; nullptr if it is
  // not ours (plain host memory); fails if it starts inside an allocation but overruns it.
  uint8_t* view_if_ours(const void* ptr, uint64_t size) const {
    auto hit = table_.find(ptr);
    if (!hit) return nullptr;
    uint64_t offset = reinterpret_cast<uintptr_t>(ptr) - hit->base;
    if (size > hit->allocation.size - offset)
      fail(HM_ERR_INVALID_ARGUMENT,
           "range %p+%llu overruns its allocation (%llu bytes at offset %llu)", ptr,
           static_cast<unsigned long long>(size),
           static_cast<unsigned long long>(hit->allocation.size),
           static_cast<unsigned long long>(offset));
    return hit->allocation.view + offset;
  }

  // As view_if_ours, but memory of this plugin is required.
  uint8_t* view(const void* ptr, uint64_t size) const {
    uint8_t* v = view_if_ours(ptr, size);
    if (v == nullptr)
      fail(HM_ERR_INVALID_ARGUMENT, "%p is not device, pinned or registered memory of this plugin",
           ptr);
    return v;
  }

  // Host memory as seen by this plugin; the caller keeps it mapped.
  void register_host(void* ptr, uint64_t size) {
    if (ptr == nullptr || size == 0) fail(HM_ERR_INVALID_ARGUMENT, "empty range");
    if (table_.find(ptr)) fail(HM_ERR_INVALID_ARGUMENT, "%p is already known to this plugin", ptr);
    table_.insert(ptr, Allocation{size, HM_MEM_REGISTERED_HOST, 0, -1, static_cast<uint8_t*>(ptr)});
  }

  void unregister_host(void* ptr) {
    auto hit = table_.find(ptr);
    if (!hit || hit->base != reinterpret_cast<uintptr_t>(ptr) ||
        hit->allocation.kind != HM_MEM_REGISTERED_HOST)
      fail(HM_ERR_INVALID_ARGUMENT, "%p was not registered with host_register", ptr);
    table_.erase(ptr);
  }

  hm_ipc_handle ipc_export(void* ptr) const {
    auto hit = table_.find(ptr);
    if (!hit || hit->allocation.fd < 0)
      fail(HM_ERR_INVALID_ARGUMENT, "%p is not inside device or pinned memory from mem_alloc", ptr);
    return encode_handle(MemfdHandle{magic_, static_cast<uint32_t>(hit->allocation.kind),
                                     static_cast<int32_t>(getpid()), hit->allocation.fd,
                                     hit->allocation.size});
  }

  void* ipc_open(int32_t device, const hm_ipc_handle* handle) {
    if (device < 0 || device >= device_count())
      fail(HM_ERR_INVALID_ARGUMENT, "device %d does not exist (%d devices)", device,
           device_count());
    MemfdHandle h = decode_handle(handle, magic_);
    int fd = open_peer_memfd(h);
    uint8_t* view = nullptr;
    try {
      view = static_cast<uint8_t*>(map_memfd(fd, h.size, PROT_READ | PROT_WRITE));
      void* handed_out = view;
      if (hidden_ && h.kind == HM_MEM_DEVICE) handed_out = map_hidden(fd, h.size, view);
      close(fd);
      int32_t kind = h.kind == HM_MEM_PINNED_HOST ? pinned_mapping_kind_ : HM_MEM_IPC_MAPPED;
      table_.insert(handed_out, Allocation{h.size, kind, device, -1, view});
      return handed_out;
    } catch (...) {
      close(fd);
      throw;
    }
  }

  void ipc_close(void* ptr) {
    auto hit = table_.find(ptr);
    if (!hit || hit->base != reinterpret_cast<uintptr_t>(ptr) ||
        !is_ipc_mapping(hit->allocation.kind))
      fail(HM_ERR_INVALID_ARGUMENT, "%p is not a base address returned by ipc_open", ptr);
    release(ptr, *table_.erase(ptr));
  }

  hm_dmabuf dmabuf_export(const void* ptr, uint64_t size) const {
    auto hit = table_.find(ptr);
    if (!hit || hit->allocation.fd < 0 || hit->allocation.kind != HM_MEM_DEVICE)
      fail(HM_ERR_INVALID_ARGUMENT, "%p is not device memory from mem_alloc", ptr);
    uint64_t offset = reinterpret_cast<uintptr_t>(ptr) - hit->base;
    if (size == 0 || size > hit->allocation.size - offset)
      fail(HM_ERR_INVALID_ARGUMENT, "range overruns its allocation");
    hm_dmabuf out{};
    out.struct_size = sizeof out;
    out.fd = export_udmabuf(hit->allocation.fd, offset, size);
    out.offset = 0;
    out.length = size;
    return out;
  }

  size_t live_allocations() const { return table_.count(); }

 private:
  void reserve(int32_t device, uint64_t bytes) {
    uint64_t before = used_[device].fetch_add(bytes);
    if (before + bytes > capacity_[device]) {
      used_[device] -= bytes;
      fail(HM_ERR_OUT_OF_MEMORY, "device %d: %llu bytes requested, %llu of %llu in use", device,
           static_cast<unsigned long long>(bytes), static_cast<unsigned long long>(before),
           static_cast<unsigned long long>(capacity_[device]));
    }
  }

  static void* map_hidden(int fd, uint64_t size, uint8_t* view) {
    try {
      return map_memfd(fd, size, PROT_NONE);
    } catch (...) {
      unmap(view, size);
      throw;
    }
  }

  void release(void* handed_out, const Allocation& a) {
    if (a.view != handed_out) unmap(handed_out, a.size);
    unmap(a.view, a.size);
    if (a.fd >= 0) close(a.fd);
    if (a.kind == HM_MEM_DEVICE) used_[a.device] -= round_up(a.size, page_size());
  }

  const uint32_t magic_;
  const bool hidden_;
  const int32_t pinned_mapping_kind_;  // of an opened peer allocation of pinned memory
  const std::vector<uint64_t> capacity_;
  std::vector<std::atomic<uint64_t>> used_;
  AllocationTable<Allocation> table_;
};

}  // namespace hm::kit
