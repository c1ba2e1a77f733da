// The cuda plugin's lifecycle calls for the kit's GPU layer (hetmesh/plugin_kit/gpu_devices.hpp
// has initialize, device_count and device_properties): loading the driver, device discovery and
// the capability bits that gate the optional slots; and the shutdown slot.
#include "cuda_slots.hpp"
#include "cuda_state.hpp"

#include <hetmesh/plugin_kit/gpu_devices.hpp>

#include <memory>
#include <string>
#include <vector>

namespace hm::cuda {

namespace {

int attribute(const Driver& driver, CUdevice device, CUdevice_attribute which) {
  int value = 0;
  if (driver.cuDeviceGetAttribute(&value, which, device) != CUDA_SUCCESS) return 0;
  return value;
}

}  // namespace

// libcuda.so.1 is loaded, not linked (cuda_loader.cc).
std::string Vendor::load(State& s) {
  return hm::cuda::load_driver(&s.driver);
}

std::string Vendor::runtime_text(const State& s) {
  return "driver CUDA " + std::to_string(s.driver_version / 1000) + "." +
         std::to_string(s.driver_version % 1000 / 10);
}

void Vendor::discover(State& s) {
  const Driver& d = s.driver;
  CUresult result = d.cuInit(0);
  if (result != CUDA_SUCCESS) {
    s.no_device_reason = "cuInit failed: " + hm::cuda::describe(d, result);
    return;
  }
  d.cuDriverGetVersion(&s.driver_version);
  int count = 0;
  result = d.cuDeviceGetCount(&count);
  if (result != CUDA_SUCCESS) {
    s.no_device_reason = "cuDeviceGetCount failed: " + hm::cuda::describe(d, result);
    return;
  }
  if (count == 0) {
    s.no_device_reason = "the NVIDIA driver reports no CUDA device (cuDeviceGetCount = 0)";
    return;
  }
  for (int i = 0; i < count; ++i) {
    auto device = std::make_unique<DeviceState>();
    check(d.cuDeviceGet(&device->handle, i), "cuDeviceGet");
    char name[128] = {};
    check(d.cuDeviceGetName(name, sizeof name - 1, device->handle), "cuDeviceGetName");
    device->name = name;
    size_t total = 0;
    check(d.cuDeviceTotalMem(&total, device->handle), "cuDeviceTotalMem");
    device->total_memory = total;
    char bus[64] = {};
    if (d.cuDeviceGetPCIBusId(bus, sizeof bus - 1, device->handle) == CUDA_SUCCESS)
      device->pci_bus_id = hm::kit::gpu::sysfs_pci_bus_id(bus);
    device->numa_node = hm::kit::gpu::read_numa_node(device->pci_bus_id);

    bool host_register = attribute(d, device->handle, CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED);
    bool wait_nor =
        attribute(d, device->handle, CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR) ||
        attribute(d, device->handle, CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR_V1);
    bool dmabuf = attribute(d, device->handle, CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED);
    bool unified = attribute(d, device->handle, CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING);
    device->flush_remote_writes =
        attribute(d, device->handle, CU_DEVICE_ATTRIBUTE_CAN_FLUSH_REMOTE_WRITES);
    device->memfd_pinned = host_register;
    hm_capabilities caps = HM_CAP_DEVICE_MEMORY | HM_CAP_PINNED_HOST_MEMORY | HM_CAP_HOST_CALLBACK |
                           HM_CAP_EVENT_TIMING | HM_CAP_PEER_COPY;
    // IPC needs shareable pinned memory too (memfd + registration) and unified addressing.
    if (host_register) caps |= HM_CAP_HOST_REGISTER;
    if (host_register && unified) caps |= HM_CAP_IPC;
    // HM_WAIT_NOR is part of the promise, so NOR support gates the whole bit.
    if (wait_nor) caps |= HM_CAP_STREAM_MEMOPS;
    if (dmabuf) caps |= HM_CAP_DMABUF_EXPORT;
    // Device memory is never host-addressable through cuMemAlloc pointers on a discrete GPU.
    device->capabilities = caps;
    s.devices.push_back(std::move(device));
  }
  s.can_access_peer.assign(s.devices.size(), std::vector<bool>(s.devices.size(), false));
  for (size_t a = 0; a < s.devices.size(); ++a)
    for (size_t b = 0; b < s.devices.size(); ++b) {
      int can = 0;
      if (a != b &&
          d.cuDeviceCanAccessPeer(&can, s.devices[a]->handle, s.devices[b]->handle) == CUDA_SUCCESS)
        s.can_access_peer[a][b] = can != 0;
    }
}

hm_status shutdown() {
  return guarded("shutdown", [&] {
    State& s = state();
    for (auto& device : s.devices)
      if (device->retained.load()) s.driver.cuDevicePrimaryCtxRelease(device->handle);
    delete &s;  // libcuda stays loaded: the driver may have threads running
    hm::kit::gpu::state_pointer<State>() = nullptr;
  });
}

}  // namespace hm::cuda
