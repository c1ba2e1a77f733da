// What every slot file of the cuda plugin shares: the plugin state, the driver-call check, device
// contexts, the stream and event handles, timed waits and address lookups. Internal to the plugin:
// built with hidden visibility, so nothing here is exported (only hm_device_plugin_v1 is).
#pragma once

#include "cuda_driver.hpp"

#include <hetmesh/device_plugin.h>
#include <hetmesh/plugin_kit/allocation_table.hpp>
#include <hetmesh/plugin_kit/status.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace hm::cuda {

using hm::kit::fail;
using hm::kit::guarded;

constexpr uint32_t kStreamMagic = 0x4d525453;  // "STRM"
constexpr uint32_t kEventMagic = 0x544e5645;   // "EVNT"

// ---- state ----

struct DeviceState {
  CUdevice handle = 0;
  std::string name;
  std::string pci_bus_id;
  int32_t numa_node = -1;
  uint64_t total_memory = 0;
  hm_capabilities capabilities = 0;
  bool memfd_pinned = false;  // pinned memory is registered memfd pages (else cuMemHostAlloc)
  bool flush_remote_writes = false;
  std::atomic<bool> retained{false};
  CUcontext context = nullptr;  // the primary context, once retained
};

// What the plugin knows about an address range it allocated, registered or mapped.
struct Allocation {
  uint64_t size = 0;  // bytes as requested: what pointer_query reports
  int32_t kind = HM_MEM_UNKNOWN;
  int32_t device = -1;
  bool host = false;               // host RAM (pinned, registered, or a peer's pinned memory)
  CUdeviceptr device_address = 0;  // the device's address of the range's start
  int fd = -1;                     // memfd behind pinned memory (the exporter's or our mapping's)
  uint64_t mapped = 0;             // bytes mmap()ed by the plugin (memfd-backed memory), else 0
};

struct State {
  const hm_host_api* host = nullptr;
  Driver driver;
  std::string no_device_reason;
  int driver_version = 0;
  uint64_t nonce = 0;  // tells this process's IPC handles from those of a process with our pid
  std::vector<std::unique_ptr<DeviceState>> devices;
  std::vector<std::vector<bool>> can_access_peer;  // [from][to]
  std::mutex context_mutex;
  hm::kit::AllocationTable<Allocation> table;
};
// Never destroyed at exit (only by shutdown()): driver callback threads and the host's threads may
// still call in while static destructors run.
extern State* g_state;

// The state; fails with HM_ERR_UNINITIALIZED until initialize() has succeeded.
State& state();
const Driver& drv();
// Sends "cuda: <message>" to the host's log sink, if there is one.
void log(int32_t level, const std::string& message);

// Errors. CUresult maps to hm_status in cuda_driver.cc; last_error reads
// "<slot>: <cuCall> failed: CUDA_ERROR_<NAME>: <cuGetErrorString text>".
void check(CUresult result, const char* call);

// Calls a driver entry point and fails with its name and the driver's error text.
#define HM_CU(fn, ...) check(drv().fn(__VA_ARGS__), #fn)

// The device's state; HM_ERR_INVALID_ARGUMENT for an index that is not a device.
DeviceState& device_state(int32_t device);
// Fails with HM_ERR_NOT_SUPPORTED unless `d` has every bit of `cap`.
void require(const DeviceState& d, hm_capabilities cap, const char* what);

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
    if (previous_ != nullptr) g_state->driver.cuCtxSetCurrent(previous_);
  }
  ContextScope(const ContextScope&) = delete;
  ContextScope& operator=(const ContextScope&) = delete;

 private:
  CUcontext previous_ = nullptr;
};

// ---- streams and events ----

struct Stream {
  uint32_t magic = kStreamMagic;
  int32_t device = 0;
  CUstream stream = nullptr;
};

struct Event {
  uint32_t magic = kEventMagic;
  int32_t device = 0;
  unsigned flags = 0;  // CU_EVENT_*
  bool timing = true;
  std::mutex mutex;  // guards creating events[d] for d != device
  // One CUevent per device it was recorded on (CUDA events belong to one context); events[device]
  // exists from event_create.
  std::vector<CUevent> events;
  std::atomic<int32_t> recorded_on{-1};  // device of the latest record, -1 if never recorded
};

// The handle's object; HM_ERR_INVALID_HANDLE for NULL or a handle this plugin did not make.
Stream& stream_of(hm_stream handle);
Event& event_of(hm_event handle);

// Sync with a timeout. CUDA has no timed stream or event wait: a finite timeout polls
// cuStreamQuery / cuEventQuery, yielding at first and then sleeping in doubling steps (up to
// 100 us, never past the deadline); an infinite one blocks in cuStreamSynchronize /
// cuEventSynchronize.
//
// Polls `query` (a CUresult-returning callable) until it stops answering CUDA_ERROR_NOT_READY or
// `timeout_ns` passes. Copies and kernels a comm thread waits for take microseconds, and a sleep
// costs at least the timer slack (50 us by default), so it spins (yielding) for kSpin first and
// only then sleeps, in doubling steps up to 100 us.
template <typename Query>
void poll_until_done(Query query, uint64_t timeout_ns, const char* call, const char* what) {
  using Clock = std::chrono::steady_clock;
  constexpr uint64_t kSpinNs = 200'000;
  const Clock::time_point start = Clock::now();
  uint64_t sleep_ns = 1000;
  for (;;) {
    CUresult result = query();
    if (result == CUDA_SUCCESS) return;
    if (result != CUDA_ERROR_NOT_READY) check(result, call);
    uint64_t elapsed = static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count());
    if (elapsed >= timeout_ns)
      fail(HM_ERR_TIMEOUT, "%s still pending after %llu ns", what,
           static_cast<unsigned long long>(timeout_ns));
    if (elapsed < kSpinNs) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(
          std::chrono::nanoseconds(std::min(sleep_ns, timeout_ns - elapsed)));
      sleep_ns = std::min<uint64_t>(sleep_ns * 2, 100'000);
    }
  }
}

// ---- memory ----
//
// Device memory is cuMemAlloc. Pinned host memory is memfd pages registered with
// cuMemHostRegister(PORTABLE | DEVICEMAP): page-locked like cuMemHostAlloc, and shareable, so
// ipc_export works for pinned memory as the ABI asks (another process maps /proc/<pid>/fd/<fd> and
// registers it). A table of what the plugin allocated, registered and mapped answers pointer_query
// with the exact requested sizes; any other pointer is asked of CUDA (cuPointerGetAttributes), so
// memory from another CUDA user in the process is recognised too.

// What an address is: the plugin's own table first, then CUDA itself (memory another CUDA user
// of this process allocated). Managed memory and unknown pointers are HM_MEM_UNKNOWN.
struct Memory {
  int32_t kind = HM_MEM_UNKNOWN;
  int32_t device = -1;
  uintptr_t base = 0;
  uint64_t size = 0;
  bool host = false;
  CUdeviceptr device_address = 0;  // device address of `base`; 0 if not known yet
};

Memory classify(const void* ptr);

// Device address of a host range known to CUDA (pinned or registered).
CUdeviceptr host_device_address(void* base);

// Registers [ptr, ptr+size) with every context (PORTABLE) and maps it for the devices (DEVICEMAP).
CUdeviceptr register_host_range(int32_t device, void* ptr, uint64_t size);

// Unregisters, unmaps and closes memfd-backed host memory (pinned, or a peer's mapped pinned).
void release_memfd_mapping(void* ptr, const Allocation& a);

}  // namespace hm::cuda
