// The cuda plugin's memory calls for the kit's GPU layer (hetmesh/plugin_kit/gpu_memory.hpp has the
// slots): device memory (cuMemAlloc), pinned memory (memfd pages registered with CUDA, else
// cuMemHostAlloc), host registration, what CUDA says of a pointer the plugin does not know, copies
// and fills.
#include "cuda_slots.hpp"
#include "cuda_state.hpp"

#include <hetmesh/plugin_kit/gpu_pinned.hpp>

#include <cstring>
#include <memory>

namespace hm::cuda {

void* Vendor::alloc_device(uint64_t size, Allocation* a) {
  CUdeviceptr address = 0;
  HM_CU(cuMemAlloc, &address, size);
  a->device_address = address;
  return reinterpret_cast<void*>(address);
}

void Vendor::free_device(void* ptr) {
  HM_CU(cuMemFree, reinterpret_cast<CUdeviceptr>(ptr));
}

void* Vendor::alloc_pinned(int32_t device, uint64_t size, Allocation* a) {
  if (device_state(device).memfd_pinned)
    return hm::kit::gpu::alloc_memfd_pinned<Vendor>(device, size, a);
  ContextScope scope(device);
  void* result = nullptr;
  HM_CU(cuMemHostAlloc, &result, size, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP);
  a->device_address = host_device_address(result);
  return result;
}

void Vendor::free_pinned(void* ptr, const Allocation& a) {
  if (a.fd >= 0)
    hm::kit::gpu::release_memfd_mapping<Vendor>(ptr, a);
  else
    HM_CU(cuMemFreeHost, ptr);
}

// Registers [ptr, ptr+size) with every context (PORTABLE) and maps it for the devices (DEVICEMAP).
uint64_t Vendor::register_host(int32_t device, void* ptr, uint64_t size) {
  ContextScope scope(device);
  HM_CU(cuMemHostRegister, ptr, size, CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP);
  try {
    return host_device_address(ptr);
  } catch (...) {
    drv().cuMemHostUnregister(ptr);
    throw;
  }
}

void Vendor::unregister_host(void* ptr) {
  HM_CU(cuMemHostUnregister, ptr);
}

Memory Vendor::classify_foreign(const void* ptr) {
  State& s = state();
  // Ask CUDA in the context of a device we already use, or the caller's own.
  std::unique_ptr<ContextScope> scope;
  for (int32_t d = 0; d < static_cast<int32_t>(s.devices.size()); ++d)
    if (s.devices[static_cast<size_t>(d)]->retained.load(std::memory_order_acquire)) {
      scope = std::make_unique<ContextScope>(d);
      break;
    }
  CUpointer_attribute attributes[] = {
      CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
      CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, CU_POINTER_ATTRIBUTE_RANGE_SIZE,
      CU_POINTER_ATTRIBUTE_IS_MANAGED};
  constexpr unsigned kCount = sizeof attributes / sizeof attributes[0];
  // Each value fits 8 zeroed bytes, read back in its own type (all little-endian integers).
  uint64_t values[kCount] = {};
  void* data[kCount];
  for (unsigned i = 0; i < kCount; ++i)
    data[i] = &values[i];
  if (s.driver.cuPointerGetAttributes(kCount, attributes, data,
                                      reinterpret_cast<CUdeviceptr>(ptr)) != CUDA_SUCCESS)
    return {};
  unsigned type;
  int ordinal;
  std::memcpy(&type, &values[0], sizeof type);
  std::memcpy(&ordinal, &values[1], sizeof ordinal);
  bool managed = (values[4] & 0xff) != 0;
  int32_t kind = managed                        ? HM_MEM_UNKNOWN
                 : type == CU_MEMORYTYPE_DEVICE ? HM_MEM_DEVICE
                 : type == CU_MEMORYTYPE_HOST   ? HM_MEM_PINNED_HOST
                                                : HM_MEM_UNKNOWN;
  return hm::kit::gpu::foreign_memory(kind, ordinal, s.devices.size(), values[2], values[3]);
}

void Vendor::copy_async(void* dst, const void* src, uint64_t size, CUstream stream) {
  HM_CU(cuMemcpyAsync, reinterpret_cast<CUdeviceptr>(dst), reinterpret_cast<CUdeviceptr>(src), size,
        stream);
}

void Vendor::fill_async(void* dst, uint8_t value, uint64_t size, CUstream stream) {
  HM_CU(cuMemsetD8Async, reinterpret_cast<CUdeviceptr>(dst), value, size, stream);
}

}  // namespace hm::cuda
