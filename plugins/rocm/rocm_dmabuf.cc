// dma-buf export of device memory: hsa_amd_portable_export_dmabuf, for page-aligned ranges.
#include "rocm_slots.hpp"

namespace hm::rocm {

hm_status dmabuf_export(const void* ptr, uint64_t size, hm_dmabuf* out) {
  return guarded("dmabuf_export", [&] {
    hm::kit::gpu::dmabuf_range<Vendor>(ptr, size, out);
    const HsaDmabuf& hsa = state().hsa;
    int fd = -1;
    uint64_t offset = 0;
    hsa_status_t status = hsa.export_dmabuf(ptr, size, &fd, &offset);
    if (status != HSA_STATUS_SUCCESS)
      fail(status == HSA_STATUS_ERROR_INVALID_ARGUMENT ? HM_ERR_INVALID_ARGUMENT : HM_ERR_BACKEND,
           "hsa_amd_portable_export_dmabuf failed: %s", describe(hsa, status).c_str());
    // The dma-buf may cover the whole allocation; offset is where ptr lies inside it.
    out->fd = fd;
    out->offset = offset;
    out->length = size;
  });
}

hm_status dmabuf_release(const hm_dmabuf* dmabuf) {
  return guarded("dmabuf_release", [&] {
    hm::kit::require_struct(dmabuf, HM_DMABUF_SIZE_V1, "dmabuf");
    if (dmabuf->fd < 0) fail(HM_ERR_INVALID_ARGUMENT, "fd %d is not open", dmabuf->fd);
    const HsaDmabuf& hsa = state().hsa;
    if (hsa.close_dmabuf == nullptr)
      fail(HM_ERR_NOT_SUPPORTED, "no dma-buf export here: %s",
           state().devices.empty() ? state().no_device_reason.c_str()
                                   : state().dmabuf_unavailable.c_str());
    hsa_status_t status = hsa.close_dmabuf(dmabuf->fd);
    if (status != HSA_STATUS_SUCCESS)
      fail(HM_ERR_INVALID_ARGUMENT, "hsa_amd_portable_close_dmabuf(%d) failed: %s", dmabuf->fd,
           describe(hsa, status).c_str());
  });
}

}  // namespace hm::rocm
