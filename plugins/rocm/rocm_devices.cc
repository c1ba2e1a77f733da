// Lifecycle and devices: loading HIP, finding the GPUs and what each can do.
#include "cyclic_wait.hpp"
#include "rocm_state.hpp"
#include "slots.hpp"

#include <hetmesh/plugin_kit/memfd.hpp>
#include <hetmesh/plugin_kit/options.hpp>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <random>

namespace hm::rocm {
namespace {

using hm::kit::fail;
using hm::kit::guarded;

// hipMalloc results are aligned to at least 256 bytes; pinned memory is page-aligned.
constexpr uint64_t kMemoryAlignment = 256;

// Why HIP sees no GPU, from the device node every ROCm process opens.
std::string kfd_hint() {
  if (access("/dev/kfd", F_OK) != 0)
    return "; /dev/kfd does not exist (the amdgpu kernel driver is not loaded, or the container "
           "was started without --device=/dev/kfd)";
  if (access("/dev/kfd", R_OK | W_OK) != 0)
    return "; /dev/kfd is not readable and writable by this user (add it to the render group)";
  return "";
}

int32_t read_numa_node(const std::string& pci_bus_id) {
  if (pci_bus_id.empty()) return -1;
  std::ifstream file("/sys/bus/pci/devices/" + pci_bus_id + "/numa_node");
  int node = -1;
  if (!(file >> node) || node < 0) return -1;
  return node;
}

int attribute(const Runtime& hip, int device, hipDeviceAttribute_t which) {
  int value = 0;
  if (hip.hipDeviceGetAttribute(&value, which, device) != hipSuccess) return 0;
  return value;
}

std::string pci_bus_id_of(const Runtime& hip, int device) {
  char bus[64] = {};
  unsigned domain = 0, bus_number = 0, slot = 0, function = 0;
  if (hip.hipDeviceGetPCIBusId(bus, sizeof bus - 1, device) != hipSuccess ||
      std::sscanf(bus, "%x:%x:%x.%x", &domain, &bus_number, &slot, &function) != 4)
    return {};
  char normalized[32];  // sysfs spelling: 0000:c1:00.0
  std::snprintf(normalized, sizeof normalized, "%04x:%02x:%02x.%x", domain, bus_number, slot,
                function);
  return normalized;
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

void discover_devices(State& s) {
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
    device->numa_node = read_numa_node(device->pci_bus_id);
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

uint64_t make_nonce(const void* salt) {
  uint64_t nonce =
      static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^
      (static_cast<uint64_t>(getpid()) << 40) ^ reinterpret_cast<uintptr_t>(salt);
  try {
    nonce ^= static_cast<uint64_t>(std::random_device{}()) << 16;
  } catch (const std::exception&) {
    // the clock and the pid already tell processes apart
  }
  return nonce;
}

}  // namespace

hm_status initialize(const hm_host_api* host) {
  return guarded("initialize", [&] {
    hm::kit::require_struct(host, HM_HOST_API_SIZE_V1, "host");
    if (state_or_null() != nullptr) fail(HM_ERR_INVALID_ARGUMENT, "initialize() called twice");
    auto options = hm::kit::parse_options(host->options);
    hm::kit::reject_unknown(options, "none");
    auto owned = std::make_unique<State>();
    owned->host = host;
    owned->nonce = make_nonce(owned.get());
    std::string reason = load_runtime(&owned->hip);
    // From here on the runtime's error texts are available to check() through the state.
    set_state(owned.release());
    State& s = state();
    if (!reason.empty()) {
      s.no_device_reason = reason;
    } else {
      try {
        discover_devices(s);
      } catch (const hm::kit::Failure& failure) {
        s.devices.clear();
        s.can_access_peer.clear();
        s.no_device_reason = failure.message;
      }
    }
    if (s.devices.empty()) {
      hm::kit::last_error_storage() = s.no_device_reason;
      log(HM_LOG_DEBUG, "no devices: " + s.no_device_reason);  // the loader logs it too
      return;
    }
    std::string summary =
        std::to_string(s.devices.size()) + " device(s), HIP " + version_text(s.hip.version);
    for (const auto& device : s.devices)
      summary +=
          "; " + std::to_string(device->ordinal) + ": " + device->name + " " + device->pci_bus_id;
    log(HM_LOG_DEBUG, summary);
  });
}

hm_status shutdown() {
  return guarded("shutdown", [&] {
    State& s = state();
    s.relay.reset();  // joins the watcher, frees the gate words
    delete &s;        // libamdhip64 stays loaded: the runtime may have threads running
    set_state(nullptr);
  });
}

hm_status device_count(int32_t* count) {
  return guarded("device_count", [&] {
    if (count == nullptr) fail(HM_ERR_INVALID_ARGUMENT, "count is NULL");
    State& s = state();
    *count = static_cast<int32_t>(s.devices.size());
    // The loader logs last_error as the reason when there are no devices.
    if (s.devices.empty()) hm::kit::last_error_storage() = s.no_device_reason;
  });
}

hm_status device_properties(int32_t device, hm_device_properties* props) {
  return guarded("device_properties", [&] {
    hm::kit::require_struct(props, HM_DEVICE_PROPERTIES_SIZE_V1, "props");
    const DeviceState& d = device_state(device);
    std::snprintf(props->name, sizeof props->name, "%s", d.name.c_str());
    std::snprintf(props->vendor, sizeof props->vendor, "AMD");
    props->dlpack_device_type = HM_DLPACK_ROCM;
    std::snprintf(props->pci_bus_id, sizeof props->pci_bus_id, "%s", d.pci_bus_id.c_str());
    props->numa_node = d.numa_node;
    props->total_memory = d.total_memory;
    props->capabilities = d.capabilities;
    props->memory_alignment = kMemoryAlignment;
  });
}

}  // namespace hm::rocm
