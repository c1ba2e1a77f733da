// The lifecycle and device slots of the cuda plugin: initialize (driver load, device discovery and
// the capability bits that gate the optional slots in the other files), shutdown, device_count and
// device_properties.
#include "cuda_slots.hpp"
#include "cuda_state.hpp"

#include <hetmesh/plugin_kit/options.hpp>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <exception>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace hm::cuda {

// cuMemAlloc results are aligned to at least 256 bytes; pinned memory is page-aligned.
constexpr uint64_t kMemoryAlignment = 256;

// ---- slots: lifecycle and devices ----

namespace {

int32_t read_numa_node(const std::string& pci_bus_id) {
  if (pci_bus_id.empty()) return -1;
  std::ifstream file("/sys/bus/pci/devices/" + pci_bus_id + "/numa_node");
  int node = -1;
  if (!(file >> node) || node < 0) return -1;
  return node;
}

int attribute(const Driver& driver, CUdevice device, CUdevice_attribute which) {
  int value = 0;
  if (driver.cuDeviceGetAttribute(&value, which, device) != CUDA_SUCCESS) return 0;
  return value;
}

void discover_devices(State& s) {
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
    unsigned domain = 0, bus_number = 0, slot = 0, function = 0;
    if (d.cuDeviceGetPCIBusId(bus, sizeof bus - 1, device->handle) == CUDA_SUCCESS &&
        std::sscanf(bus, "%x:%x:%x.%x", &domain, &bus_number, &slot, &function) == 4) {
      char normalized[32];  // sysfs spelling: 0000:19:00.0
      std::snprintf(normalized, sizeof normalized, "%04x:%02x:%02x.%x", domain, bus_number, slot,
                    function);
      device->pci_bus_id = normalized;
    }
    device->numa_node = read_numa_node(device->pci_bus_id);

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

}  // namespace

// libcuda.so.1 is loaded here, not linked (cuda_driver.cc), so the plugin loads anywhere and,
// where no driver or GPU exists, initialize still succeeds and reports zero devices, with the
// reason in last_error.
hm_status initialize(const hm_host_api* host) {
  return guarded("initialize", [&] {
    hm::kit::require_struct(host, HM_HOST_API_SIZE_V1, "host");
    if (g_state) fail(HM_ERR_INVALID_ARGUMENT, "initialize() called twice");
    auto options = hm::kit::parse_options(host->options);
    hm::kit::reject_unknown(options, "none");
    auto s = std::make_unique<State>();
    s->host = host;
    s->nonce = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^
               (static_cast<uint64_t>(getpid()) << 40) ^ reinterpret_cast<uintptr_t>(s.get());
    try {
      s->nonce ^= static_cast<uint64_t>(std::random_device{}()) << 16;
    } catch (const std::exception&) {
      // the clock and the pid already tell processes apart
    }
    std::string reason = hm::cuda::load_driver(&s->driver);
    // From here on the driver's error texts are available to check() through g_state.
    g_state = s.release();
    if (!reason.empty()) {
      g_state->no_device_reason = reason;
    } else {
      try {
        discover_devices(*g_state);
      } catch (const hm::kit::Failure& failure) {
        g_state->devices.clear();
        g_state->can_access_peer.clear();
        g_state->no_device_reason = failure.message;
      }
    }
    State& st = *g_state;
    if (st.devices.empty()) {
      hm::kit::last_error_storage() = st.no_device_reason;
      log(HM_LOG_DEBUG, "no devices: " + st.no_device_reason);  // the loader logs it too
      return;
    }
    std::string summary = std::to_string(st.devices.size()) + " device(s), driver CUDA " +
                          std::to_string(st.driver_version / 1000) + "." +
                          std::to_string(st.driver_version % 1000 / 10);
    for (size_t i = 0; i < st.devices.size(); ++i)
      summary +=
          "; " + std::to_string(i) + ": " + st.devices[i]->name + " " + st.devices[i]->pci_bus_id;
    log(HM_LOG_DEBUG, summary);
  });
}

hm_status shutdown() {
  return guarded("shutdown", [&] {
    State& s = state();
    for (auto& device : s.devices)
      if (device->retained.load()) s.driver.cuDevicePrimaryCtxRelease(device->handle);
    delete g_state;  // libcuda stays loaded: the driver may have threads running
    g_state = nullptr;
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
    DeviceState& d = device_state(device);
    std::snprintf(props->name, sizeof props->name, "%s", d.name.c_str());
    std::snprintf(props->vendor, sizeof props->vendor, "NVIDIA");
    props->dlpack_device_type = HM_DLPACK_CUDA;
    std::snprintf(props->pci_bus_id, sizeof props->pci_bus_id, "%s", d.pci_bus_id.c_str());
    props->numa_node = d.numa_node;
    props->total_memory = d.total_memory;
    props->capabilities = d.capabilities;
    props->memory_alignment = kMemoryAlignment;
  });
}

}  // namespace hm::cuda
