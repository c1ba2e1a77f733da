// The level_zero plugin's memory calls for the kit's GPU layer (hetmesh/plugin_kit/gpu_memory.hpp
// has the slots): device memory (zeMemAllocDevice), pinned memory (zeMemAllocHost), no host
// registration (core Level Zero has none), what Level Zero says of a pointer the plugin does not
// know, copies and fills.
#include "level_zero_slots.hpp"

#include <hetmesh/plugin_kit/gpu_devices.hpp>

#include <array>
#include <cstdint>
#include <mutex>

namespace hm::level_zero {
namespace {

// zeCommandListAppendMemoryFill reads its pattern from a pointer: one static byte per value, valid
// for as long as any stream might still run the fill.
constexpr std::array<uint8_t, 256> kFillPatterns = [] {
  std::array<uint8_t, 256> patterns{};
  for (size_t i = 0; i < patterns.size(); ++i)
    patterns[i] = static_cast<uint8_t>(i);
  return patterns;
}();

// The device index of a Level Zero device handle, or -1.
int32_t index_of(const State& s, ze_device_handle_t handle) {
  for (size_t i = 0; i < s.devices.size(); ++i)
    if (s.devices[i]->handle == handle) return static_cast<int32_t>(i);
  return -1;
}

}  // namespace

void* Vendor::alloc_device(uint64_t size, Allocation* a) {
  const DeviceState& d = device_state(DeviceScope::current());
  ze_device_mem_alloc_desc_t desc{};
  desc.stype = ZE_STRUCTURE_TYPE_DEVICE_MEM_ALLOC_DESC;
  desc.ordinal = 0;
  // Exportable as a dma-buf where the device can (dmabuf_export).
  ze_external_memory_export_desc_t exportable = dmabuf_exportable();
  if (d.capabilities & HM_CAP_DMABUF_EXPORT) desc.pNext = &exportable;
  void* result = nullptr;
  HM_ZE(zeMemAllocDevice, d.driver->context, &desc, size, hm::kit::gpu::kMemoryAlignment, d.handle,
        &result);
  a->device_address = reinterpret_cast<uintptr_t>(result);
  return result;
}

void Vendor::free_device(void* ptr) {
  HM_ZE(zeMemFree, device_state(DeviceScope::current()).driver->context, ptr);
}

// Host memory of the device's context, which every device of that context reaches (Level Zero's
// host allocations are not tied to a device). Not memfd-backed: it cannot travel by IPC.
void* Vendor::alloc_pinned(int32_t device, uint64_t size, Allocation* a) {
  const DeviceState& d = device_state(device);
  ze_host_mem_alloc_desc_t desc{};
  desc.stype = ZE_STRUCTURE_TYPE_HOST_MEM_ALLOC_DESC;
  void* result = nullptr;
  HM_ZE(zeMemAllocHost, d.driver->context, &desc, size, hm::kit::page_size(), &result);
  a->device_address = reinterpret_cast<uintptr_t>(result);
  return result;
}

void Vendor::free_pinned(void* ptr, const Allocation& a) {
  HM_ZE(zeMemFree, device_state(a.device).driver->context, ptr);
}

// Core Level Zero cannot page-lock existing host memory (HM_CAP_HOST_REGISTER is clear, so the
// kit answers host_register itself; these are never reached).
uint64_t Vendor::register_host(int32_t, void*, uint64_t) {
  fail(HM_ERR_NOT_SUPPORTED, "Level Zero has no host memory registration");
}

void Vendor::unregister_host(void*) {
  fail(HM_ERR_NOT_SUPPORTED, "Level Zero has no host memory registration");
}

// Memory another Level Zero user in this process allocated (a framework's tensors), as the
// plugin's contexts see it: zeMemGetAllocProperties gives its type and device,
// zeMemGetAddressRange the whole allocation.
Memory Vendor::classify_foreign(const void* ptr) {
  State& s = state();
  const Loader& z = s.ze;
  for (const auto& driver : s.drivers) {
    ze_memory_allocation_properties_t properties{};
    properties.stype = ZE_STRUCTURE_TYPE_MEMORY_ALLOCATION_PROPERTIES;
    ze_device_handle_t device = nullptr;
    if (z.zeMemGetAllocProperties(driver->context, ptr, &properties, &device) != ZE_RESULT_SUCCESS)
      continue;
    if (properties.type == ZE_MEMORY_TYPE_UNKNOWN) continue;
    void* base = nullptr;
    size_t size = 0;
    if (z.zeMemGetAddressRange(driver->context, ptr, &base, &size) != ZE_RESULT_SUCCESS) continue;
    // Shared (migrating) memory is neither device nor pinned memory to the ABI.
    const int32_t kind = properties.type == ZE_MEMORY_TYPE_DEVICE ? HM_MEM_DEVICE
                         : properties.type == ZE_MEMORY_TYPE_HOST ? HM_MEM_PINNED_HOST
                                                                  : HM_MEM_UNKNOWN;
    return hm::kit::gpu::foreign_memory(kind, device != nullptr ? index_of(s, device) : -1,
                                        s.devices.size(), reinterpret_cast<uintptr_t>(base), size);
  }
  return {};
}

void Vendor::copy_async(void* dst, const void* src, uint64_t size, Queue* q) {
  std::lock_guard lock(q->mutex);
  fence(*q);
  HM_ZE(zeCommandListAppendMemoryCopy, q->list, dst, src, size, nullptr, 0, nullptr);
  q->unfenced = true;
  q->dirty = true;
}

void Vendor::fill_async(void* dst, uint8_t value, uint64_t size, Queue* q) {
  std::lock_guard lock(q->mutex);
  fence(*q);
  HM_ZE(zeCommandListAppendMemoryFill, q->list, dst, &kFillPatterns[value], 1, size, nullptr, 0,
        nullptr);
  q->unfenced = true;
  q->dirty = true;
}

}  // namespace hm::level_zero
