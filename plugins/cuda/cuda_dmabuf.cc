// The cuda plugin's IPC calls for the kit's GPU layer (hetmesh/plugin_kit/gpu_ipc.hpp has the
// slots; pinned memory travels as its memfd), and the dma-buf slots: fds for RDMA NICs.
#include "cuda_slots.hpp"
#include "cuda_state.hpp"

#include <unistd.h>

#include <cstdint>

namespace hm::cuda {

// ---- IPC ----

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

// ---- slots: dma-buf ----

hm_status dmabuf_export(const void* ptr, uint64_t size, hm_dmabuf* out) {
  return guarded("dmabuf_export", [&] {
    Memory m = hm::kit::gpu::dmabuf_range<Vendor>(ptr, size, out);
    auto start = reinterpret_cast<uintptr_t>(ptr);
    ContextScope scope(m.device);
    CUdeviceptr base = 0;
    size_t extent = 0;
    HM_CU(cuMemGetAddressRange, &base, &extent, static_cast<CUdeviceptr>(start));
    if (start + size > base + extent)
      fail(HM_ERR_INVALID_ARGUMENT, "%p + %llu overruns its allocation (%zu bytes at %p)", ptr,
           static_cast<unsigned long long>(size), extent, reinterpret_cast<void*>(base));
    int fd = -1;
    HM_CU(cuMemGetHandleForAddressRange, &fd, static_cast<CUdeviceptr>(start), size,
          CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
    out->fd = fd;
    out->offset = 0;
    out->length = size;
  });
}

hm_status dmabuf_release(const hm_dmabuf* dmabuf) {
  return guarded("dmabuf_release", [&] {
    hm::kit::require_struct(dmabuf, HM_DMABUF_SIZE_V1, "dmabuf");
    if (dmabuf->fd < 0 || close(dmabuf->fd) != 0)
      fail(HM_ERR_INVALID_ARGUMENT, "fd %d is not open", dmabuf->fd);
  });
}

}  // namespace hm::cuda
