// What every file of the cuda plugin shares: the plugin state, the driver-call check, device
// contexts and the stream and event handles. Internal to the plugin: built with hidden visibility,
// so nothing here is exported (only hm_device_plugin_v1 is).
#pragma once

#include "cuda_loader.hpp"

#include <hetmesh/device_plugin.h>
#include <hetmesh/plugin_kit/gpu_address.hpp>
#include <hetmesh/plugin_kit/gpu_handles.hpp>
#include <hetmesh/plugin_kit/gpu_state.hpp>
#include <hetmesh/plugin_kit/status.hpp>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>

namespace hm::cuda {

using hm::kit::fail;
using hm::kit::guarded;
using hm::kit::gpu::Memory;

// ---- state ----

struct DeviceState : hm::kit::gpu::Device {
  CUdevice handle = 0;
  bool memfd_pinned = false;  // pinned memory is registered memfd pages (else cuMemHostAlloc)
  bool flush_remote_writes = false;
  std::atomic<bool> retained{false};
  CUcontext context = nullptr;  // the primary context, once retained
};

struct State : hm::kit::gpu::State<DeviceState> {
  Driver driver;
  int driver_version = 0;
  std::mutex context_mutex;
};

// The state; fails with HM_ERR_UNINITIALIZED until initialize() has succeeded.
inline State& state() {
  return hm::kit::gpu::state<State>();
}
const Driver& drv();
// Sends "cuda: <message>" to the host's log sink, if there is one.
inline void log(int32_t level, const std::string& message) {
  hm::kit::gpu::log<State>("cuda", level, message);
}

// Errors. CUresult maps to hm_status in cuda_loader.cc; last_error reads
// "<slot>: <cuCall> failed: CUDA_ERROR_<NAME>: <cuGetErrorString text>".
void check(CUresult result, const char* call);

// For queries: true on CUDA_SUCCESS, false on CUDA_ERROR_NOT_READY, else fails as check().
bool ready(CUresult result, const char* call);

// Calls a driver entry point and fails with its name and the driver's error text.
#define HM_CU(fn, ...) check(drv().fn(__VA_ARGS__), #fn)

// The device's state; HM_ERR_INVALID_ARGUMENT for an index that is not a device.
DeviceState& device_state(int32_t device);

// ---- contexts ----
//
// Each device uses its primary context (the one the CUDA runtime and the frameworks share),
// retained on first use. Every slot makes the device's context current on the calling thread (comm
// threads call in from anywhere) and restores the caller's own context afterwards if it had a
// different one. Peer access is enabled between every pair of retained devices that
// cuDeviceCanAccessPeer allows.

// Makes `context` current; returns the caller's previous one.
CUcontext make_current(CUcontext context);

// The device's primary context, retained on first use (with peer access to the other retained
// devices).
CUcontext context_of(int32_t device);

// Makes a device's context current for one slot. A thread that had another context current gets
// it back; one that had none keeps ours (cheaper for comm threads that call again).
class ContextScope {
 public:
  explicit ContextScope(int32_t device) {
    CUcontext context = context_of(device);
    CUcontext previous = make_current(context);
    if (previous != nullptr && previous != context) previous_ = previous;
  }
  ~ContextScope() {
    if (previous_ != nullptr)
      hm::kit::gpu::state_pointer<State>()->driver.cuCtxSetCurrent(previous_);
  }
  ContextScope(const ContextScope&) = delete;
  ContextScope& operator=(const ContextScope&) = delete;

 private:
  CUcontext previous_ = nullptr;
};

// ---- streams and events ----

// A CUDA event belongs to one context: an hm_event holds one CUevent per device it was recorded on.
using Stream = hm::kit::gpu::Stream<CUstream>;
using Event = hm::kit::gpu::Event<CUevent>;

// The handle's object; HM_ERR_INVALID_HANDLE for NULL or a handle this plugin did not make.
inline Stream& stream_of(hm_stream handle) {
  return hm::kit::gpu::stream_of<Stream>(handle);
}

// ---- memory ----
//
// Device memory is cuMemAlloc. Pinned host memory is memfd pages registered with
// cuMemHostRegister(PORTABLE | DEVICEMAP): page-locked like cuMemHostAlloc, and shareable, so
// ipc_export works for pinned memory as the ABI asks (another process maps /proc/<pid>/fd/<fd> and
// registers it). A table of what the plugin allocated, registered and mapped answers pointer_query
// with the exact requested sizes; any other pointer is asked of CUDA (cuPointerGetAttributes), so
// memory from another CUDA user in the process is recognised too.

// Device address of a host range known to CUDA (pinned or registered).
CUdeviceptr host_device_address(void* base);

}  // namespace hm::cuda
