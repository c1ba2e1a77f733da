#include "rocm_state.hpp"

#include "cyclic_wait.hpp"

namespace hm::rocm {
namespace {

// Never destroyed at exit (only by shutdown()): runtime callback threads and the host's threads
// may still call in while static destructors run.
State* g_state = nullptr;

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

State& state() {
  if (g_state == nullptr) hm::kit::fail(HM_ERR_UNINITIALIZED, "initialize() has not succeeded");
  return *g_state;
}

State* state_or_null() {
  return g_state;
}

void set_state(State* s) {
  g_state = s;
}

void log(int32_t level, const std::string& message) {
  const hm_host_api* host = g_state != nullptr ? g_state->host : nullptr;
  if (host != nullptr && host->log != nullptr)
    host->log(host->log_context, level, ("rocm: " + message).c_str());
}

void check(hipError_t error, const char* call) {
  if (error != hipSuccess)
    hm::kit::fail(status_of(error), "%s failed: %s", call, describe(hip(), error).c_str());
}

DeviceState& device_state(int32_t device) {
  State& s = state();
  if (device < 0 || device >= static_cast<int32_t>(s.devices.size()))
    hm::kit::fail(HM_ERR_INVALID_ARGUMENT, "device %d does not exist (%zu devices)", device,
                  s.devices.size());
  return *s.devices[static_cast<size_t>(device)];
}

void require(const DeviceState& device, hm_capabilities cap, const char* what) {
  if ((device.capabilities & cap) != cap)
    hm::kit::fail(HM_ERR_NOT_SUPPORTED, "%s is not supported on %s", what, device.name.c_str());
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
  if (previous_ >= 0 && g_state != nullptr) (void)g_state->hip.hipSetDevice(previous_);
}

}  // namespace hm::rocm
