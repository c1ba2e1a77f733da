// The memory, IPC and dma-buf slots of a plugin whose device memory is a HostMemory (the cpu
// plugin, the asic_stub simulator): install_host_memory() fills them in one call. The plugin
// supplies how to reach its HostMemory (failing with HM_ERR_UNINITIALIZED before initialize()).
#pragma once

#include "host_memory.hpp"
#include "status.hpp"

namespace hm::kit {

using HostMemoryAccessor = HostMemory& (*)();

inline HostMemoryAccessor& host_memory_accessor() {
  static HostMemoryAccessor accessor = nullptr;
  return accessor;
}

namespace host_memory_detail {

inline HostMemory& memory() {
  return host_memory_accessor()();
}

inline hm_status mem_alloc(int32_t device, uint64_t size, int32_t kind, void** ptr) {
  return guarded("mem_alloc", [&] {
    if (ptr == nullptr) fail(HM_ERR_INVALID_ARGUMENT, "ptr is NULL");
    *ptr = memory().alloc(device, size, kind);
  });
}

inline hm_status mem_free(void* ptr) {
  return guarded("mem_free", [&] { memory().free(ptr); });
}

inline hm_status pointer_query(const void* ptr, hm_pointer_info* info) {
  return guarded("pointer_query", [&] { memory().query(ptr, info); });
}

inline hm_status host_register(void* ptr, uint64_t size) {
  return guarded("host_register", [&] { memory().register_host(ptr, size); });
}

inline hm_status host_unregister(void* ptr) {
  return guarded("host_unregister", [&] { memory().unregister_host(ptr); });
}

inline hm_status ipc_export(void* ptr, hm_ipc_handle* handle) {
  return guarded("ipc_export", [&] {
    if (handle == nullptr) fail(HM_ERR_INVALID_ARGUMENT, "handle is NULL");
    *handle = memory().ipc_export(ptr);
  });
}

inline hm_status ipc_open(int32_t device, const hm_ipc_handle* handle, void** ptr) {
  return guarded("ipc_open", [&] {
    if (ptr == nullptr) fail(HM_ERR_INVALID_ARGUMENT, "ptr is NULL");
    *ptr = memory().ipc_open(device, handle);
  });
}

inline hm_status ipc_close(void* ptr) {
  return guarded("ipc_close", [&] { memory().ipc_close(ptr); });
}

inline hm_status dmabuf_export(const void* ptr, uint64_t size, hm_dmabuf* out) {
  return guarded("dmabuf_export", [&] {
    require_struct(out, HM_DMABUF_SIZE_V1, "out");
    if (!udmabuf_available())
      fail(HM_ERR_NOT_SUPPORTED, "/dev/udmabuf is not available on this kernel");
    hm_dmabuf result = memory().dmabuf_export(ptr, size);
    out->fd = result.fd;
    out->offset = result.offset;
    out->length = result.length;
  });
}

inline hm_status dmabuf_release(const hm_dmabuf* dmabuf) {
  return guarded("dmabuf_release", [&] {
    require_struct(dmabuf, HM_DMABUF_SIZE_V1, "dmabuf");
    if (close(dmabuf->fd) != 0) fail(HM_ERR_INVALID_ARGUMENT, "fd %d is not open", dmabuf->fd);
  });
}

}  // namespace host_memory_detail

// Fills mem_alloc, mem_free, pointer_query, the IPC and dma-buf slots, and, with
// `host_register`, host_register/host_unregister (set HM_CAP_HOST_REGISTER to match).
inline void install_host_memory(hm_device_plugin_api* api, HostMemoryAccessor accessor,
                                bool host_register) {
  namespace d = host_memory_detail;
  host_memory_accessor() = accessor;
  api->mem_alloc = d::mem_alloc;
  api->mem_free = d::mem_free;
  api->pointer_query = d::pointer_query;
  api->ipc_export = d::ipc_export;
  api->ipc_open = d::ipc_open;
  api->ipc_close = d::ipc_close;
  api->dmabuf_export = d::dmabuf_export;
  api->dmabuf_release = d::dmabuf_release;
  if (host_register) {
    api->host_register = d::host_register;
    api->host_unregister = d::host_unregister;
  }
}

}  // namespace hm::kit
