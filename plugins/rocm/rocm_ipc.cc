// The rocm plugin's IPC calls for the kit's GPU layer (hetmesh/plugin_kit/gpu_ipc.hpp has the
// slots): HIP IPC handles for device memory; pinned memory travels as its memfd.
#include "rocm_slots.hpp"

namespace hm::rocm {

void Vendor::ipc_get(hipIpcMemHandle_t* handle, void* base) {
  HM_HIP(hipIpcGetMemHandle, handle, base);
}

void* Vendor::ipc_open(const hipIpcMemHandle_t& handle, Allocation*) {
  void* result = nullptr;
  HM_HIP(hipIpcOpenMemHandle, &result, handle, hipIpcMemLazyEnablePeerAccess);
  return result;
}

void Vendor::ipc_close(void* ptr) {
  HM_HIP(hipIpcCloseMemHandle, ptr);
}

}  // namespace hm::rocm
