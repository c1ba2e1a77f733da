// The cuda plugin's dma-buf export: fds for RDMA NICs (cuMemGetHandleForAddressRange) over
// page-aligned ranges of one device allocation, released by the kit's close_dmabuf.
#include "cuda_slots.hpp"
#include "cuda_state.hpp"

#include <cstdint>

namespace hm::cuda {

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

}  // namespace hm::cuda
