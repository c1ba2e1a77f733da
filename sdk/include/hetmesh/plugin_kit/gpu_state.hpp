// The state a GPU plugin shares with the kit's GPU layer (gpu_slots.hpp): its devices, the memory
// it allocated, registered or mapped, and the nonce that tells its IPC handles from another
// process's. A vendor plugin derives its DeviceState and State from these and adds its runtime.
#pragma once

#include "allocation_table.hpp"
#include "status.hpp"

#include <hetmesh/device_plugin.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace hm::kit::gpu {

struct Device {
  std::string name;
  std::string pci_bus_id;  // sysfs spelling: 0000:19:00.0
  int32_t numa_node = -1;
  uint64_t total_memory = 0;
  hm_capabilities capabilities = 0;
};

// What the plugin knows about an address range it allocated, registered or mapped.
struct Allocation {
  uint64_t size = 0;  // bytes as requested: what pointer_query reports
  int32_t kind = HM_MEM_UNKNOWN;
  int32_t device = -1;
  bool host = false;            // host RAM (pinned, registered, or a peer's pinned memory)
  uint64_t device_address = 0;  // the device's address of the start, where the runtime has one
  int fd = -1;                  // memfd behind pinned memory (the exporter's or our mapping's)
  uint64_t mapped = 0;          // bytes mmap()ed by the plugin (memfd-backed memory), else 0
  uint32_t ipc_opens = 1;       // an IPC mapping: the ipc_open calls the runtime answered with it
  bool adopted = false;  // registered host memory the runtime had pinned already: left pinned
};

// `D`: the plugin's DeviceState, derived from Device.
template <typename D>
struct State {
  using DeviceState = D;
  const hm_host_api* host = nullptr;
  std::string no_device_reason;
  uint64_t nonce = 0;  // tells this process's IPC handles from those of a process with our pid
  std::vector<std::unique_ptr<D>> devices;
  std::vector<std::vector<bool>> can_access_peer;  // [from][to]
  AllocationTable<Allocation> table;
  std::mutex ipc_mutex;  // one ipc_open or ipc_close at a time: they count a mapping's opens
};

// The plugin's one State `S`, made by initialize and deleted only by shutdown, never at exit:
// runtime callback threads and the host's threads may still call in while static destructors run.
template <typename S>
S*& state_pointer() {
  static S* pointer = nullptr;
  return pointer;
}

// The state; fails with HM_ERR_UNINITIALIZED until initialize() has succeeded.
template <typename S>
S& state() {
  S* s = state_pointer<S>();
  if (s == nullptr) fail(HM_ERR_UNINITIALIZED, "initialize() has not succeeded");
  return *s;
}

// Sends "<name>: <message>" to the host's log sink, if there is one.
template <typename S>
void log(const char* name, int32_t level, const std::string& message) {
  S* s = state_pointer<S>();
  const hm_host_api* host = s != nullptr ? s->host : nullptr;
  if (host != nullptr && host->log != nullptr)
    host->log(host->log_context, level, (std::string(name) + ": " + message).c_str());
}

// The device's state; HM_ERR_INVALID_ARGUMENT for an index that is not a device.
template <typename State>
auto& device_state(State& s, int32_t device) {
  if (device < 0 || device >= static_cast<int32_t>(s.devices.size()))
    fail(HM_ERR_INVALID_ARGUMENT, "device %d does not exist (%zu devices)", device,
         s.devices.size());
  return *s.devices[static_cast<size_t>(device)];
}

// Fails with HM_ERR_NOT_SUPPORTED unless `d` has every bit of `cap`.
inline void require(const Device& d, hm_capabilities cap, const char* what) {
  if ((d.capabilities & cap) != cap)
    fail(HM_ERR_NOT_SUPPORTED, "%s is not supported on %s", what, d.name.c_str());
}

}  // namespace hm::kit::gpu
