// The lifecycle and device slots of a GPU plugin over the vendor calls of `V` (gpu_vendor.hpp lists
// them): initialize (load the runtime, find the devices), device_count and device_properties,
// with the sysfs helpers device discovery uses.
#pragma once

#include "gpu_state.hpp"
#include "options.hpp"
#include "status.hpp"

#include <hetmesh/device_plugin.h>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <exception>
#include <fstream>
#include <memory>
#include <random>
#include <string>

namespace hm::kit::gpu {

// cuMemAlloc and hipMalloc results are aligned to at least 256 bytes; pinned memory is
// page-aligned.
constexpr uint64_t kMemoryAlignment = 256;

// The sysfs spelling of a PCI bus id ("0000:19:00.0") from the runtime's, or "" if unreadable.
inline std::string sysfs_pci_bus_id(const char* bus) {
  unsigned domain = 0, bus_number = 0, slot = 0, function = 0;
  if (std::sscanf(bus, "%x:%x:%x.%x", &domain, &bus_number, &slot, &function) != 4) return {};
  char normalized[32];
  std::snprintf(normalized, sizeof normalized, "%04x:%02x:%02x.%x", domain, bus_number, slot,
                function);
  return normalized;
}

inline int32_t read_numa_node(const std::string& pci_bus_id) {
  if (pci_bus_id.empty()) return -1;
  std::ifstream file("/sys/bus/pci/devices/" + pci_bus_id + "/numa_node");
  int node = -1;
  if (!(file >> node) || node < 0) return -1;
  return node;
}

// Tells this process's IPC handles from those of an earlier process that had the same pid.
inline uint64_t make_nonce(const void* salt) {
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

// The runtime is loaded here (V::load), not linked, so the plugin loads anywhere and, where no
// driver or GPU exists, initialize still succeeds and reports zero devices, with the reason in
// last_error.
template <typename V>
hm_status initialize(const hm_host_api* host) {
  return guarded("initialize", [&] {
    require_struct(host, HM_HOST_API_SIZE_V1, "host");
    if (state_pointer<typename V::State>() != nullptr)
      fail(HM_ERR_INVALID_ARGUMENT, "initialize() called twice");
    auto options = parse_options(host->options);
    reject_unknown(options, "none");
    auto owned = std::make_unique<typename V::State>();
    owned->host = host;
    owned->nonce = make_nonce(owned.get());
    std::string reason = V::load(*owned);
    // From here on the runtime's error texts are available to the plugin's checks.
    state_pointer<typename V::State>() = owned.release();
    auto& s = V::state();
    if (!reason.empty()) {
      s.no_device_reason = reason;
    } else {
      try {
        V::discover(s);
      } catch (const Failure& failure) {
        s.devices.clear();
        s.can_access_peer.clear();
        s.no_device_reason = failure.message;
      }
    }
    if (s.devices.empty()) {
      set_last_error(s.no_device_reason.c_str());
      // The loader logs it too.
      log<typename V::State>(V::kInfo.name, HM_LOG_DEBUG, "no devices: " + s.no_device_reason);
      return;
    }
    std::string summary = std::to_string(s.devices.size()) + " device(s), " + V::runtime_text(s);
    for (size_t i = 0; i < s.devices.size(); ++i)
      summary +=
          "; " + std::to_string(i) + ": " + s.devices[i]->name + " " + s.devices[i]->pci_bus_id;
    log<typename V::State>(V::kInfo.name, HM_LOG_DEBUG, summary);
  });
}

template <typename V>
hm_status device_count(int32_t* count) {
  return guarded("device_count", [&] {
    if (count == nullptr) fail(HM_ERR_INVALID_ARGUMENT, "count is NULL");
    auto& s = V::state();
    *count = static_cast<int32_t>(s.devices.size());
    // The loader logs last_error as the reason when there are no devices.
    if (s.devices.empty()) set_last_error(s.no_device_reason.c_str());
  });
}

template <typename V>
hm_status device_properties(int32_t device, hm_device_properties* props) {
  return guarded("device_properties", [&] {
    require_struct(props, HM_DEVICE_PROPERTIES_SIZE_V1, "props");
    const auto& d = device_state(V::state(), device);
    std::snprintf(props->name, sizeof props->name, "%s", d.name.c_str());
    std::snprintf(props->vendor, sizeof props->vendor, "%s", V::kInfo.vendor);
    props->dlpack_device_type = V::kInfo.dlpack;
    std::snprintf(props->pci_bus_id, sizeof props->pci_bus_id, "%s", d.pci_bus_id.c_str());
    props->numa_node = d.numa_node;
    props->total_memory = d.total_memory;
    props->capabilities = d.capabilities;
    props->memory_alignment = kMemoryAlignment;
  });
}

}  // namespace hm::kit::gpu
