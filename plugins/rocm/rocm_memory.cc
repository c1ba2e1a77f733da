// Memory: allocation, pointer queries, copies, fills and host registration.
#include "rocm_memory.hpp"

#include "rocm_streams.hpp"
#include "slots.hpp"

#include <hetmesh/plugin_kit/memfd.hpp>

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <memory>

namespace hm::rocm {

using hm::kit::fail;
using hm::kit::guarded;

Memory classify(const void* ptr) {
  State& s = state();
  Memory m;
  if (ptr == nullptr || s.devices.empty()) return m;
  if (auto hit = s.table.find(ptr)) {
    m.kind = hit->allocation.kind;
    m.device = hit->allocation.device;
    m.base = hit->base;
    m.size = hit->allocation.size;
    m.host = hit->allocation.host;
    return m;
  }
  // Ask HIP. A foreign pointer makes these calls fail, and HIP keeps that as the thread's last
  // error, which frameworks check after their own launches: clear it unless one was pending.
  const Runtime& hip = s.hip;
  const bool error_pending = hip.hipPeekAtLastError() != hipSuccess;
  hipPointerAttribute_t attributes{};
  hipDeviceptr_t base = nullptr;
  size_t size = 0;
  bool known = hip.hipPointerGetAttributes(&attributes, ptr) == hipSuccess &&
               hip.hipMemGetAddressRange(&base, &size, const_cast<void*>(ptr)) == hipSuccess;
  if (!known && !error_pending) (void)hip.hipGetLastError();
  if (!known || attributes.isManaged || size == 0) return m;
  const int devices = static_cast<int>(s.devices.size());
  const bool valid_device = attributes.device >= 0 && attributes.device < devices;
  if (attributes.memoryType == hipMemoryTypeDevice && valid_device) {
    m.kind = HM_MEM_DEVICE;
    m.device = attributes.device;
  } else if (attributes.memoryType == hipMemoryTypeHost) {
    m.kind = HM_MEM_PINNED_HOST;
    m.device = valid_device ? attributes.device : 0;
    m.host = true;
  } else {
    return m;
  }
  m.base = reinterpret_cast<uintptr_t>(base);
  m.size = size;
  return m;
}

void register_host_range(int32_t device, void* ptr, uint64_t size) {
  DeviceScope scope(device);
  HM_HIP(hipHostRegister, ptr, size, hipHostRegisterPortable | hipHostRegisterMapped);
}

void* alloc_memfd_pinned(int32_t device, uint64_t size, Allocation* out) {
  uint64_t mapped = hm::kit::round_up(size, hm::kit::page_size());
  int fd = hm::kit::create_memfd("hetmesh-rocm-pinned", size);
  void* ptr = nullptr;
  try {
    ptr = hm::kit::map_memfd(fd, size, PROT_READ | PROT_WRITE);
    register_host_range(device, ptr, mapped);
  } catch (...) {
    hm::kit::unmap(ptr, size);
    close(fd);
    throw;
  }
  out->fd = fd;
  out->mapped = mapped;
  return ptr;
}

void release_memfd_mapping(void* ptr, const Allocation& allocation) {
  hipError_t error = hip().hipHostUnregister(ptr);
  munmap(ptr, allocation.mapped);
  close(allocation.fd);
  check(error, "hipHostUnregister");
}

hm_status mem_alloc(int32_t device, uint64_t size, int32_t kind, void** ptr) {
  return guarded("mem_alloc", [&] {
    if (ptr == nullptr) fail(HM_ERR_INVALID_ARGUMENT, "ptr is NULL");
    *ptr = nullptr;
    device_state(device);
    if (size == 0) fail(HM_ERR_INVALID_ARGUMENT, "size is 0");
    if (kind != HM_MEM_DEVICE && kind != HM_MEM_PINNED_HOST)
      fail(HM_ERR_INVALID_ARGUMENT, "kind %d is not HM_MEM_DEVICE or HM_MEM_PINNED_HOST", kind);
    Allocation a;
    a.size = size;
    a.kind = kind;
    a.device = device;
    void* result = nullptr;
    if (kind == HM_MEM_DEVICE) {
      DeviceScope scope(device);
      HM_HIP(hipMalloc, &result, size);
    } else {
      // memfd pages rather than hipHostMalloc, so ipc_export can share them.
      a.host = true;
      result = alloc_memfd_pinned(device, size, &a);
    }
    state().table.insert(result, a);
    *ptr = result;
  });
}

hm_status mem_free(void* ptr) {
  return guarded("mem_free", [&] {
    if (ptr == nullptr) return;
    State& s = state();
    auto hit = s.table.find(ptr);
    if (!hit || hit->base != reinterpret_cast<uintptr_t>(ptr) ||
        (hit->allocation.kind != HM_MEM_DEVICE && hit->allocation.kind != HM_MEM_PINNED_HOST))
      fail(HM_ERR_INVALID_ARGUMENT, "%p is not the start of an allocation from mem_alloc", ptr);
    Allocation a = *s.table.erase(ptr);
    DeviceScope scope(a.device);
    if (a.kind == HM_MEM_DEVICE)
      HM_HIP(hipFree, ptr);
    else
      release_memfd_mapping(ptr, a);
  });
}

hm_status pointer_query(const void* ptr, hm_pointer_info* info) {
  return guarded("pointer_query", [&] {
    hm::kit::require_struct(info, HM_POINTER_INFO_SIZE_V1, "info");
    Memory m = classify(ptr);
    const bool known = m.kind != HM_MEM_UNKNOWN;
    info->kind = m.kind;
    info->device = known ? m.device : -1;
    info->base = known ? reinterpret_cast<void*>(m.base) : nullptr;
    info->size = known ? m.size : 0;
  });
}

hm_status memcpy_async(hm_stream stream, void* dst, const void* src, uint64_t size) {
  return guarded("memcpy_async", [&] {
    Stream& s = stream_of(stream);
    if (size == 0) return;
    if (dst == nullptr || src == nullptr) fail(HM_ERR_INVALID_ARGUMENT, "dst or src is NULL");
    DeviceScope scope(s.device);
    // Unified addressing: HIP finds each side's memory (any device, pinned, registered or pageable
    // host memory) and picks the direction, a peer copy included.
    HM_HIP(hipMemcpyAsync, dst, src, size, hipMemcpyDefault, s.stream);
  });
}

namespace {

struct HostFill {
  void* dst;
  uint8_t value;
  uint64_t size;
};

void run_host_fill(void* user) {
  std::unique_ptr<HostFill> fill(static_cast<HostFill*>(user));
  std::memset(fill->dst, fill->value, fill->size);
}

}  // namespace

hm_status memset_async(hm_stream stream, void* dst, int32_t value, uint64_t size) {
  return guarded("memset_async", [&] {
    Stream& s = stream_of(stream);
    if (size == 0) return;
    if (dst == nullptr) fail(HM_ERR_INVALID_ARGUMENT, "dst is NULL");
    Memory m = classify(dst);
    DeviceScope scope(s.device);
    if (m.kind != HM_MEM_UNKNOWN && !m.host) {
      HM_HIP(hipMemsetAsync, dst, static_cast<uint8_t>(value), size, s.stream);
      return;
    }
    // Host memory: the host fills it in stream order (no kernel touches host pages).
    auto fill = std::make_unique<HostFill>(HostFill{dst, static_cast<uint8_t>(value), size});
    launch_host_function(s, run_host_fill, fill.get());
    fill.release();  // run_host_fill owns it now
  });
}

hm_status host_register(void* ptr, uint64_t size) {
  return guarded("host_register", [&] {
    State& s = state();
    if (s.devices.empty())
      fail(HM_ERR_NOT_SUPPORTED, "no device to register memory with (%s)",
           s.no_device_reason.c_str());
    require(*s.devices[0], HM_CAP_HOST_REGISTER, "host_register");
    if (ptr == nullptr || size == 0) fail(HM_ERR_INVALID_ARGUMENT, "empty range");
    if (s.table.find(ptr) || s.table.find(static_cast<char*>(ptr) + size - 1))
      fail(HM_ERR_INVALID_ARGUMENT, "[%p, +%llu) overlaps memory this plugin already knows", ptr,
           static_cast<unsigned long long>(size));
    Allocation a;
    a.size = size;
    a.kind = HM_MEM_REGISTERED_HOST;
    a.device = 0;
    a.host = true;
    register_host_range(0, ptr, size);
    s.table.insert(ptr, a);
  });
}

hm_status host_unregister(void* ptr) {
  return guarded("host_unregister", [&] {
    State& s = state();
    auto hit = s.table.find(ptr);
    if (ptr == nullptr || !hit || hit->base != reinterpret_cast<uintptr_t>(ptr) ||
        hit->allocation.kind != HM_MEM_REGISTERED_HOST)
      fail(HM_ERR_INVALID_ARGUMENT, "%p was not registered with host_register", ptr);
    s.table.erase(ptr);
    DeviceScope scope(hit->allocation.device);
    HM_HIP(hipHostUnregister, ptr);
  });
}

}  // namespace hm::rocm
