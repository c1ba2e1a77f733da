// Device and host allocations and the allocation table. Device memory is a memfd mapped twice: the
// pointer handed out is PROT_NONE (not host-addressable, as on a discrete GPU), the driver's worker
// threads use a second, writable view. Every copy, fill and memory operation translates addresses
// through the table, so pointers into the middle of an allocation work.
#include <sys/mman.h>
#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <shared_mutex>

#include "state.h"
#include "ze_export_chain.h"

namespace hetmesh_ze {
namespace {

struct Table {
  std::shared_mutex mutex;
  std::map<uintptr_t, std::shared_ptr<Allocation>> by_base;
};

Table& table() {
  static auto* t = new Table;  // never destroyed (see driver())
  return *t;
}

bool power_of_two(size_t v) {
  return v != 0 && (v & (v - 1)) == 0;
}

size_t round_up(size_t v, size_t to) {
  return (v + to - 1) / to * to;
}

}  // namespace

uint64_t next_serial() {
  static std::atomic<uint64_t> serial{1};
  return serial.fetch_add(1);
}

size_t page_size() {
  static const size_t size = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return size;
}

Allocation::~Allocation() {
  if (kind == AllocKind::kHost) {
    std::free(base);
    return;
  }
  if (base != nullptr) munmap(base, mapped);
  if (rw != nullptr) munmap(rw, mapped);
  if (fd >= 0) close(fd);
}

std::byte* map_view(int fd, size_t length, int prot, size_t alignment) {
  if (alignment <= page_size()) {
    void* p = mmap(nullptr, length, prot, MAP_SHARED, fd, 0);
    return p == MAP_FAILED ? nullptr : static_cast<std::byte*>(p);
  }
  // Reserve length + alignment, place the view at the aligned address inside, release the rest.
  const size_t reserve = length + alignment;
  void* r = mmap(nullptr, reserve, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (r == MAP_FAILED) return nullptr;
  const auto start = reinterpret_cast<uintptr_t>(r);
  const uintptr_t aligned = (start + alignment - 1) / alignment * alignment;
  void* p = mmap(reinterpret_cast<void*>(aligned), length, prot, MAP_SHARED | MAP_FIXED, fd, 0);
  if (p == MAP_FAILED) {
    munmap(r, reserve);
    return nullptr;
  }
  if (aligned > start) munmap(r, aligned - start);
  const uintptr_t end = aligned + length;
  if (start + reserve > end) munmap(reinterpret_cast<void*>(end), start + reserve - end);
  return static_cast<std::byte*>(p);
}

void register_allocation(std::shared_ptr<Allocation> alloc) {
  auto& t = table();
  std::unique_lock lock(t.mutex);
  t.by_base[reinterpret_cast<uintptr_t>(alloc->base)] = std::move(alloc);
}

std::shared_ptr<Allocation> unregister_allocation(const void* base) {
  auto& t = table();
  std::unique_lock lock(t.mutex);
  auto it = t.by_base.find(reinterpret_cast<uintptr_t>(base));
  if (it == t.by_base.end()) return nullptr;
  auto alloc = std::move(it->second);
  t.by_base.erase(it);
  return alloc;
}

std::shared_ptr<Allocation> find_allocation(const void* ptr) {
  if (ptr == nullptr) return nullptr;
  const auto address = reinterpret_cast<uintptr_t>(ptr);
  auto& t = table();
  std::shared_lock lock(t.mutex);
  auto it = t.by_base.upper_bound(address);
  if (it == t.by_base.begin()) return nullptr;
  --it;
  const auto& alloc = it->second;
  // A zero-byte tail is not part of it; allocations are at least one byte.
  if (address - it->first < alloc->size) return alloc;
  return nullptr;
}

ze_result_t resolve(const void* ptr, size_t size, Span& out) {
  if (ptr == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  const auto address = reinterpret_cast<uintptr_t>(ptr);
  if (size > UINTPTR_MAX - address) return ZE_RESULT_ERROR_INVALID_ARGUMENT;
  auto& t = table();
  std::shared_lock lock(t.mutex);
  auto it = t.by_base.upper_bound(address);
  if (it != t.by_base.begin()) {
    auto prev = std::prev(it);
    const auto& alloc = prev->second;
    const uintptr_t offset = address - prev->first;
    if (offset < alloc->size) {
      if (size > alloc->size - offset) return ZE_RESULT_ERROR_INVALID_ARGUMENT;  // runs past it
      out.rw = alloc->rw + offset;
      out.alloc = alloc;
      return ZE_RESULT_SUCCESS;
    }
  }
  // Plain host memory: it must not run into an allocation (whose handed-out view faults).
  if (it != t.by_base.end() && size > 0 && it->first < address + size) {
    return ZE_RESULT_ERROR_INVALID_ARGUMENT;
  }
  out.rw = static_cast<std::byte*>(const_cast<void*>(ptr));
  out.alloc = nullptr;
  return ZE_RESULT_SUCCESS;
}

std::string memfd_name(uint64_t nonce, uint64_t serial) {
  char name[64];
  std::snprintf(name, sizeof(name), "hetmesh-ze-host:%016" PRIx64 ":%" PRIu64, nonce, serial);
  return name;
}

ze_result_t ZE_APICALL MemAllocDevice(ze_context_handle_t context,
                                      const ze_device_mem_alloc_desc_t* desc, size_t size,
                                      size_t alignment, ze_device_handle_t device_handle,
                                      void** ptr) {
  return guarded([&] {
    if (auto r = check_context(context); r != ZE_RESULT_SUCCESS) return r;
    Device* device = nullptr;
    if (auto r = check_device(device_handle, device); r != ZE_RESULT_SUCCESS) return r;
    if (desc == nullptr || ptr == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    if (size == 0) return ZE_RESULT_ERROR_UNSUPPORTED_SIZE;
    if (alignment != 0 && !power_of_two(alignment)) return ZE_RESULT_ERROR_UNSUPPORTED_ALIGNMENT;
    if (size > kDeviceMemoryBytes) return ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY;
    bool exportable = false;
    if (auto r = export_request(desc->pNext, &exportable); r != ZE_RESULT_SUCCESS) return r;
    // HETMESH_ZE_HOST_NO_DMABUF=1 (read at each allocation) makes the driver refuse the export:
    // the plugin's "capability off" path.
    const char* off = std::getenv("HETMESH_ZE_HOST_NO_DMABUF");
    if (exportable && off != nullptr && off[0] == '1')
      return ZE_RESULT_ERROR_UNSUPPORTED_ENUMERATION;
    const size_t mapped = round_up(size, page_size());
    // The device's 16 GiB is a budget, not a reservation: memfd pages are only used when touched.
    uint64_t used = device->allocated_bytes.load();
    do {
      if (used + mapped > kDeviceMemoryBytes) return ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY;
    } while (!device->allocated_bytes.compare_exchange_weak(used, used + mapped));

    auto alloc = std::make_shared<Allocation>();
    alloc->kind = AllocKind::kDevice;
    alloc->size = size;
    alloc->mapped = mapped;
    alloc->device = device;
    alloc->context = context;
    alloc->serial = next_serial();
    alloc->exportable = exportable;
    auto give_back = [&](ze_result_t r) {
      device->allocated_bytes.fetch_sub(mapped);
      return r;
    };
    alloc->fd = memfd_create(memfd_name(process_nonce(), alloc->serial).c_str(), MFD_CLOEXEC);
    if (alloc->fd < 0 || ftruncate(alloc->fd, static_cast<off_t>(mapped)) != 0) {
      return give_back(ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY);
    }
    alloc->base = map_view(alloc->fd, mapped, PROT_NONE, alignment);
    alloc->rw = map_view(alloc->fd, mapped, PROT_READ | PROT_WRITE, 0);
    if (alloc->base == nullptr || alloc->rw == nullptr) {
      return give_back(ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY);
    }
    *ptr = alloc->base;
    register_allocation(std::move(alloc));
    return ZE_RESULT_SUCCESS;
  });
}

ze_result_t ZE_APICALL MemAllocHost(ze_context_handle_t context,
                                    const ze_host_mem_alloc_desc_t* desc, size_t size,
                                    size_t alignment, void** ptr) {
  return guarded([&] {
    if (auto r = check_context(context); r != ZE_RESULT_SUCCESS) return r;
    if (desc == nullptr || ptr == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    if (size == 0) return ZE_RESULT_ERROR_UNSUPPORTED_SIZE;
    if (alignment != 0 && !power_of_two(alignment)) return ZE_RESULT_ERROR_UNSUPPORTED_ALIGNMENT;
    const size_t align = alignment < 64 ? 64 : alignment;
    if (size > SIZE_MAX - align) return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
    void* p = std::aligned_alloc(align, round_up(size, align));
    if (p == nullptr) return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
    auto alloc = std::make_shared<Allocation>();
    alloc->kind = AllocKind::kHost;
    alloc->base = static_cast<std::byte*>(p);
    alloc->rw = alloc->base;
    alloc->size = size;
    alloc->mapped = round_up(size, align);
    alloc->context = context;
    alloc->serial = next_serial();
    *ptr = p;
    register_allocation(std::move(alloc));
    return ZE_RESULT_SUCCESS;
  });
}

ze_result_t ZE_APICALL MemFree(ze_context_handle_t context, void* ptr) {
  return guarded([&] {
    if (auto r = check_context(context); r != ZE_RESULT_SUCCESS) return r;
    if (ptr == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    auto alloc = find_allocation(ptr);
    // Only the base of an allocation made here (not an imported IPC mapping: close that).
    if (!alloc || alloc->base != ptr || alloc->kind == AllocKind::kIpcImported) {
      return ZE_RESULT_ERROR_INVALID_ARGUMENT;
    }
    if (!unregister_allocation(ptr)) return ZE_RESULT_ERROR_INVALID_ARGUMENT;  // lost a race
    if (alloc->kind == AllocKind::kDevice) alloc->device->allocated_bytes.fetch_sub(alloc->mapped);
    // The views go when the last pending command using them finishes.
    return ZE_RESULT_SUCCESS;
  });
}

ze_result_t ZE_APICALL MemGetAllocProperties(ze_context_handle_t context, const void* ptr,
                                             ze_memory_allocation_properties_t* properties,
                                             ze_device_handle_t* device) {
  return guarded([&] {
    if (auto r = check_context(context); r != ZE_RESULT_SUCCESS) return r;
    if (ptr == nullptr || properties == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    auto alloc = find_allocation(ptr);
    if (!alloc) {
      properties->type = ZE_MEMORY_TYPE_UNKNOWN;
      properties->id = 0;
      properties->pageSize = 0;
      if (device != nullptr) *device = nullptr;
      return ZE_RESULT_SUCCESS;
    }
    // The dma-buf of memory allocated exportable: its memfd, kept by the driver as Intel's keeps
    // its fd (a memfd is no dma-buf, but lseek and mmap answer as one of host memory would).
    ze_external_memory_export_fd_t* out = nullptr;
    if (auto r = export_fd_request(properties, &out); r != ZE_RESULT_SUCCESS) return r;
    if (out != nullptr) {
      if (!alloc->exportable) return ZE_RESULT_ERROR_INVALID_ARGUMENT;
      out->fd = alloc->fd;
    }
    properties->type =
        alloc->kind == AllocKind::kHost ? ZE_MEMORY_TYPE_HOST : ZE_MEMORY_TYPE_DEVICE;
    properties->id = alloc->serial;
    properties->pageSize = page_size();
    if (device != nullptr) *device = reinterpret_cast<ze_device_handle_t>(alloc->device);
    return ZE_RESULT_SUCCESS;
  });
}

ze_result_t ZE_APICALL MemGetAddressRange(ze_context_handle_t context, const void* ptr, void** base,
                                          size_t* size) {
  return guarded([&] {
    if (auto r = check_context(context); r != ZE_RESULT_SUCCESS) return r;
    if (ptr == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    auto alloc = find_allocation(ptr);
    if (!alloc) return ZE_RESULT_ERROR_INVALID_ARGUMENT;  // not memory of this driver
    if (base != nullptr) *base = alloc->base;
    if (size != nullptr) *size = alloc->size;  // the size asked for, not the page-rounded one
    return ZE_RESULT_SUCCESS;
  });
}

}  // namespace hetmesh_ze
