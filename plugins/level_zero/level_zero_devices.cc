// The level_zero plugin's lifecycle calls for the kit's GPU layer (hetmesh/plugin_kit/
// gpu_devices.hpp has initialize, device_count and device_properties): loading Level Zero, one
// context per driver, finding the GPUs and what each can do; and the shutdown slot.
#include "level_zero_slots.hpp"
#include "level_zero_state.hpp"

#include <hetmesh/plugin_kit/gpu_devices.hpp>
#include <hetmesh/plugin_kit/wait_relay.hpp>

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace hm::level_zero {
namespace {

std::string version_text(uint32_t version) {
  return std::to_string(ZE_MAJOR_VERSION(version)) + "." +
         std::to_string(ZE_MINOR_VERSION(version));
}

std::vector<std::string> extensions_of(const Loader& z, ze_driver_handle_t driver) {
  uint32_t count = 0;
  if (z.zeDriverGetExtensionProperties(driver, &count, nullptr) != ZE_RESULT_SUCCESS) return {};
  std::vector<ze_driver_extension_properties_t> properties(count);
  if (z.zeDriverGetExtensionProperties(driver, &count, properties.data()) != ZE_RESULT_SUCCESS)
    return {};
  std::vector<std::string> names;
  for (uint32_t i = 0; i < count; ++i)
    names.emplace_back(properties[i].name, strnlen(properties[i].name, ZE_MAX_EXTENSION_NAME));
  return names;
}

bool listed(const std::vector<std::string>& extensions, const char* name) {
  for (const auto& e : extensions)
    if (e == name) return true;
  return false;
}

std::string pci_bus_id_of(const Loader& z, ze_device_handle_t device) {
  ze_pci_ext_properties_t pci{};
  pci.stype = ZE_STRUCTURE_TYPE_PCI_EXT_PROPERTIES;
  if (z.zeDevicePciGetPropertiesExt(device, &pci) != ZE_RESULT_SUCCESS) return {};
  char bus[32];
  std::snprintf(bus, sizeof bus, "%04x:%02x:%02x.%x", pci.address.domain, pci.address.bus,
                pci.address.device, pci.address.function);
  return bus;
}

uint64_t total_memory_of(const Loader& z, ze_device_handle_t device) {
  uint32_t count = 0;
  check(z.zeDeviceGetMemoryProperties(device, &count, nullptr), "zeDeviceGetMemoryProperties");
  std::vector<ze_device_memory_properties_t> properties(count);
  for (auto& p : properties)
    p.stype = ZE_STRUCTURE_TYPE_DEVICE_MEMORY_PROPERTIES;
  check(z.zeDeviceGetMemoryProperties(device, &count, properties.data()),
        "zeDeviceGetMemoryProperties");
  uint64_t total = 0;  // every local memory of the device (HBM, and the like)
  for (uint32_t i = 0; i < count; ++i)
    total += properties[i].totalSize;
  return total;
}

// The compute group (copies, fills, events, memops, barriers: everything a stream carries) and a
// copy-only group, if any.
void queue_groups_of(const Loader& z, DeviceState& d) {
  uint32_t count = 0;
  check(z.zeDeviceGetCommandQueueGroupProperties(d.handle, &count, nullptr),
        "zeDeviceGetCommandQueueGroupProperties");
  std::vector<ze_command_queue_group_properties_t> groups(count);
  for (auto& g : groups)
    g.stype = ZE_STRUCTURE_TYPE_COMMAND_QUEUE_GROUP_PROPERTIES;
  check(z.zeDeviceGetCommandQueueGroupProperties(d.handle, &count, groups.data()),
        "zeDeviceGetCommandQueueGroupProperties");
  int64_t compute = -1;
  for (uint32_t i = 0; i < count; ++i) {
    const bool is_compute = (groups[i].flags & ZE_COMMAND_QUEUE_GROUP_PROPERTY_FLAG_COMPUTE) != 0;
    const bool is_copy = (groups[i].flags & ZE_COMMAND_QUEUE_GROUP_PROPERTY_FLAG_COPY) != 0;
    if (is_compute && compute < 0) compute = i;
    if (is_copy && !is_compute && d.copy_ordinal < 0) d.copy_ordinal = i;
  }
  if (compute < 0)
    fail(HM_ERR_BACKEND, "%s has no compute queue group (%u groups)", d.name.c_str(), count);
  d.compute_ordinal = static_cast<uint32_t>(compute);
}

// Why zeInit failed, for last_error.
std::string no_driver_reason(ze_result_t result) {
  std::string reason = "no Level Zero driver: zeInit returned " + result_name(result);
  if (result == ZE_RESULT_ERROR_UNINITIALIZED)
    reason +=
        " (no GPU driver installed; the loader found no driver: install Intel's compute "
        "runtime, intel-level-zero-gpu, or name a driver in ZE_ENABLE_ALT_DRIVERS)";
  return reason;
}

// Whether the device's memory can be exported as a dma-buf: a page allocated exportable, and its
// fd asked for ("" if it works, else why not). Drivers without the external memory extension
// refuse the descriptor or answer no fd.
std::string probe_dmabuf(const Driver& driver, ze_device_handle_t device) {
  const Loader& z = state().ze;
  ze_external_memory_export_desc_t exportable = dmabuf_exportable();
  ze_device_mem_alloc_desc_t desc{};
  desc.stype = ZE_STRUCTURE_TYPE_DEVICE_MEM_ALLOC_DESC;
  desc.pNext = &exportable;
  void* page = nullptr;
  const size_t size = hm::kit::page_size();
  ze_result_t result = z.zeMemAllocDevice(driver.context, &desc, size, size, device, &page);
  if (result != ZE_RESULT_SUCCESS)
    return "zeMemAllocDevice of exportable memory returned " + result_name(result);
  std::string why;
  try {
    driver_dmabuf_fd(driver, page);
  } catch (const hm::kit::Failure& f) {
    why = f.message;
  }
  z.zeMemFree(driver.context, page);
  return why;
}

}  // namespace

std::string Vendor::load(State& s) {
  return load_loader(&s.ze);
}

void Vendor::discover(State& s) {
  const Loader& z = s.ze;
  ze_result_t result = z.zeInit(ZE_INIT_FLAG_GPU_ONLY);
  if (result != ZE_RESULT_SUCCESS) {
    s.no_device_reason = no_driver_reason(result);
    return;
  }
  uint32_t driver_count = 0;
  result = z.zeDriverGet(&driver_count, nullptr);
  if (result != ZE_RESULT_SUCCESS || driver_count == 0) {
    s.no_device_reason = result != ZE_RESULT_SUCCESS
                             ? "no Level Zero driver: zeDriverGet failed: " + result_name(result)
                             : std::string("no Level Zero driver: zeDriverGet reports 0 drivers");
    return;
  }
  std::vector<ze_driver_handle_t> handles(driver_count);
  check(z.zeDriverGet(&driver_count, handles.data()), "zeDriverGet");
  for (ze_driver_handle_t handle : handles) {
    auto driver = std::make_unique<Driver>();
    driver->handle = handle;
    ze_api_version_t api{};
    check(z.zeDriverGetApiVersion(handle, &api), "zeDriverGetApiVersion");
    ze_driver_properties_t properties{};
    properties.stype = ZE_STRUCTURE_TYPE_DRIVER_PROPERTIES;
    check(z.zeDriverGetProperties(handle, &properties), "zeDriverGetProperties");
    if (s.api_version.empty()) {
      s.api_version = version_text(api);
      s.driver_version = std::to_string(properties.driverVersion);
    }
    const auto extensions = extensions_of(z, handle);
    const bool pci = listed(extensions, ZE_PCI_PROPERTIES_EXT_NAME);

    uint32_t device_count = 0;
    check(z.zeDeviceGet(handle, &device_count, nullptr), "zeDeviceGet");
    std::vector<ze_device_handle_t> devices(device_count);
    check(z.zeDeviceGet(handle, &device_count, devices.data()), "zeDeviceGet");
    std::vector<std::unique_ptr<DeviceState>> gpus;
    for (ze_device_handle_t device : devices) {
      ze_device_properties_t p{};
      p.stype = ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES;  // 1.0 meaning: timerResolution in ns
      check(z.zeDeviceGetProperties(device, &p), "zeDeviceGetProperties");
      if (p.type != ZE_DEVICE_TYPE_GPU) continue;
      auto d = std::make_unique<DeviceState>();
      d->driver = driver.get();
      d->handle = device;
      d->name = std::string(p.name, strnlen(p.name, ZE_MAX_DEVICE_NAME));
      if (d->name.empty()) d->name = "Level Zero GPU";
      d->timer_resolution_ns = p.timerResolution > 0 ? static_cast<double>(p.timerResolution) : 1.0;
      d->timestamp_valid_bits = p.timestampValidBits > 0 ? p.timestampValidBits : 64;
      d->total_memory = total_memory_of(z, device);
      if (pci) d->pci_bus_id = pci_bus_id_of(z, device);
      d->numa_node = hm::kit::gpu::read_numa_node(d->pci_bus_id);
      queue_groups_of(z, *d);
      gpus.push_back(std::move(d));
    }
    if (gpus.empty()) continue;  // a driver without GPUs: no context

    ze_context_desc_t context_desc{};
    context_desc.stype = ZE_STRUCTURE_TYPE_CONTEXT_DESC;
    check(z.zeContextCreate(handle, &context_desc, &driver->context), "zeContextCreate");
    driver->events = std::make_unique<EventPool>(*driver);
    driver->no_memory_sync = load_memory_sync(z, handle, &driver->sync);
    if (!driver->no_memory_sync.empty())
      log(HM_LOG_INFO, "no stream memory operations: " + driver->no_memory_sync);

    for (auto& d : gpus) {
      // Pinned memory is zeMemAllocHost: no host registration in core Level Zero, no memfd.
      // Device memory is not host-addressable (discrete GPUs; the stand-in maps it PROT_NONE).
      hm_capabilities caps = HM_CAP_DEVICE_MEMORY | HM_CAP_PINNED_HOST_MEMORY | HM_CAP_IPC |
                             HM_CAP_HOST_CALLBACK | HM_CAP_EVENT_TIMING;
      if (driver->no_memory_sync.empty()) caps |= HM_CAP_STREAM_MEMOPS;
      d->no_dmabuf = probe_dmabuf(*driver, d->handle);
      if (d->no_dmabuf.empty())
        caps |= HM_CAP_DMABUF_EXPORT;
      else
        log(HM_LOG_INFO, d->name + ": no dma-buf export: " + d->no_dmabuf);
      d->capabilities = caps;
      log(HM_LOG_DEBUG,
          d->name + ": compute queue group " + std::to_string(d->compute_ordinal) +
              (d->copy_ordinal >= 0
                   ? ", copy-only group " + std::to_string(d->copy_ordinal) +
                         " (streams stay on the compute group: they carry memops and events too; "
                         "the wait relay reads device words on the copy group)"
                   : ", no copy-only group"));
      s.devices.push_back(std::move(d));
    }
    s.drivers.push_back(std::move(driver));
  }
  if (s.devices.empty()) {
    s.no_device_reason =
        "no Level Zero GPU: " + std::to_string(driver_count) + " driver(s), none with a GPU device";
    return;
  }
  const size_t n = s.devices.size();
  s.can_access_peer.assign(n, std::vector<bool>(n, false));
  bool all_peers = true;
  for (size_t a = 0; a < n; ++a)
    for (size_t b = 0; b < n; ++b) {
      if (a == b) continue;
      // Devices of different drivers share no context: no copies between them.
      ze_bool_t can = 0;
      if (s.devices[a]->driver == s.devices[b]->driver &&
          z.zeDeviceCanAccessPeer(s.devices[a]->handle, s.devices[b]->handle, &can) ==
              ZE_RESULT_SUCCESS)
        s.can_access_peer[a][b] = can != 0;
      all_peers = all_peers && s.can_access_peer[a][b];
    }
  if (all_peers)
    for (auto& d : s.devices)
      d->capabilities |= HM_CAP_PEER_COPY;
}

std::string Vendor::runtime_text(const State& s) {
  return "Level Zero " + s.api_version + " (driver version " + s.driver_version + ", " +
         std::to_string(s.drivers.size()) + " driver(s))";
}

hm_status shutdown() {
  return guarded("shutdown", [&] {
    State& s = state();
    {
      std::lock_guard lock(s.service_mutex);
      s.service.reset();  // joins the service thread
    }
    s.drivers.clear();  // relays, events, contexts
    delete &s;          // the loader stays loaded: drivers may have threads running
    hm::kit::gpu::state_pointer<State>() = nullptr;
  });
}

}  // namespace hm::level_zero
