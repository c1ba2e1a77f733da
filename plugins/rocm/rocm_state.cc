// The rocm plugin's shared helpers (declared in rocm_state.hpp): the HIP-call check, device
// lookup, and the current-device scope with peer access on a device's first use.
#include "rocm_state.hpp"

#include <hetmesh/plugin_kit/wait_relay.hpp>

namespace hm::rocm {
namespace {

void enable_peer_access(State& s, int32_t from, int32_t to) {
  if (!s.can_access_peer[static_cast<size_t>(from)][static_cast<size_t>(to)]) return;
  hipError_t error = s.hip.hipSetDevice(from);
  if (error == hipSuccess) error = s.hip.hipDeviceEnablePeerAccess(to, 0);
  if (error != hipSuccess && error != hipErrorPeerAccessAlreadyEnabled)
    log(HM_LOG_WARN,
        "peer access " + std::to_string(from) + " -> " + std::to_string(to) +
            " not enabled (copies between them are staged by HIP): " + describe(s.hip, error));
}

// First use of a device: peer access both ways with every device already in use.
void activate(int32_t device) {
  DeviceState& d = device_state(device);
  if (d.activated.load(std::memory_order_acquire)) return;
  State& s = state();
  std::lock_guard lock(s.activation_mutex);
  if (d.activated.load(std::memory_order_relaxed)) return;
  int previous = 0;
  HM_HIP(hipGetDevice, &previous);
  for (int32_t other = 0; other < static_cast<int32_t>(s.devices.size()); ++other) {
    if (other == device || !s.devices[static_cast<size_t>(other)]->activated) continue;
    enable_peer_access(s, device, other);
    enable_peer_access(s, other, device);
  }
  (void)s.hip.hipSetDevice(previous);  // best effort, as in ~DeviceScope
  d.activated.store(true, std::memory_order_release);
  log(HM_LOG_DEBUG, "activated device " + std::to_string(device));
}

}  // namespace

State::State() = default;
State::~State() = default;

void check(hipError_t error, const char* call) {
  if (error != hipSuccess)
    fail(status_of(error), "%s failed: %s", call, describe(hip(), error).c_str());
}

bool ready(hipError_t error, const char* call) {
  if (error == hipErrorNotReady) return false;
  check(error, call);
  return true;
}

DeviceState& device_state(int32_t device) {
  return hm::kit::gpu::device_state(state(), device);
}

DeviceScope::DeviceScope(int32_t device) {
  activate(device);
  int current = 0;
  HM_HIP(hipGetDevice, &current);
  if (current == device) return;
  HM_HIP(hipSetDevice, device);
  previous_ = current;
}

DeviceScope::~DeviceScope() {
  State* s = hm::kit::gpu::state_pointer<State>();
  if (previous_ >= 0 && s != nullptr) (void)s->hip.hipSetDevice(previous_);
}

}  // namespace hm::rocm
