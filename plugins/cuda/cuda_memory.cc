// The memory slots of the cuda plugin: mem_alloc/mem_free (device memory and memfd-backed pinned
// memory), pointer_query, memcpy_async, memset_async and host_register/host_unregister. What they
// allocate or register goes into State::table, which pointer_query, IPC and memops consult.
#include "cuda_slots.hpp"
#include "cuda_state.hpp"

#include <hetmesh/plugin_kit/memfd.hpp>

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <memory>

namespace hm::cuda {

// ---- slots: memory ----

namespace {

// Page-locked, shareable host memory: a memfd mapping registered with CUDA.
void* alloc_memfd_pinned(int32_t device, uint64_t size, Allocation* out) {
  uint64_t mapped = hm::kit::round_up(size, hm::kit::page_size());
  int fd = hm::kit::create_memfd("hetmesh-cuda-pinned", size);
  void* ptr = nullptr;
  try {
    ptr = hm::kit::map_memfd(fd, size, PROT_READ | PROT_WRITE);
    out->device_address = register_host_range(device, ptr, mapped);
  } catch (...) {
    hm::kit::unmap(ptr, size);
    close(fd);
    throw;
  }
  out->fd = fd;
  out->mapped = mapped;
  return ptr;
}

}  // namespace

hm_status mem_alloc(int32_t device, uint64_t size, int32_t kind, void** ptr) {
  return guarded("mem_alloc", [&] {
    if (ptr == nullptr) fail(HM_ERR_INVALID_ARGUMENT, "ptr is NULL");
    *ptr = nullptr;
    DeviceState& d = device_state(device);
    if (size == 0) fail(HM_ERR_INVALID_ARGUMENT, "size is 0");
    if (kind != HM_MEM_DEVICE && kind != HM_MEM_PINNED_HOST)
      fail(HM_ERR_INVALID_ARGUMENT, "kind %d is not HM_MEM_DEVICE or HM_MEM_PINNED_HOST", kind);
    Allocation a;
    a.size = size;
    a.kind = kind;
    a.device = device;
    void* result = nullptr;
    if (kind == HM_MEM_DEVICE) {
      ContextScope scope(device);
      CUdeviceptr address = 0;
      HM_CU(cuMemAlloc, &address, size);
      a.device_address = address;
      result = reinterpret_cast<void*>(address);
    } else if (d.memfd_pinned) {
      a.host = true;
      result = alloc_memfd_pinned(device, size, &a);
    } else {
      ContextScope scope(device);
      a.host = true;
      HM_CU(cuMemHostAlloc, &result, size, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP);
      a.device_address = host_device_address(result);
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
    ContextScope scope(a.device);
    if (a.kind == HM_MEM_DEVICE)
      HM_CU(cuMemFree, reinterpret_cast<CUdeviceptr>(ptr));
    else if (a.fd >= 0)
      release_memfd_mapping(ptr, a);
    else
      HM_CU(cuMemFreeHost, ptr);
  });
}

hm_status pointer_query(const void* ptr, hm_pointer_info* info) {
  return guarded("pointer_query", [&] {
    hm::kit::require_struct(info, HM_POINTER_INFO_SIZE_V1, "info");
    Memory m = classify(ptr);
    info->kind = m.kind;
    info->device = m.kind == HM_MEM_UNKNOWN ? -1 : m.device;
    info->base = m.kind == HM_MEM_UNKNOWN ? nullptr : reinterpret_cast<void*>(m.base);
    info->size = m.kind == HM_MEM_UNKNOWN ? 0 : m.size;
  });
}

hm_status memcpy_async(hm_stream stream, void* dst, const void* src, uint64_t size) {
  return guarded("memcpy_async", [&] {
    Stream& s = stream_of(stream);
    if (size == 0) return;
    if (dst == nullptr || src == nullptr) fail(HM_ERR_INVALID_ARGUMENT, "dst or src is NULL");
    ContextScope scope(s.device);
    // Unified addressing: the driver finds each side's memory (any device, pinned, registered or
    // pageable host memory) and picks the direction, a peer copy included.
    HM_CU(cuMemcpyAsync, reinterpret_cast<CUdeviceptr>(dst), reinterpret_cast<CUdeviceptr>(src),
          size, s.stream);
  });
}

namespace {

struct HostFill {
  void* dst;
  uint8_t value;
  uint64_t size;
};

void CUDA_CB run_host_fill(void* user) {
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
    ContextScope scope(s.device);
    if (m.kind != HM_MEM_UNKNOWN && !m.host) {
      HM_CU(cuMemsetD8Async, reinterpret_cast<CUdeviceptr>(dst), static_cast<unsigned char>(value),
            size, s.stream);
      return;
    }
    // Host memory: the host fills it in stream order (no kernel touches host pages).
    auto fill = std::make_unique<HostFill>(HostFill{dst, static_cast<uint8_t>(value), size});
    HM_CU(cuLaunchHostFunc, s.stream, run_host_fill, fill.get());
    fill.release();  // run_host_fill owns it now
  });
}

hm_status host_register(void* ptr, uint64_t size) {
  return guarded("host_register", [&] {
    State& s = state();
    if (s.devices.empty())
      fail(HM_ERR_NOT_SUPPORTED, "no CUDA device: %s", s.no_device_reason.c_str());
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
    a.device_address = register_host_range(0, ptr, size);
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
    ContextScope scope(hit->allocation.device);
    HM_CU(cuMemHostUnregister, ptr);
  });
}

}  // namespace hm::cuda
