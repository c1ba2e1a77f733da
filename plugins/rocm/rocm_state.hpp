// The plugin's process-wide state and the helpers every slot uses: the loaded runtime, the device
// table, HIP error checks, the current-device scope and the stream and event handles.
#pragma once

#include "rocm_hsa_loader.hpp"
#include "rocm_loader.hpp"

#include <hetmesh/device_plugin.h>
#include <hetmesh/plugin_kit/gpu_address.hpp>
#include <hetmesh/plugin_kit/gpu_handles.hpp>
#include <hetmesh/plugin_kit/gpu_state.hpp>
#include <hetmesh/plugin_kit/status.hpp>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

namespace hm::kit::gpu {
class WaitRelay;  // hetmesh/plugin_kit/wait_relay.hpp
}  // namespace hm::kit::gpu

namespace hm::rocm {

using hm::kit::fail;
using hm::kit::guarded;
using hm::kit::gpu::Memory;

struct DeviceState : hm::kit::gpu::Device {
  int32_t ordinal = 0;
  std::atomic<bool> activated{false};  // used at least once: peer access enabled with the others
};

struct State : hm::kit::gpu::State<DeviceState> {
  Runtime hip;
  HsaDmabuf hsa;
  std::string dmabuf_unavailable;  // why HM_CAP_DMABUF_EXPORT is clear, "" when it is set
  std::mutex activation_mutex;
  std::mutex relay_mutex;
  std::unique_ptr<hm::kit::gpu::WaitRelay> relay;  // started by the first HM_WAIT_GEQ

  State();
  ~State();
};

// The state after initialize() succeeded; fails with HM_ERR_UNINITIALIZED before.
inline State& state() {
  return hm::kit::gpu::state<State>();
}

inline const Runtime& hip() {
  return state().hip;
}

// Logs through the host's sink, prefixed "rocm: ".
inline void log(int32_t level, const std::string& message) {
  hm::kit::gpu::log<State>("rocm", level, message);
}

// Fails with the HIP call's name and the runtime's error text.
void check(hipError_t error, const char* call);

// For queries: true on hipSuccess, false on hipErrorNotReady, else fails as check().
bool ready(hipError_t error, const char* call);

// Calls a runtime entry point and fails with its name and the runtime's error text.
#define HM_HIP(fn, ...) ::hm::rocm::check(::hm::rocm::hip().fn(__VA_ARGS__), #fn)

// The device's state; HM_ERR_INVALID_ARGUMENT for an index that is not a device.
DeviceState& device_state(int32_t device);

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

// ---- streams and events ----

struct Stream : hm::kit::gpu::Stream<hipStream_t> {
  uint64_t* gate = nullptr;  // the HM_WAIT_GEQ relay's gate word, on the first such wait
};

// A HIP event records only on streams of its own device: an hm_event holds one hipEvent_t per
// device it was recorded on.
using Event = hm::kit::gpu::Event<hipEvent_t>;

inline Stream& stream_of(hm_stream handle) {
  return hm::kit::gpu::stream_of<Stream>(handle);
}

}  // namespace hm::rocm
