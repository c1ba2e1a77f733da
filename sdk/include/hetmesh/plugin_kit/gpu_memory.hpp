// The memory slots of a GPU plugin over the vendor calls of `V` (gpu_vendor.hpp lists them):
// mem_alloc / mem_free, pointer_query, memcpy_async, memset_async and host_register /
// host_unregister. What they allocate or register goes into the state's table, which
// pointer_query, IPC and memops consult.
#pragma once

#include "gpu_address.hpp"
#include "gpu_handles.hpp"
#include "gpu_state.hpp"
#include "status.hpp"

#include <cstring>
#include <memory>

namespace hm::kit::gpu {

template <typename V>
hm_status mem_alloc(int32_t device, uint64_t size, int32_t kind, void** ptr) {
  return guarded("mem_alloc", [&] {
    if (ptr == nullptr) fail(HM_ERR_INVALID_ARGUMENT, "ptr is NULL");
    *ptr = nullptr;
    device_state(V::state(), device);
    if (size == 0) fail(HM_ERR_INVALID_ARGUMENT, "size is 0");
    if (kind != HM_MEM_DEVICE && kind != HM_MEM_PINNED_HOST)
      fail(HM_ERR_INVALID_ARGUMENT, "kind %d is not HM_MEM_DEVICE or HM_MEM_PINNED_HOST", kind);
    Allocation a;
    a.size = size;
    a.kind = kind;
    a.device = device;
    void* result = nullptr;
    if (kind == HM_MEM_DEVICE) {
      typename V::Scope scope(device);
      result = V::alloc_device(size, &a);
    } else {
      a.host = true;
      result = V::alloc_pinned(device, size, &a);  // makes its device current where it must
    }
    V::state().table.insert(result, a);
    *ptr = result;
  });
}

template <typename V>
hm_status mem_free(void* ptr) {
  return guarded("mem_free", [&] {
    if (ptr == nullptr) return;
    auto& s = V::state();
    auto hit = s.table.find(ptr);
    if (!hit || hit->base != reinterpret_cast<uintptr_t>(ptr) ||
        (hit->allocation.kind != HM_MEM_DEVICE && hit->allocation.kind != HM_MEM_PINNED_HOST))
      fail(HM_ERR_INVALID_ARGUMENT, "%p is not the start of an allocation from mem_alloc", ptr);
    Allocation a = *s.table.erase(ptr);
    typename V::Scope scope(a.device);
    if (a.kind == HM_MEM_DEVICE)
      V::free_device(ptr);
    else
      V::free_pinned(ptr, a);
  });
}

template <typename V>
hm_status pointer_query(const void* ptr, hm_pointer_info* info) {
  return guarded("pointer_query", [&] {
    require_struct(info, HM_POINTER_INFO_SIZE_V1, "info");
    Memory m = classify<V>(ptr);
    const bool known = m.kind != HM_MEM_UNKNOWN;
    info->kind = m.kind;
    info->device = known ? m.device : -1;
    info->base = known ? reinterpret_cast<void*>(m.base) : nullptr;
    info->size = known ? m.size : 0;
  });
}

template <typename V>
hm_status memcpy_async(hm_stream stream, void* dst, const void* src, uint64_t size) {
  return guarded("memcpy_async", [&] {
    auto& s = stream_of<typename V::Stream>(stream);
    if (size == 0) return;
    if (dst == nullptr || src == nullptr) fail(HM_ERR_INVALID_ARGUMENT, "dst or src is NULL");
    check_known_range<V>(dst, size, "dst");
    check_known_range<V>(src, size, "src");
    typename V::Scope scope(s.device);
    // Unified addressing: the runtime finds each side's memory (any device, pinned, registered or
    // pageable host memory) and picks the direction, a peer copy included.
    V::copy_async(dst, src, size, s.stream);
  });
}

struct HostFill {
  void* dst;
  uint8_t value;
  uint64_t size;
};

inline void run_host_fill(void* user) {
  std::unique_ptr<HostFill> fill(static_cast<HostFill*>(user));
  std::memset(fill->dst, fill->value, fill->size);
}

template <typename V>
hm_status memset_async(hm_stream stream, void* dst, int32_t value, uint64_t size) {
  return guarded("memset_async", [&] {
    auto& s = stream_of<typename V::Stream>(stream);
    if (size == 0) return;
    if (dst == nullptr) fail(HM_ERR_INVALID_ARGUMENT, "dst is NULL");
    check_known_range<V>(dst, size, "dst");
    Memory m = classify<V>(dst);
    typename V::Scope scope(s.device);
    if (m.kind != HM_MEM_UNKNOWN && !m.host) {
      V::fill_async(dst, static_cast<uint8_t>(value), size, s.stream);
      return;
    }
    // Host memory: the host fills it in stream order (no kernel touches host pages).
    auto fill = std::make_unique<HostFill>(HostFill{dst, static_cast<uint8_t>(value), size});
    V::launch_host_func(s, run_host_fill, fill.get());
    fill.release();  // run_host_fill owns it now
  });
}

template <typename V>
hm_status host_register(void* ptr, uint64_t size) {
  return guarded("host_register", [&] {
    auto& s = V::state();
    if (s.devices.empty())
      fail(HM_ERR_NOT_SUPPORTED, "no device to register memory with (%s)",
           s.no_device_reason.c_str());
    require(*s.devices[0], HM_CAP_HOST_REGISTER, "host_register");
    if (ptr == nullptr || size == 0) fail(HM_ERR_INVALID_ARGUMENT, "empty range");
    if (s.table.overlaps(ptr, size))
      fail(HM_ERR_INVALID_ARGUMENT, "[%p, +%llu) overlaps memory this plugin already knows", ptr,
           static_cast<unsigned long long>(size));
    Allocation a;
    a.size = size;
    a.kind = HM_MEM_REGISTERED_HOST;
    a.device = 0;
    a.host = true;
    // Memory another user of the runtime in this process pinned (a framework's pinned tensor, or
    // a second plugin over the same driver) is reachable as it is, and the runtime would refuse
    // to register it again: it is recorded, and host_unregister leaves it pinned. It stays
    // reachable only while that user keeps it pinned.
    if (Memory pinned = V::classify_foreign(ptr); pinned.kind == HM_MEM_PINNED_HOST) {
      const auto start = reinterpret_cast<uintptr_t>(ptr);
      if (start < pinned.base || size > pinned.size - (start - pinned.base))
        fail(HM_ERR_INVALID_ARGUMENT,
             "[%p, +%llu) starts in memory the runtime pinned already and runs past its end", ptr,
             static_cast<unsigned long long>(size));
      a.adopted = true;
    } else {
      a.device_address = V::register_host(0, ptr, size);
    }
    s.table.insert(ptr, a);
  });
}

template <typename V>
hm_status host_unregister(void* ptr) {
  return guarded("host_unregister", [&] {
    auto& s = V::state();
    auto hit = s.table.find(ptr);
    if (ptr == nullptr || !hit || hit->base != reinterpret_cast<uintptr_t>(ptr) ||
        hit->allocation.kind != HM_MEM_REGISTERED_HOST)
      fail(HM_ERR_INVALID_ARGUMENT, "%p was not registered with host_register", ptr);
    s.table.erase(ptr);
    if (hit->allocation.adopted) return;
    typename V::Scope scope(hit->allocation.device);
    V::unregister_host(ptr);
  });
}

}  // namespace hm::kit::gpu
