// The cuda plugin's shared state and the helpers every file uses (declared in cuda_state.hpp):
// state access, the driver-call check and primary contexts.
#include "cuda_state.hpp"

#include <mutex>
#include <string>

namespace hm::cuda {

// ---- state ----

const Driver& drv() {
  return state().driver;
}

void check(CUresult result, const char* call) {
  if (result != CUDA_SUCCESS)
    fail(hm::cuda::status_of(result), "%s failed: %s", call,
         hm::cuda::describe(drv(), result).c_str());
}

bool ready(CUresult result, const char* call) {
  if (result == CUDA_ERROR_NOT_READY) return false;
  check(result, call);
  return true;
}

DeviceState& device_state(int32_t device) {
  return hm::kit::gpu::device_state(state(), device);
}

// ---- contexts ----

CUcontext make_current(CUcontext context) {
  CUcontext previous = nullptr;
  HM_CU(cuCtxGetCurrent, &previous);
  if (previous != context) HM_CU(cuCtxSetCurrent, context);
  return previous;
}

namespace {

void enable_peer_access(int32_t from, int32_t to) {
  State& s = state();
  if (!s.can_access_peer[static_cast<size_t>(from)][static_cast<size_t>(to)]) return;
  HM_CU(cuCtxSetCurrent, s.devices[static_cast<size_t>(from)]->context);
  CUresult result = drv().cuCtxEnablePeerAccess(s.devices[static_cast<size_t>(to)]->context, 0);
  if (result != CUDA_SUCCESS && result != CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED)
    log(HM_LOG_WARN, "peer access " + std::to_string(from) + " -> " + std::to_string(to) +
                         " not enabled (copies between them go through the driver): " +
                         hm::cuda::describe(drv(), result));
}

}  // namespace

CUcontext context_of(int32_t device) {
  DeviceState& d = device_state(device);
  if (d.retained.load(std::memory_order_acquire)) return d.context;
  State& s = state();
  std::lock_guard lock(s.context_mutex);
  if (d.retained.load(std::memory_order_relaxed)) return d.context;
  HM_CU(cuDevicePrimaryCtxRetain, &d.context, d.handle);
  CUcontext previous = make_current(d.context);
  try {
    for (int32_t other = 0; other < static_cast<int32_t>(s.devices.size()); ++other) {
      if (other == device || !s.devices[static_cast<size_t>(other)]->retained) continue;
      enable_peer_access(device, other);
      enable_peer_access(other, device);
    }
  } catch (const hm::kit::Failure& failure) {
    log(HM_LOG_WARN, "enabling peer access: " + failure.message);
  }
  drv().cuCtxSetCurrent(previous);
  d.retained.store(true, std::memory_order_release);
  log(HM_LOG_DEBUG, "retained the primary context of device " + std::to_string(device));
  return d.context;
}

// ---- memory ----

CUdeviceptr host_device_address(void* base) {
  CUdeviceptr address = 0;
  HM_CU(cuMemHostGetDevicePointer, &address, base, 0);
  return address;
}

}  // namespace hm::cuda
