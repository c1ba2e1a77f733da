// The rocm plugin's lifecycle calls for the kit's GPU layer (hetmesh/plugin_kit/gpu_devices.hpp
// has initialize, device_count and device_properties): loading HIP, finding the GPUs and what each
// can do; and the shutdown slot.
#include "rocm_slots.hpp"
#include "rocm_state.hpp"

#include <hetmesh/plugin_kit/gpu_devices.hpp>
#include <hetmesh/plugin_kit/memfd.hpp>
#include <hetmesh/plugin_kit/wait_relay.hpp>

#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

namespace hm::rocm {
namespace {

// Why HIP sees no GPU, from the device node every ROCm process opens.
std::string kfd_hint() {
  if (access("/dev/kfd", F_OK) != 0)
    return "; /dev/kfd does not exist (the amdgpu kernel driver is not loaded, or the container "
           "was started without --device=/dev/kfd)";
  if (access("/dev/kfd", R_OK | W_OK) != 0)
    return "; /dev/kfd is not readable and writable by this user (add it to the render group)";
  return "";
}

int attribute(const Runtime& hip, int device, hipDeviceAttribute_t which) {
  int value = 0;
  if (hip.hipDeviceGetAttribute(&value, which, device) != hipSuccess) return 0;
  return value;
}

std::string pci_bus_id_of(const Runtime& hip, int device) {
  char bus[64] = {};
  if (hip.hipDeviceGetPCIBusId(bus, sizeof bus - 1, device) != hipSuccess) return {};
  return hm::kit::gpu::sysfs_pci_bus_id(bus);
}

// Whether hsa_amd_portable_export_dmabuf works for this device's memory: the kernel needs
// CONFIG_DMABUF_MOVE_NOTIFY and CONFIG_PCI_P2PDMA, which only an export attempt reveals.
// Returns "" when it does, else why not.
std::string probe_dmabuf(State& s, int device) {
  if (s.hsa.export_dmabuf == nullptr) return s.dmabuf_unavailable;
  const uint64_t size = hm::kit::page_size();
  void* memory = nullptr;
  hipError_t error = s.hip.hipSetDevice(device);
  if (error == hipSuccess) error = s.hip.hipMalloc(&memory, size);
  if (error != hipSuccess)
    return "hipMalloc for the dma-buf probe failed: " + describe(s.hip, error);
  int fd = -1;
  uint64_t offset = 0;
  hsa_status_t status = s.hsa.export_dmabuf(memory, size, &fd, &offset);
  if (status == HSA_STATUS_SUCCESS) s.hsa.close_dmabuf(fd);
  (void)s.hip.hipFree(memory);
  if (status != HSA_STATUS_SUCCESS)
    return "hsa_amd_portable_export_dmabuf failed: " + describe(s.hsa, status);
  return {};
}

}  // namespace

void Vendor::discover(State& s) {
  const Runtime& hip = s.hip;
  int count = 0;
  hipError_t error = hip.hipGetDeviceCount(&count);
  if (error != hipSuccess) {
    s.no_device_reason =
        "no ROCm device: hipGetDeviceCount failed with " + describe(hip, error) + kfd_hint();
    return;
  }
  if (count == 0) {
    s.no_device_reason = "no ROCm device: hipGetDeviceCount reports 0" + kfd_hint();
    return;
  }
  s.dmabuf_unavailable = load_hsa_dmabuf(&s.hsa);
  for (int i = 0; i < count; ++i) {
    auto device = std::make_unique<DeviceState>();
    device->ordinal = i;
    char name[128] = {};
    check(hip.hipDeviceGetName(name, sizeof name - 1, i), "hipDeviceGetName");
    device->name = name;
    size_t total = 0;
    check(hip.hipDeviceTotalMem(&total, i), "hipDeviceTotalMem");
    device->total_memory = total;
    device->pci_bus_id = pci_bus_id_of(hip, i);
    device->numa_node = hm::kit::gpu::read_numa_node(device->pci_bus_id);
    // Pinned memory is registered memfd pages, so host_register and IPC come with it (HIP on
    // Linux always has unified addressing and host registration).
    hm_capabilities caps = HM_CAP_DEVICE_MEMORY | HM_CAP_PINNED_HOST_MEMORY | HM_CAP_HOST_REGISTER |
                           HM_CAP_IPC | HM_CAP_HOST_CALLBACK | HM_CAP_EVENT_TIMING;
    if (attribute(hip, i, hipDeviceAttributeCanUseStreamWaitValue)) caps |= HM_CAP_STREAM_MEMOPS;
    // Device memory is never host-addressable through hipMalloc pointers on a discrete GPU.
    device->capabilities = caps;
    s.devices.push_back(std::move(device));
  }
  const size_t n = s.devices.size();
  s.can_access_peer.assign(n, std::vector<bool>(n, false));
  bool all_peers = true;
  for (size_t a = 0; a < n; ++a)
    for (size_t b = 0; b < n; ++b) {
      if (a == b) continue;
      int can = 0;
      if (hip.hipDeviceCanAccessPeer(&can, static_cast<int>(a), static_cast<int>(b)) == hipSuccess)
        s.can_access_peer[a][b] = can != 0;
      all_peers = all_peers && s.can_access_peer[a][b];
    }
  int previous = 0;  // the probes switch devices: give the calling thread its own back
  (void)hip.hipGetDevice(&previous);
  for (auto& device : s.devices) {
    // Without peer access HIP stages device-to-device copies through host memory.
    if (all_peers) device->capabilities |= HM_CAP_PEER_COPY;
    std::string dmabuf = probe_dmabuf(s, device->ordinal);
    if (dmabuf.empty())
      device->capabilities |= HM_CAP_DMABUF_EXPORT;
    else
      log(HM_LOG_INFO,
          "device " + std::to_string(device->ordinal) + ": no dma-buf export: " + dmabuf);
  }
  (void)hip.hipSetDevice(previous);
}

std::string Vendor::load(State& s) {
  return load_runtime(&s.hip);
}

std::string Vendor::runtime_text(const State& s) {
  return "HIP " + version_text(s.hip.version);
}

hm_status shutdown() {
  return guarded("shutdown", [&] {
    State& s = state();
    s.relay.reset();  // joins the watcher, frees the gate words
    delete &s;        // libamdhip64 stays loaded: the runtime may have threads running
    hm::kit::gpu::state_pointer<State>() = nullptr;
  });
}

}  // namespace hm::rocm
