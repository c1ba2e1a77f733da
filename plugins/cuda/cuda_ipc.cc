// The cuda plugin's IPC calls for the kit's GPU layer (hetmesh/plugin_kit/gpu_ipc.hpp has the
// slots): CUDA IPC handles for device memory; pinned memory travels as its memfd.
#include "cuda_slots.hpp"
#include "cuda_state.hpp"

namespace hm::cuda {

void Vendor::ipc_get(CUipcMemHandle* handle, void* base) {
  HM_CU(cuIpcGetMemHandle, handle, reinterpret_cast<CUdeviceptr>(base));
}

void* Vendor::ipc_open(const CUipcMemHandle& handle, Allocation* a) {
  CUdeviceptr address = 0;
  HM_CU(cuIpcOpenMemHandle, &address, handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
  a->device_address = address;
  return reinterpret_cast<void*>(address);
}

void Vendor::ipc_close(void* ptr) {
  HM_CU(cuIpcCloseMemHandle, reinterpret_cast<CUdeviceptr>(ptr));
}

}  // namespace hm::cuda
