// The bytes of a GPU plugin's hm_ipc_handle: device memory travels as the runtime's own IPC handle
// (`Native`: CUipcMemHandle, hipIpcMemHandle_t), pinned memory as the exporter's memfd
// (gpu_pinned.hpp). The pid and nonce tell whether the exporter is this very process.
#pragma once

#include "status.hpp"

#include <hetmesh/device_plugin.h>

#include <cstdint>
#include <cstring>

namespace hm::kit::gpu {

constexpr uint16_t kIpcVersion = 1;

template <typename Native>
struct IpcHandle {
  uint32_t magic;     // the plugin's, VendorInfo::ipc_magic
  uint16_t version;   // kIpcVersion
  uint16_t kind;      // HM_MEM_DEVICE or HM_MEM_PINNED_HOST
  int32_t pid;        // the exporting process
  int32_t fd;         // pinned: the exporter's memfd
  uint64_t nonce;     // the exporter's State::nonce
  uint64_t size;      // bytes of the exported allocation
  int32_t device;     // the exporter's device
  uint32_t reserved;  // 0
  Native native;      // device memory: the runtime's IPC handle
};

template <typename Native>
hm_ipc_handle encode(const IpcHandle<Native>& h) {
  static_assert(sizeof h <= HM_IPC_HANDLE_BYTES);
  hm_ipc_handle handle{};
  std::memcpy(handle.bytes, &h, sizeof h);
  return handle;
}

// The handle's fields, checked: made by plugin `name` (`magic`), of this version, and well formed.
template <typename Native>
IpcHandle<Native> decode(const hm_ipc_handle* handle, uint32_t magic, const char* name) {
  IpcHandle<Native> h;
  std::memcpy(&h, handle->bytes, sizeof h);
  if (h.magic != magic)
    fail(HM_ERR_INVALID_ARGUMENT, "handle was not exported by the %s plugin (magic %08x)", name,
         h.magic);
  if (h.version != kIpcVersion)
    fail(HM_ERR_INVALID_ARGUMENT, "handle version %u, this plugin reads %u", h.version,
         kIpcVersion);
  if ((h.kind != HM_MEM_DEVICE && h.kind != HM_MEM_PINNED_HOST) || h.size == 0 || h.pid <= 0 ||
      (h.kind == HM_MEM_PINNED_HOST && h.fd < 0))
    fail(HM_ERR_INVALID_ARGUMENT, "handle is malformed (kind %u, size %llu, pid %d)", h.kind,
         static_cast<unsigned long long>(h.size), h.pid);
  return h;
}

}  // namespace hm::kit::gpu
