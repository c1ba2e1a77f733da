// The IPC slots of a GPU plugin over the vendor calls of `V` (gpu_vendor.hpp lists them): device
// memory (the plugin's, or a framework's in this process) through the runtime's IPC handles,
// pinned memory through its memfd (gpu_pinned.hpp).
#pragma once

#include "gpu_address.hpp"
#include "gpu_ipc_handle.hpp"
#include "gpu_pinned.hpp"
#include "gpu_state.hpp"
#include "ipc_kind.hpp"
#include "status.hpp"

#include <unistd.h>

#include <mutex>
#include <optional>

namespace hm::kit::gpu {

template <typename V>
hm_status ipc_export(void* ptr, hm_ipc_handle* handle) {
  return guarded("ipc_export", [&] {
    if (handle == nullptr) fail(HM_ERR_INVALID_ARGUMENT, "handle is NULL");
    auto& s = V::state();
    // Device memory is the plugin's or the runtime's for another user in this process (a
    // framework's allocator: a caller's tensors); pinned memory only the plugin's, whose memfd
    // is what travels.
    const Memory m = classify<V>(ptr);
    auto hit = ptr != nullptr ? s.table.find(ptr) : std::nullopt;
    const bool pinned = hit && hit->allocation.kind == HM_MEM_PINNED_HOST;
    if (m.kind != HM_MEM_DEVICE && !pinned)
      fail(HM_ERR_INVALID_ARGUMENT,
           "%p is neither device memory of %s nor pinned memory from mem_alloc", ptr,
           V::kInfo.runtime);
    require(device_state(s, m.device), HM_CAP_IPC, "IPC");
    IpcHandle<typename V::IpcNative> h{};
    h.magic = V::kInfo.ipc_magic;
    h.version = kIpcVersion;
    h.kind = static_cast<uint16_t>(m.kind);
    h.pid = static_cast<int32_t>(getpid());
    h.fd = -1;
    h.nonce = s.nonce;
    h.size = m.size;
    h.device = m.device;
    if (pinned) {
      if (hit->allocation.fd < 0) fail(HM_ERR_NOT_SUPPORTED, "this pinned memory is not shareable");
      h.fd = hit->allocation.fd;
    } else if (hit) {
      typename V::Scope scope(m.device);
      V::ipc_get(&h.native, reinterpret_cast<void*>(m.base));
    } else {
      // The runtime's whole allocation, where it can share it (not a virtual-memory or pool
      // allocation, say): NOT_SUPPORTED otherwise, as the ABI's other unsharable memory.
      typename V::Scope scope(m.device);
      try {
        V::ipc_get(&h.native, reinterpret_cast<void*>(m.base));
      } catch (const Failure& refused) {
        fail(HM_ERR_NOT_SUPPORTED, "%s cannot share this allocation at %p: %s", V::kInfo.runtime,
             reinterpret_cast<void*>(m.base), refused.message.c_str());
      }
    }
    *handle = encode(h);
  });
}

template <typename V>
hm_status ipc_open(int32_t device, const hm_ipc_handle* handle, void** ptr) {
  return guarded("ipc_open", [&] {
    if (handle == nullptr || ptr == nullptr) fail(HM_ERR_INVALID_ARGUMENT, "handle or ptr is NULL");
    *ptr = nullptr;
    auto& s = V::state();
    require(device_state(s, device), HM_CAP_IPC, "IPC");
    auto h = decode<typename V::IpcNative>(handle, V::kInfo.ipc_magic, V::kInfo.name);
    if (h.pid == static_cast<int32_t>(getpid()) && h.nonce == s.nonce)
      fail(HM_ERR_NOT_SUPPORTED,
           "the handle was exported by this process; %s cannot open its own IPC handles, use "
           "the exported pointer directly",
           V::kInfo.runtime);
    Allocation a;
    a.size = h.size;
    a.kind = HM_MEM_IPC_MAPPED;
    a.device = device;
    void* result = nullptr;
    std::lock_guard lock(s.ipc_mutex);
    if (h.kind == HM_MEM_DEVICE) {
      typename V::Scope scope(device);
      result = V::ipc_open(h.native, &a);
      // The runtime maps an allocation once per process and counts its opens (CUDA, HIP): a
      // second open answers the same base, and each open needs its close.
      auto mapped = s.table.find(result);
      if (mapped && mapped->base == reinterpret_cast<uintptr_t>(result) &&
          is_ipc_mapping(mapped->allocation.kind) && mapped->allocation.device == device) {
        a = mapped->allocation;
        ++a.ipc_opens;
      }
    } else {
      result = open_memfd_pinned<V>(device, h.pid, h.fd, h.size, &a);
      a.kind = host_pointer_mapping_kind(s.host);  // the memfd's pages, mapped here
    }
    s.table.insert(result, a);
    *ptr = result;
  });
}

template <typename V>
hm_status ipc_close(void* ptr) {
  return guarded("ipc_close", [&] {
    auto& s = V::state();
    std::lock_guard lock(s.ipc_mutex);
    auto hit = ptr != nullptr ? s.table.find(ptr) : std::nullopt;
    if (!hit || hit->base != reinterpret_cast<uintptr_t>(ptr) ||
        !is_ipc_mapping(hit->allocation.kind))
      fail(HM_ERR_INVALID_ARGUMENT, "%p is not a base address returned by ipc_open", ptr);
    Allocation a = hit->allocation;
    typename V::Scope scope(a.device);
    if (a.ipc_opens > 1) {  // the runtime's count first: a failed close leaves both counts as were
      V::ipc_close(ptr);
      --a.ipc_opens;
      s.table.insert(ptr, a);
      return;
    }
    // Out of the table before the unmapping, so that no new allocation at this address finds it
    // there; back in if the unmapping failed, for a later close to try again.
    s.table.erase(ptr);
    try {
      if (a.host)
        release_memfd_mapping<V>(ptr, a);
      else
        V::ipc_close(ptr);
    } catch (...) {
      s.table.insert(ptr, a);
      throw;
    }
  });
}

}  // namespace hm::kit::gpu
