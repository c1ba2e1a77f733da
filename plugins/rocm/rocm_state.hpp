// The plugin's process-wide state and the helpers every slot uses: the loaded runtime, the device
// table, HIP error checks and the current-device scope.
#pragma once

#include "hip_runtime.hpp"
#include "hsa_dmabuf.hpp"

#include <hetmesh/device_plugin.h>
#include <hetmesh/plugin_kit/allocation_table.hpp>
#include <hetmesh/plugin_kit/status.hpp>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace hm::rocm {

class CyclicWaitRelay;

struct DeviceState {
  int32_t ordinal = 0;
  std::string name;
  std::string pci_bus_id;  // sysfs spelling: 0000:c1:00.0
  int32_t numa_node = -1;
  uint64_t total_memory = 0;
  hm_capabilities capabilities = 0;
  std::atomic<bool> activated{false};  // used at least once: peer access enabled with the others
};

// What the plugin knows about an address range it allocated, registered or mapped.
struct Allocation {
  uint64_t size = 0;  // bytes as requested: what pointer_query reports
  int32_t kind = HM_MEM_UNKNOWN;
  int32_t device = -1;
  bool host = false;    // host RAM (pinned, registered, or a peer's pinned memory)
  int fd = -1;          // memfd behind pinned memory (the exporter's or our mapping's)
  uint64_t mapped = 0;  // bytes mmap()ed by the plugin (memfd-backed memory), else 0
};

struct State {
  const hm_host_api* host = nullptr;
  Runtime hip;
  HsaDmabuf hsa;
  std::string dmabuf_unavailable;  // why HM_CAP_DMABUF_EXPORT is clear, "" when it is set
  std::string no_device_reason;
  uint64_t nonce = 0;  // tells this process's IPC handles from those of a process with our pid
  std::vector<std::unique_ptr<DeviceState>> devices;
  std::vector<std::vector<bool>> can_access_peer;  // [from][to]
  std::mutex activation_mutex;
  hm::kit::AllocationTable<Allocation> table;
  std::mutex relay_mutex;
  std::unique_ptr<CyclicWaitRelay> relay;  // started by the first HM_WAIT_GEQ

  State();
  ~State();
};

// The state after initialize() succeeded; fails with HM_ERR_UNINITIALIZED before.
State& state();
// The state pointer itself (nullptr before initialize and after shutdown), for destructors.
State* state_or_null();
void set_state(State* state);

inline const Runtime& hip() {
  return state().hip;
}

// Logs through the host's sink, prefixed "rocm: ".
void log(int32_t level, const std::string& message);

// Fails with the HIP call's name and the runtime's error text.
void check(hipError_t error, const char* call);

// Calls a runtime entry point and fails with its name and the runtime's error text.
#define HM_HIP(fn, ...) ::hm::rocm::check(::hm::rocm::hip().fn(__VA_ARGS__), #fn)

DeviceState& device_state(int32_t device);

// Fails with HM_ERR_NOT_SUPPORTED unless the device has every bit of `cap`.
void require(const DeviceState& device, hm_capabilities cap, const char* what);

// Makes `device` the calling thread's current HIP device for one slot and restores the caller's
// afterwards (frameworks on the same thread rely on theirs). The first use of a device enables
// peer access between it and every device already in use.
class DeviceScope {
 public:
  explicit DeviceScope(int32_t device);
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = -1;  // the caller's device when it differs from ours, else -1
};

}  // namespace hm::rocm
