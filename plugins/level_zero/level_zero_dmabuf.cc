// dma-buf export of device memory: allocations of a device that can export are made with a
// ze_external_memory_export_desc_t (DMA_BUF), and zeMemGetAllocProperties with a
// ze_external_memory_export_fd_t answers the allocation's dma-buf. The driver keeps that fd
// (compute-runtime caches it with the allocation, as for IPC), so the caller gets a duplicate,
// which the kit's close_dmabuf closes.
#include "level_zero_slots.hpp"

#include <fcntl.h>

#include <cerrno>
#include <cstring>

namespace hm::level_zero {

int driver_dmabuf_fd(const Driver& driver, const void* base) {
  ze_external_memory_export_fd_t fd{};
  fd.stype = ZE_STRUCTURE_TYPE_EXTERNAL_MEMORY_EXPORT_FD;
  fd.flags = ZE_EXTERNAL_MEMORY_TYPE_FLAG_DMA_BUF;
  fd.fd = -1;
  ze_memory_allocation_properties_t properties{};
  properties.stype = ZE_STRUCTURE_TYPE_MEMORY_ALLOCATION_PROPERTIES;
  properties.pNext = &fd;
  HM_ZE(zeMemGetAllocProperties, driver.context, base, &properties, nullptr);
  if (fd.fd < 0)
    fail(HM_ERR_BACKEND, "zeMemGetAllocProperties answered no dma-buf for %p (fd %d)", base, fd.fd);
  return fd.fd;
}

hm_status dmabuf_export(const void* ptr, uint64_t size, hm_dmabuf* out) {
  return guarded("dmabuf_export", [&] {
    Memory m = hm::kit::gpu::dmabuf_range<Vendor>(ptr, size, out);
    const int driver_fd =
        driver_dmabuf_fd(*device_state(m.device).driver, reinterpret_cast<void*>(m.base));
    const int fd = fcntl(driver_fd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0)
      fail(HM_ERR_OUT_OF_MEMORY, "duplicating the dma-buf fd %d: %s", driver_fd,
           std::strerror(errno));
    // The dma-buf is the whole allocation's.
    out->fd = fd;
    out->offset = reinterpret_cast<uintptr_t>(ptr) - m.base;
    out->length = size;
  });
}

}  // namespace hm::level_zero
