// What pointer_query calls an allocation opened through ipc_open.
#pragma once

#include <hetmesh/device_plugin.h>

#include <cstdint>

namespace hm::kit {

// A peer's pinned host memory, mapped here as a host pointer, is HM_MEM_IPC_MAPPED_HOST for a
// host of ABI minor >= 1 (which then writes small things into it with memcpy instead of a copy
// engine); an older host does not know that kind and gets HM_MEM_IPC_MAPPED.
inline int32_t host_pointer_mapping_kind(const hm_host_api* host) {
  return host != nullptr && host->abi_minor >= 1 ? HM_MEM_IPC_MAPPED_HOST : HM_MEM_IPC_MAPPED;
}

inline bool is_ipc_mapping(int32_t kind) {
  return kind == HM_MEM_IPC_MAPPED || kind == HM_MEM_IPC_MAPPED_HOST;
}

}  // namespace hm::kit
