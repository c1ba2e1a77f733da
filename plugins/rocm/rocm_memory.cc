// The rocm plugin's memory calls for the kit's GPU layer (hetmesh/plugin_kit/gpu_memory.hpp has the
// slots): device memory (hipMalloc), pinned memory (memfd pages registered with HIP rather than
// hipHostMalloc, so ipc_export can share them), host registration, what HIP says of a pointer the
// plugin does not know, copies and fills.
#include "rocm_slots.hpp"

#include <hetmesh/plugin_kit/gpu_pinned.hpp>

namespace hm::rocm {

void* Vendor::alloc_device(uint64_t size, Allocation*) {
  void* result = nullptr;
  HM_HIP(hipMalloc, &result, size);
  return result;
}

void Vendor::free_device(void* ptr) {
  HM_HIP(hipFree, ptr);
}

void* Vendor::alloc_pinned(int32_t device, uint64_t size, Allocation* a) {
  return hm::kit::gpu::alloc_memfd_pinned<Vendor>(device, size, a);
}

void Vendor::free_pinned(void* ptr, const Allocation& a) {
  hm::kit::gpu::release_memfd_mapping<Vendor>(ptr, a);
}

// Page-locks [ptr, ptr + size) for every device (portable) and maps it for device access. HIP
// takes host addresses as they are, so there is no device address to keep.
uint64_t Vendor::register_host(int32_t device, void* ptr, uint64_t size) {
  DeviceScope scope(device);
  HM_HIP(hipHostRegister, ptr, size, hipHostRegisterPortable | hipHostRegisterMapped);
  return 0;
}

void Vendor::unregister_host(void* ptr) {
  HM_HIP(hipHostUnregister, ptr);
}

Memory Vendor::classify_foreign(const void* ptr) {
  State& s = state();
  // A foreign pointer makes these calls fail, and HIP keeps that as the thread's last error, which
  // frameworks check after their own launches: clear it unless one was pending.
  const Runtime& hip = s.hip;
  const bool error_pending = hip.hipPeekAtLastError() != hipSuccess;
  hipPointerAttribute_t attributes{};
  hipDeviceptr_t base = nullptr;
  size_t size = 0;
  bool known = hip.hipPointerGetAttributes(&attributes, ptr) == hipSuccess &&
               hip.hipMemGetAddressRange(&base, &size, const_cast<void*>(ptr)) == hipSuccess;
  if (!known && !error_pending) (void)hip.hipGetLastError();
  if (!known) return {};
  int32_t kind = attributes.isManaged                           ? HM_MEM_UNKNOWN
                 : attributes.memoryType == hipMemoryTypeDevice ? HM_MEM_DEVICE
                 : attributes.memoryType == hipMemoryTypeHost   ? HM_MEM_PINNED_HOST
                                                                : HM_MEM_UNKNOWN;
  return hm::kit::gpu::foreign_memory(kind, attributes.device, s.devices.size(),
                                      reinterpret_cast<uintptr_t>(base), size);
}

void Vendor::copy_async(void* dst, const void* src, uint64_t size, hipStream_t stream) {
  HM_HIP(hipMemcpyAsync, dst, src, size, hipMemcpyDefault, stream);
}

void Vendor::fill_async(void* dst, uint8_t value, uint64_t size, hipStream_t stream) {
  HM_HIP(hipMemsetAsync, dst, value, size, stream);
}

}  // namespace hm::rocm
