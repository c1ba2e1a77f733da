// cuda: NVIDIA GPUs through the CUDA driver API. Host code only, built with the host compiler
// against the CUDA headers; libcuda.so.1 is loaded at initialize() (cuda_driver.cc), so the plugin
// loads anywhere and reports zero devices, with the reason in last_error, where no driver or GPU
// exists.
//
// Design notes (docs: plugins/cuda/README.md):
// - Contexts. Each device uses its primary context (the one the CUDA runtime and the frameworks
//   share), retained on first use. Every slot makes the device's context current on the calling
//   thread (comm threads call in from anywhere) and restores the caller's own context afterwards
//   if it had a different one. Peer access is enabled between every pair of retained devices that
//   cuDeviceCanAccessPeer allows.
// - Memory. Device memory is cuMemAlloc. Pinned host memory is memfd pages registered with
//   cuMemHostRegister(PORTABLE | DEVICEMAP): page-locked like cuMemHostAlloc, and shareable, so
//   ipc_export works for pinned memory as the ABI asks (another process maps /proc/<pid>/fd/<fd>
//   and registers it). A table of what the plugin allocated, registered and mapped answers
//   pointer_query with the exact requested sizes; any other pointer is asked of CUDA
//   (cuPointerGetAttributes), so memory from another CUDA user in the process is recognised too.
// - Sync with a timeout. CUDA has no timed stream or event wait: a finite timeout polls
//   cuStreamQuery / cuEventQuery, yielding at first and then sleeping in doubling steps (up to
//   100 us, never past the deadline); an infinite one blocks in cuStreamSynchronize /
//   cuEventSynchronize.
// - Errors. CUresult maps to hm_status in cuda_driver.cc; last_error reads
//   "<slot>: <cuCall> failed: CUDA_ERROR_<NAME>: <cuGetErrorString text>".
#include "cuda_driver.hpp"

#include <hetmesh/cuda.h>
#include <hetmesh/device_plugin.h>
#include <hetmesh/plugin_kit/allocation_table.hpp>
#include <hetmesh/plugin_kit/memfd.hpp>
#include <hetmesh/plugin_kit/options.hpp>
#include <hetmesh/plugin_kit/status.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

using hm::cuda::Driver;
using hm::kit::fail;
using hm::kit::guarded;

constexpr uint32_t kStreamMagic = 0x4d525453;  // "STRM"
constexpr uint32_t kEventMagic = 0x544e5645;   // "EVNT"
constexpr uint32_t kIpcMagic = 0x41445543;     // "CUDA"
constexpr uint16_t kIpcVersion = 1;
// cuMemAlloc results are aligned to at least 256 bytes; pinned memory is page-aligned.
constexpr uint64_t kMemoryAlignment = 256;

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
State* g_state = nullptr;

State& state() {
  if (!g_state) fail(HM_ERR_UNINITIALIZED, "initialize() has not succeeded");
  return *g_state;
}

const Driver& drv() {
  return state().driver;
}

void log(int32_t level, const std::string& message) {
  const hm_host_api* host = g_state ? g_state->host : nullptr;
  if (host != nullptr && host->log != nullptr)
    host->log(host->log_context, level, ("cuda: " + message).c_str());
}

void check(CUresult result, const char* call) {
  if (result != CUDA_SUCCESS)
    fail(hm::cuda::status_of(result), "%s failed: %s", call,
         hm::cuda::describe(drv(), result).c_str());
}

// Calls a driver entry point and fails with its name and the driver's error text.
#define HM_CU(fn, ...) check(drv().fn(__VA_ARGS__), #fn)

DeviceState& device_state(int32_t device) {
  State& s = state();
  if (device < 0 || device >= static_cast<int32_t>(s.devices.size()))
    fail(HM_ERR_INVALID_ARGUMENT, "device %d does not exist (%zu devices)", device,
         s.devices.size());
  return *s.devices[static_cast<size_t>(device)];
}

// ---- contexts ----

// Makes `context` current; returns the caller's previous one.
CUcontext make_current(CUcontext context) {
  CUcontext previous = nullptr;
  HM_CU(cuCtxGetCurrent, &previous);
  if (previous != context) HM_CU(cuCtxSetCurrent, context);
  return previous;
}

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

// The device's primary context, retained on first use (with peer access to the other retained
// devices).
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

Stream& stream_of(hm_stream handle) {
  if (handle == nullptr) fail(HM_ERR_INVALID_HANDLE, "stream is NULL");
  auto* stream = reinterpret_cast<Stream*>(handle);
  if (stream->magic != kStreamMagic)
    fail(HM_ERR_INVALID_HANDLE, "%p is not a stream of this plugin", static_cast<void*>(handle));
  return *stream;
}

Event& event_of(hm_event handle) {
  if (handle == nullptr) fail(HM_ERR_INVALID_HANDLE, "event is NULL");
  auto* event = reinterpret_cast<Event*>(handle);
  if (event->magic != kEventMagic)
    fail(HM_ERR_INVALID_HANDLE, "%p is not an event of this plugin", static_cast<void*>(handle));
  return *event;
}

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

Memory classify(const void* ptr) {
  State& s = state();
  Memory m;
  if (ptr == nullptr || s.devices.empty()) return m;
  if (auto hit = s.table.find(ptr)) {
    m.kind = hit->allocation.kind;
    m.device = hit->allocation.device;
    m.base = hit->base;
    m.size = hit->allocation.size;
    m.host = hit->allocation.host;
    m.device_address = hit->allocation.device_address;
    return m;
  }
  // Ask CUDA in the context of a device we already use, or the caller's own.
  std::unique_ptr<ContextScope> scope;
  for (int32_t d = 0; d < static_cast<int32_t>(s.devices.size()); ++d)
    if (s.devices[static_cast<size_t>(d)]->retained.load(std::memory_order_acquire)) {
      scope = std::make_unique<ContextScope>(d);
      break;
    }
  CUpointer_attribute attributes[] = {
      CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
      CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, CU_POINTER_ATTRIBUTE_RANGE_SIZE,
      CU_POINTER_ATTRIBUTE_IS_MANAGED};
  constexpr unsigned kCount = sizeof attributes / sizeof attributes[0];
  // Each value fits 8 zeroed bytes, read back in its own type (all little-endian integers).
  uint64_t values[kCount] = {};
  void* data[kCount];
  for (unsigned i = 0; i < kCount; ++i)
    data[i] = &values[i];
  if (s.driver.cuPointerGetAttributes(kCount, attributes, data,
                                      reinterpret_cast<CUdeviceptr>(ptr)) != CUDA_SUCCESS)
    return m;
  unsigned type;
  int ordinal;
  std::memcpy(&type, &values[0], sizeof type);
  std::memcpy(&ordinal, &values[1], sizeof ordinal);
  uint64_t range_start = values[2], range_size = values[3];
  bool managed = (values[4] & 0xff) != 0;
  if (managed || range_size == 0) return m;
  if (type == CU_MEMORYTYPE_DEVICE && ordinal >= 0 &&
      ordinal < static_cast<int>(s.devices.size())) {
    m.kind = HM_MEM_DEVICE;
    m.device = ordinal;
    m.device_address = static_cast<CUdeviceptr>(range_start);
  } else if (type == CU_MEMORYTYPE_HOST) {
    m.kind = HM_MEM_PINNED_HOST;
    m.device = ordinal >= 0 && ordinal < static_cast<int>(s.devices.size()) ? ordinal : 0;
    m.host = true;
  } else {
    return m;
  }
  m.base = static_cast<uintptr_t>(range_start);
  m.size = range_size;
  return m;
}

// Device address of a host range known to CUDA (pinned or registered).
CUdeviceptr host_device_address(void* base) {
  CUdeviceptr address = 0;
  HM_CU(cuMemHostGetDevicePointer, &address, base, 0);
  return address;
}

// Registers [ptr, ptr+size) with every context (PORTABLE) and maps it for the devices (DEVICEMAP).
CUdeviceptr register_host_range(int32_t device, void* ptr, uint64_t size) {
  ContextScope scope(device);
  HM_CU(cuMemHostRegister, ptr, size, CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP);
  try {
    return host_device_address(ptr);
  } catch (...) {
    drv().cuMemHostUnregister(ptr);
    throw;
  }
}

// Page-locked, shareable host memory: a memfd mapping registered with CUDA.
void* alloc_memfd_pinned(int32_t device, uint64_t size, Allocation* out) {
  uint64_t mapped = hm::kit::round_up(size, hm::kit::page_size());
  int fd = hm::kit::create_memfd("hetmesh-cuda-pinned", size);
  void* ptr = nullptr;
  try {
    ptr = hm::kit::map_memfd(fd, size, PROT_READ | PROT_WRITE);
    out->device_address = register_host_range(device, ptr, mapped);
  } catch (...) {
    hm::kit::unmap(ptr, size);
    close(fd);
    throw;
  }
  out->fd = fd;
  out->mapped = mapped;
  return ptr;
}

void release_memfd_mapping(void* ptr, const Allocation& a) {
  CUresult result = drv().cuMemHostUnregister(ptr);
  munmap(ptr, a.mapped);
  close(a.fd);
  check(result, "cuMemHostUnregister");
}

// ---- slots: lifecycle and devices ----

int32_t read_numa_node(const std::string& pci_bus_id) {
  if (pci_bus_id.empty()) return -1;
  std::ifstream file("/sys/bus/pci/devices/" + pci_bus_id + "/numa_node");
  int node = -1;
  if (!(file >> node) || node < 0) return -1;
  return node;
}

int attribute(const Driver& driver, CUdevice device, CUdevice_attribute which) {
  int value = 0;
  if (driver.cuDeviceGetAttribute(&value, which, device) != CUDA_SUCCESS) return 0;
  return value;
}

void discover_devices(State& s) {
  const Driver& d = s.driver;
  CUresult result = d.cuInit(0);
  if (result != CUDA_SUCCESS) {
    s.no_device_reason = "cuInit failed: " + hm::cuda::describe(d, result);
    return;
  }
  d.cuDriverGetVersion(&s.driver_version);
  int count = 0;
  result = d.cuDeviceGetCount(&count);
  if (result != CUDA_SUCCESS) {
    s.no_device_reason = "cuDeviceGetCount failed: " + hm::cuda::describe(d, result);
    return;
  }
  if (count == 0) {
    s.no_device_reason = "the NVIDIA driver reports no CUDA device (cuDeviceGetCount = 0)";
    return;
  }
  for (int i = 0; i < count; ++i) {
    auto device = std::make_unique<DeviceState>();
    check(d.cuDeviceGet(&device->handle, i), "cuDeviceGet");
    char name[128] = {};
    check(d.cuDeviceGetName(name, sizeof name - 1, device->handle), "cuDeviceGetName");
    device->name = name;
    size_t total = 0;
    check(d.cuDeviceTotalMem(&total, device->handle), "cuDeviceTotalMem");
    device->total_memory = total;
    char bus[64] = {};
    unsigned domain = 0, bus_number = 0, slot = 0, function = 0;
    if (d.cuDeviceGetPCIBusId(bus, sizeof bus - 1, device->handle) == CUDA_SUCCESS &&
        std::sscanf(bus, "%x:%x:%x.%x", &domain, &bus_number, &slot, &function) == 4) {
      char normalized[32];  // sysfs spelling: 0000:19:00.0
      std::snprintf(normalized, sizeof normalized, "%04x:%02x:%02x.%x", domain, bus_number, slot,
                    function);
      device->pci_bus_id = normalized;
    }
    device->numa_node = read_numa_node(device->pci_bus_id);

    bool host_register = attribute(d, device->handle, CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED);
    bool wait_nor =
        attribute(d, device->handle, CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR) ||
        attribute(d, device->handle, CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR_V1);
    bool dmabuf = attribute(d, device->handle, CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED);
    bool unified = attribute(d, device->handle, CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING);
    device->flush_remote_writes =
        attribute(d, device->handle, CU_DEVICE_ATTRIBUTE_CAN_FLUSH_REMOTE_WRITES);
    device->memfd_pinned = host_register;
    hm_capabilities caps = HM_CAP_DEVICE_MEMORY | HM_CAP_PINNED_HOST_MEMORY | HM_CAP_HOST_CALLBACK |
                           HM_CAP_EVENT_TIMING | HM_CAP_PEER_COPY;
    // IPC needs shareable pinned memory too (memfd + registration) and unified addressing.
    if (host_register) caps |= HM_CAP_HOST_REGISTER;
    if (host_register && unified) caps |= HM_CAP_IPC;
    // HM_WAIT_NOR is part of the promise, so NOR support gates the whole bit.
    if (wait_nor) caps |= HM_CAP_STREAM_MEMOPS;
    if (dmabuf) caps |= HM_CAP_DMABUF_EXPORT;
    // Device memory is never host-addressable through cuMemAlloc pointers on a discrete GPU.
    device->capabilities = caps;
    s.devices.push_back(std::move(device));
  }
  s.can_access_peer.assign(s.devices.size(), std::vector<bool>(s.devices.size(), false));
  for (size_t a = 0; a < s.devices.size(); ++a)
    for (size_t b = 0; b < s.devices.size(); ++b) {
      int can = 0;
      if (a != b &&
          d.cuDeviceCanAccessPeer(&can, s.devices[a]->handle, s.devices[b]->handle) == CUDA_SUCCESS)
        s.can_access_peer[a][b] = can != 0;
    }
}

hm_status initialize(const hm_host_api* host) {
  return guarded("initialize", [&] {
    hm::kit::require_struct(host, HM_HOST_API_SIZE_V1, "host");
    if (g_state) fail(HM_ERR_INVALID_ARGUMENT, "initialize() called twice");
    auto options = hm::kit::parse_options(host->options);
    hm::kit::reject_unknown(options, "none");
    auto s = std::make_unique<State>();
    s->host = host;
    s->nonce = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^
               (static_cast<uint64_t>(getpid()) << 40) ^ reinterpret_cast<uintptr_t>(s.get());
    try {
      s->nonce ^= static_cast<uint64_t>(std::random_device{}()) << 16;
    } catch (const std::exception&) {
      // the clock and the pid already tell processes apart
    }
    std::string reason = hm::cuda::load_driver(&s->driver);
    // From here on the driver's error texts are available to check() through g_state.
    g_state = s.release();
    if (!reason.empty()) {
      g_state->no_device_reason = reason;
    } else {
      try {
        discover_devices(*g_state);
      } catch (const hm::kit::Failure& failure) {
        g_state->devices.clear();
        g_state->can_access_peer.clear();
        g_state->no_device_reason = failure.message;
      }
    }
    State& st = *g_state;
    if (st.devices.empty()) {
      hm::kit::last_error_storage() = st.no_device_reason;
      log(HM_LOG_DEBUG, "no devices: " + st.no_device_reason);  // the loader logs it too
      return;
    }
    std::string summary = std::to_string(st.devices.size()) + " device(s), driver CUDA " +
                          std::to_string(st.driver_version / 1000) + "." +
                          std::to_string(st.driver_version % 1000 / 10);
    for (size_t i = 0; i < st.devices.size(); ++i)
      summary +=
          "; " + std::to_string(i) + ": " + st.devices[i]->name + " " + st.devices[i]->pci_bus_id;
    log(HM_LOG_DEBUG, summary);
  });
}

hm_status shutdown() {
  return guarded("shutdown", [&] {
    State& s = state();
    for (auto& device : s.devices)
      if (device->retained.load()) s.driver.cuDevicePrimaryCtxRelease(device->handle);
    delete g_state;  // libcuda stays loaded: the driver may have threads running
    g_state = nullptr;
  });
}

hm_status device_count(int32_t* count) {
  return guarded("device_count", [&] {
    if (count == nullptr) fail(HM_ERR_INVALID_ARGUMENT, "count is NULL");
    State& s = state();
    *count = static_cast<int32_t>(s.devices.size());
    // The loader logs last_error as the reason when there are no devices.
    if (s.devices.empty()) hm::kit::last_error_storage() = s.no_device_reason;
  });
}

hm_status device_properties(int32_t device, hm_device_properties* props) {
  return guarded("device_properties", [&] {
    hm::kit::require_struct(props, HM_DEVICE_PROPERTIES_SIZE_V1, "props");
    DeviceState& d = device_state(device);
    std::snprintf(props->name, sizeof props->name, "%s", d.name.c_str());
    std::snprintf(props->vendor, sizeof props->vendor, "NVIDIA");
    props->dlpack_device_type = HM_DLPACK_CUDA;
    std::snprintf(props->pci_bus_id, sizeof props->pci_bus_id, "%s", d.pci_bus_id.c_str());
    props->numa_node = d.numa_node;
    props->total_memory = d.total_memory;
    props->capabilities = d.capabilities;
    props->memory_alignment = kMemoryAlignment;
  });
}

void require(const DeviceState& d, hm_capabilities cap, const char* what) {
  if ((d.capabilities & cap) != cap)
    fail(HM_ERR_NOT_SUPPORTED, "%s is not supported on %s", what, d.name.c_str());
}

// ---- slots: memory ----

hm_status mem_alloc(int32_t device, uint64_t size, int32_t kind, void** ptr) {
  return guarded("mem_alloc", [&] {
    if (ptr == nullptr) fail(HM_ERR_INVALID_ARGUMENT, "ptr is NULL");
    *ptr = nullptr;
    DeviceState& d = device_state(device);
    if (size == 0) fail(HM_ERR_INVALID_ARGUMENT, "size is 0");
    if (kind != HM_MEM_DEVICE && kind != HM_MEM_PINNED_HOST)
      fail(HM_ERR_INVALID_ARGUMENT, "kind %d is not HM_MEM_DEVICE or HM_MEM_PINNED_HOST", kind);
    Allocation a;
    a.size = size;
    a.kind = kind;
    a.device = device;
    void* result = nullptr;
    if (kind == HM_MEM_DEVICE) {
      ContextScope scope(device);
      CUdeviceptr address = 0;
      HM_CU(cuMemAlloc, &address, size);
      a.device_address = address;
      result = reinterpret_cast<void*>(address);
    } else if (d.memfd_pinned) {
      a.host = true;
      result = alloc_memfd_pinned(device, size, &a);
    } else {
      ContextScope scope(device);
      a.host = true;
      HM_CU(cuMemHostAlloc, &result, size, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP);
      a.device_address = host_device_address(result);
    }
    state().table.insert(result, a);
    *ptr = result;
  });
}

hm_status mem_free(void* ptr) {
  return guarded("mem_free", [&] {
    if (ptr == nullptr) return;
    State& s = state();
    auto hit = s.table.find(ptr);
    if (!hit || hit->base != reinterpret_cast<uintptr_t>(ptr) ||
        (hit->allocation.kind != HM_MEM_DEVICE && hit->allocation.kind != HM_MEM_PINNED_HOST))
      fail(HM_ERR_INVALID_ARGUMENT, "%p is not the start of an allocation from mem_alloc", ptr);
    Allocation a = *s.table.erase(ptr);
    ContextScope scope(a.device);
    if (a.kind == HM_MEM_DEVICE)
      HM_CU(cuMemFree, reinterpret_cast<CUdeviceptr>(ptr));
    else if (a.fd >= 0)
      release_memfd_mapping(ptr, a);
    else
      HM_CU(cuMemFreeHost, ptr);
  });
}

hm_status pointer_query(const void* ptr, hm_pointer_info* info) {
  return guarded("pointer_query", [&] {
    hm::kit::require_struct(info, HM_POINTER_INFO_SIZE_V1, "info");
    Memory m = classify(ptr);
    info->kind = m.kind;
    info->device = m.kind == HM_MEM_UNKNOWN ? -1 : m.device;
    info->base = m.kind == HM_MEM_UNKNOWN ? nullptr : reinterpret_cast<void*>(m.base);
    info->size = m.kind == HM_MEM_UNKNOWN ? 0 : m.size;
  });
}

hm_status memcpy_async(hm_stream stream, void* dst, const void* src, uint64_t size) {
  return guarded("memcpy_async", [&] {
    Stream& s = stream_of(stream);
    if (size == 0) return;
    if (dst == nullptr || src == nullptr) fail(HM_ERR_INVALID_ARGUMENT, "dst or src is NULL");
    ContextScope scope(s.device);
    // Unified addressing: the driver finds each side's memory (any device, pinned, registered or
    // pageable host memory) and picks the direction, a peer copy included.
    HM_CU(cuMemcpyAsync, reinterpret_cast<CUdeviceptr>(dst), reinterpret_cast<CUdeviceptr>(src),
          size, s.stream);
  });
}

struct HostFill {
  void* dst;
  uint8_t value;
  uint64_t size;
};

void CUDA_CB run_host_fill(void* user) {
  std::unique_ptr<HostFill> fill(static_cast<HostFill*>(user));
  std::memset(fill->dst, fill->value, fill->size);
}

hm_status memset_async(hm_stream stream, void* dst, int32_t value, uint64_t size) {
  return guarded("memset_async", [&] {
    Stream& s = stream_of(stream);
    if (size == 0) return;
    if (dst == nullptr) fail(HM_ERR_INVALID_ARGUMENT, "dst is NULL");
    Memory m = classify(dst);
    ContextScope scope(s.device);
    if (m.kind != HM_MEM_UNKNOWN && !m.host) {
      HM_CU(cuMemsetD8Async, reinterpret_cast<CUdeviceptr>(dst), static_cast<unsigned char>(value),
            size, s.stream);
      return;
    }
    // Host memory: the host fills it in stream order (no kernel touches host pages).
    auto fill = std::make_unique<HostFill>(HostFill{dst, static_cast<uint8_t>(value), size});
    HM_CU(cuLaunchHostFunc, s.stream, run_host_fill, fill.get());
    fill.release();  // run_host_fill owns it now
  });
}

hm_status host_register(void* ptr, uint64_t size) {
  return guarded("host_register", [&] {
    State& s = state();
    if (s.devices.empty())
      fail(HM_ERR_NOT_SUPPORTED, "no CUDA device: %s", s.no_device_reason.c_str());
    require(*s.devices[0], HM_CAP_HOST_REGISTER, "host_register");
    if (ptr == nullptr || size == 0) fail(HM_ERR_INVALID_ARGUMENT, "empty range");
    if (s.table.find(ptr) || s.table.find(static_cast<char*>(ptr) + size - 1))
      fail(HM_ERR_INVALID_ARGUMENT, "[%p, +%llu) overlaps memory this plugin already knows", ptr,
           static_cast<unsigned long long>(size));
    Allocation a;
    a.size = size;
    a.kind = HM_MEM_REGISTERED_HOST;
    a.device = 0;
    a.host = true;
    a.device_address = register_host_range(0, ptr, size);
    s.table.insert(ptr, a);
  });
}

hm_status host_unregister(void* ptr) {
  return guarded("host_unregister", [&] {
    State& s = state();
    auto hit = s.table.find(ptr);
    if (ptr == nullptr || !hit || hit->base != reinterpret_cast<uintptr_t>(ptr) ||
        hit->allocation.kind != HM_MEM_REGISTERED_HOST)
      fail(HM_ERR_INVALID_ARGUMENT, "%p was not registered with host_register", ptr);
    s.table.erase(ptr);
    ContextScope scope(hit->allocation.device);
    HM_CU(cuMemHostUnregister, ptr);
  });
}

// ---- slots: streams ----

hm_status stream_create(int32_t device, uint32_t flags, hm_stream* out) {
  return guarded("stream_create", [&] {
    device_state(device);
    if (out == nullptr) fail(HM_ERR_INVALID_ARGUMENT, "stream output is NULL");
    if ((flags & ~HM_STREAM_NON_BLOCKING) != 0)
      fail(HM_ERR_INVALID_ARGUMENT, "unknown stream flags 0x%x", flags);
    ContextScope scope(device);
    auto stream = std::make_unique<Stream>();
    stream->device = device;
    HM_CU(cuStreamCreate, &stream->stream,
          (flags & HM_STREAM_NON_BLOCKING) != 0 ? CU_STREAM_NON_BLOCKING : CU_STREAM_DEFAULT);
    *out = reinterpret_cast<hm_stream>(stream.release());
  });
}

hm_status stream_destroy(hm_stream stream) {
  return guarded("stream_destroy", [&] {
    Stream& s = stream_of(stream);
    ContextScope scope(s.device);
    // Returns at once; CUDA releases the stream after its pending work completes.
    CUresult result = drv().cuStreamDestroy(s.stream);
    s.magic = 0;
    delete &s;
    check(result, "cuStreamDestroy");
  });
}

hm_status stream_synchronize(hm_stream stream, uint64_t timeout_ns) {
  return guarded("stream_synchronize", [&] {
    Stream& s = stream_of(stream);
    ContextScope scope(s.device);
    if (timeout_ns == HM_TIMEOUT_INFINITE) {
      HM_CU(cuStreamSynchronize, s.stream);
      return;
    }
    const Driver& d = drv();
    poll_until_done([&] { return d.cuStreamQuery(s.stream); }, timeout_ns, "cuStreamQuery",
                    "stream work");
  });
}

hm_status stream_query(hm_stream stream) {
  return guarded("stream_query", [&]() -> hm_status {
    Stream& s = stream_of(stream);
    ContextScope scope(s.device);
    CUresult result = drv().cuStreamQuery(s.stream);
    if (result == CUDA_ERROR_NOT_READY) return HM_ERR_NOT_READY;
    check(result, "cuStreamQuery");
    return HM_OK;
  });
}

hm_status stream_add_callback(hm_stream stream, hm_host_fn fn, void* user_data) {
  return guarded("stream_add_callback", [&] {
    Stream& s = stream_of(stream);
    if (fn == nullptr) fail(HM_ERR_INVALID_ARGUMENT, "callback is NULL");
    ContextScope scope(s.device);
    // Runs on a driver thread once prior work completes; later work waits for it to return.
    HM_CU(cuLaunchHostFunc, s.stream, fn, user_data);
  });
}

// ---- slots: events ----

hm_status event_create(int32_t device, uint32_t flags, hm_event* out) {
  return guarded("event_create", [&] {
    device_state(device);
    if (out == nullptr) fail(HM_ERR_INVALID_ARGUMENT, "event output is NULL");
    if ((flags & ~HM_EVENT_DISABLE_TIMING) != 0)
      fail(HM_ERR_INVALID_ARGUMENT, "unknown event flags 0x%x", flags);
    auto event = std::make_unique<Event>();
    event->device = device;
    event->timing = (flags & HM_EVENT_DISABLE_TIMING) == 0;
    event->flags = event->timing ? CU_EVENT_DEFAULT : CU_EVENT_DISABLE_TIMING;
    event->events.assign(state().devices.size(), nullptr);
    ContextScope scope(device);
    HM_CU(cuEventCreate, &event->events[static_cast<size_t>(device)], event->flags);
    *out = reinterpret_cast<hm_event>(event.release());
  });
}

hm_status event_destroy(hm_event event) {
  return guarded("event_destroy", [&] {
    Event& e = event_of(event);
    e.magic = 0;
    std::unique_ptr<Event> owned(&e);
    CUresult first_error = CUDA_SUCCESS;
    for (size_t d = 0; d < e.events.size(); ++d) {
      if (e.events[d] == nullptr) continue;
      ContextScope scope(static_cast<int32_t>(d));
      CUresult result = drv().cuEventDestroy(e.events[d]);
      if (first_error == CUDA_SUCCESS) first_error = result;
    }
    check(first_error, "cuEventDestroy");
  });
}

// The CUevent of `e` on `device`, created on first use there.
CUevent event_on(Event& e, int32_t device) {
  auto index = static_cast<size_t>(device);
  if (device == e.device) return e.events[index];
  std::lock_guard lock(e.mutex);
  if (e.events[index] == nullptr) HM_CU(cuEventCreate, &e.events[index], e.flags);
  return e.events[index];
}

hm_status event_record(hm_event event, hm_stream stream) {
  return guarded("event_record", [&] {
    Event& e = event_of(event);
    Stream& s = stream_of(stream);
    ContextScope scope(s.device);
    HM_CU(cuEventRecord, event_on(e, s.device), s.stream);
    e.recorded_on.store(s.device, std::memory_order_release);
  });
}

hm_status event_query(hm_event event) {
  return guarded("event_query", [&]() -> hm_status {
    Event& e = event_of(event);
    int32_t device = e.recorded_on.load(std::memory_order_acquire);
    if (device < 0) return HM_OK;  // never recorded: complete
    ContextScope scope(device);
    CUresult result = drv().cuEventQuery(e.events[static_cast<size_t>(device)]);
    if (result == CUDA_ERROR_NOT_READY) return HM_ERR_NOT_READY;
    check(result, "cuEventQuery");
    return HM_OK;
  });
}

hm_status event_synchronize(hm_event event, uint64_t timeout_ns) {
  return guarded("event_synchronize", [&] {
    Event& e = event_of(event);
    int32_t device = e.recorded_on.load(std::memory_order_acquire);
    if (device < 0) return;
    CUevent handle = e.events[static_cast<size_t>(device)];
    ContextScope scope(device);
    if (timeout_ns == HM_TIMEOUT_INFINITE) {
      HM_CU(cuEventSynchronize, handle);
      return;
    }
    const Driver& d = drv();
    poll_until_done([&] { return d.cuEventQuery(handle); }, timeout_ns, "cuEventQuery", "event");
  });
}

hm_status stream_wait_event(hm_stream stream, hm_event event) {
  return guarded("stream_wait_event", [&] {
    Stream& s = stream_of(stream);
    Event& e = event_of(event);
    int32_t device = e.recorded_on.load(std::memory_order_acquire);
    if (device < 0) return;  // nothing captured: nothing to wait for
    ContextScope scope(s.device);
    // The event may live on another device: CUDA orders streams across contexts.
    HM_CU(cuStreamWaitEvent, s.stream, e.events[static_cast<size_t>(device)], 0);
  });
}

hm_status event_elapsed_ms(hm_event start, hm_event end, float* milliseconds) {
  return guarded("event_elapsed_ms", [&]() -> hm_status {
    if (milliseconds == nullptr) fail(HM_ERR_INVALID_ARGUMENT, "milliseconds is NULL");
    Event& a = event_of(start);
    Event& b = event_of(end);
    if (!a.timing || !b.timing)
      fail(HM_ERR_INVALID_ARGUMENT, "an event was created with HM_EVENT_DISABLE_TIMING");
    int32_t da = a.recorded_on.load(std::memory_order_acquire);
    int32_t db = b.recorded_on.load(std::memory_order_acquire);
    if (da < 0 || db < 0) fail(HM_ERR_INVALID_ARGUMENT, "an event was never recorded");
    if (da != db)
      fail(HM_ERR_INVALID_ARGUMENT, "the events were recorded on different devices (%d and %d)", da,
           db);
    ContextScope scope(da);
    CUresult result = drv().cuEventElapsedTime(milliseconds, a.events[static_cast<size_t>(da)],
                                               b.events[static_cast<size_t>(db)]);
    if (result == CUDA_ERROR_NOT_READY) return HM_ERR_NOT_READY;
    check(result, "cuEventElapsedTime");
    return HM_OK;
  });
}

// ---- slots: stream memory operations ----

// The device address of a 32-bit word in device, pinned or registered memory.
CUdeviceptr memop_address(const void* address, const DeviceState& stream_device) {
  require(stream_device, HM_CAP_STREAM_MEMOPS, "stream memory operations");
  if (address == nullptr) fail(HM_ERR_INVALID_ARGUMENT, "address is NULL");
  if (reinterpret_cast<uintptr_t>(address) % 4 != 0)
    fail(HM_ERR_INVALID_ARGUMENT, "address %p is not 4-byte aligned", address);
  Memory m = classify(address);
  if (m.kind == HM_MEM_UNKNOWN)
    fail(HM_ERR_INVALID_ARGUMENT,
         "%p is not device, pinned or registered memory of this plugin (plain host memory must "
         "be registered with host_register first)",
         address);
  uint64_t offset = reinterpret_cast<uintptr_t>(address) - m.base;
  if (offset + 4 > m.size)
    fail(HM_ERR_INVALID_ARGUMENT, "the word at %p overruns its allocation", address);
  if (!m.host) return reinterpret_cast<CUdeviceptr>(address);
  CUdeviceptr base = m.device_address != 0 ? m.device_address
                                           : host_device_address(reinterpret_cast<void*>(m.base));
  return base + offset;
}

hm_status stream_write_value32(hm_stream stream, void* address, uint32_t value, uint32_t flags) {
  return guarded("stream_write_value32", [&] {
    Stream& s = stream_of(stream);
    if (flags != 0) fail(HM_ERR_INVALID_ARGUMENT, "flags must be 0, got 0x%x", flags);
    ContextScope scope(s.device);
    CUdeviceptr target = memop_address(address, device_state(s.device));
    // The default write has a memory barrier first: prior work on the stream is visible (release).
    HM_CU(cuStreamWriteValue32, s.stream, target, value, CU_STREAM_WRITE_VALUE_DEFAULT);
  });
}

hm_status stream_wait_value32(hm_stream stream, const void* address, uint32_t value,
                              int32_t condition, uint32_t flags) {
  return guarded("stream_wait_value32", [&] {
    Stream& s = stream_of(stream);
    if (flags != 0) fail(HM_ERR_INVALID_ARGUMENT, "flags must be 0, got 0x%x", flags);
    unsigned cu_flags;
    switch (condition) {
      case HM_WAIT_GEQ:  // CUDA's GEQ is the cyclic (int32_t)(*addr - value) >= 0, as the ABI's
        cu_flags = CU_STREAM_WAIT_VALUE_GEQ;
        break;
      case HM_WAIT_EQ:
        cu_flags = CU_STREAM_WAIT_VALUE_EQ;
        break;
      case HM_WAIT_AND:
        cu_flags = CU_STREAM_WAIT_VALUE_AND;
        break;
      case HM_WAIT_NOR:
        cu_flags = CU_STREAM_WAIT_VALUE_NOR;
        break;
      default:
        fail(HM_ERR_INVALID_ARGUMENT, "unknown wait condition %d", condition);
    }
    ContextScope scope(s.device);
    const DeviceState& d = device_state(s.device);
    CUdeviceptr target = memop_address(address, d);
    // A NIC may have written the data before the flag: make its writes visible to later work.
    if (d.flush_remote_writes) cu_flags |= CU_STREAM_WAIT_VALUE_FLUSH;
    HM_CU(cuStreamWaitValue32, s.stream, target, value, cu_flags);
  });
}

// ---- slots: IPC ----

struct IpcHandle {
  uint32_t magic;       // kIpcMagic
  uint16_t version;     // kIpcVersion
  uint16_t kind;        // HM_MEM_DEVICE or HM_MEM_PINNED_HOST
  int32_t pid;          // the exporting process
  int32_t fd;           // pinned: the exporter's memfd
  uint64_t nonce;       // the exporter's State::nonce
  uint64_t size;        // bytes of the exported allocation
  int32_t device;       // the exporter's device
  uint32_t reserved;    // 0
  CUipcMemHandle cuda;  // device memory: cuIpcGetMemHandle
};
static_assert(sizeof(IpcHandle) <= HM_IPC_HANDLE_BYTES);

hm_status ipc_export(void* ptr, hm_ipc_handle* handle) {
  return guarded("ipc_export", [&] {
    if (handle == nullptr) fail(HM_ERR_INVALID_ARGUMENT, "handle is NULL");
    State& s = state();
    auto hit = ptr != nullptr ? s.table.find(ptr) : std::nullopt;
    if (!hit ||
        (hit->allocation.kind != HM_MEM_DEVICE && hit->allocation.kind != HM_MEM_PINNED_HOST))
      fail(HM_ERR_INVALID_ARGUMENT, "%p is not inside device or pinned memory from mem_alloc", ptr);
    const Allocation& a = hit->allocation;
    require(device_state(a.device), HM_CAP_IPC, "IPC");
    IpcHandle h{};
    h.magic = kIpcMagic;
    h.version = kIpcVersion;
    h.kind = static_cast<uint16_t>(a.kind);
    h.pid = static_cast<int32_t>(getpid());
    h.fd = -1;
    h.nonce = s.nonce;
    h.size = a.size;
    h.device = a.device;
    if (a.kind == HM_MEM_DEVICE) {
      ContextScope scope(a.device);
      HM_CU(cuIpcGetMemHandle, &h.cuda, static_cast<CUdeviceptr>(hit->base));
    } else {
      if (a.fd < 0) fail(HM_ERR_NOT_SUPPORTED, "this pinned memory is not shareable");
      h.fd = a.fd;
    }
    *handle = hm_ipc_handle{};
    std::memcpy(handle->bytes, &h, sizeof h);
  });
}

hm_status ipc_open(int32_t device, const hm_ipc_handle* handle, void** ptr) {
  return guarded("ipc_open", [&] {
    if (handle == nullptr || ptr == nullptr) fail(HM_ERR_INVALID_ARGUMENT, "handle or ptr is NULL");
    *ptr = nullptr;
    State& s = state();
    DeviceState& d = device_state(device);
    require(d, HM_CAP_IPC, "IPC");
    IpcHandle h;
    std::memcpy(&h, handle->bytes, sizeof h);
    if (h.magic != kIpcMagic)
      fail(HM_ERR_INVALID_ARGUMENT, "handle was not exported by the cuda plugin (magic %08x)",
           h.magic);
    if (h.version != kIpcVersion)
      fail(HM_ERR_INVALID_ARGUMENT, "handle version %u, this plugin reads %u", h.version,
           kIpcVersion);
    if ((h.kind != HM_MEM_DEVICE && h.kind != HM_MEM_PINNED_HOST) || h.size == 0 || h.pid <= 0 ||
        (h.kind == HM_MEM_PINNED_HOST && h.fd < 0))
      fail(HM_ERR_INVALID_ARGUMENT, "handle is malformed (kind %u, size %llu, pid %d)", h.kind,
           static_cast<unsigned long long>(h.size), h.pid);
    if (h.pid == static_cast<int32_t>(getpid()) && h.nonce == s.nonce)
      fail(HM_ERR_NOT_SUPPORTED,
           "the handle was exported by this process; CUDA cannot open its own IPC handles, use "
           "the exported pointer directly");
    Allocation a;
    a.size = h.size;
    a.kind = HM_MEM_IPC_MAPPED;
    a.device = device;
    void* result = nullptr;
    if (h.kind == HM_MEM_DEVICE) {
      ContextScope scope(device);
      CUdeviceptr address = 0;
      HM_CU(cuIpcOpenMemHandle, &address, h.cuda, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
      a.device_address = address;
      result = reinterpret_cast<void*>(address);
    } else {
      char path[64];
      std::snprintf(path, sizeof path, "/proc/%d/fd/%d", h.pid, h.fd);
      int fd = open(path, O_RDWR | O_CLOEXEC);
      if (fd < 0)
        fail(errno == ENOENT ? HM_ERR_INVALID_ARGUMENT : HM_ERR_BACKEND,
             "cannot open %s (exporting process gone or not permitted): %s", path,
             std::strerror(errno));
      a.fd = fd;
      a.host = true;
      a.mapped = hm::kit::round_up(h.size, hm::kit::page_size());
      try {
        result = hm::kit::map_memfd(fd, h.size, PROT_READ | PROT_WRITE);
        a.device_address = register_host_range(device, result, a.mapped);
      } catch (...) {
        hm::kit::unmap(result, h.size);
        close(fd);
        throw;
      }
    }
    s.table.insert(result, a);
    *ptr = result;
  });
}

hm_status ipc_close(void* ptr) {
  return guarded("ipc_close", [&] {
    State& s = state();
    auto hit = ptr != nullptr ? s.table.find(ptr) : std::nullopt;
    if (!hit || hit->base != reinterpret_cast<uintptr_t>(ptr) ||
        hit->allocation.kind != HM_MEM_IPC_MAPPED)
      fail(HM_ERR_INVALID_ARGUMENT, "%p is not a base address returned by ipc_open", ptr);
    Allocation a = *s.table.erase(ptr);
    ContextScope scope(a.device);
    if (a.host)
      release_memfd_mapping(ptr, a);
    else
      HM_CU(cuIpcCloseMemHandle, reinterpret_cast<CUdeviceptr>(ptr));
  });
}

// ---- slots: dma-buf ----

hm_status dmabuf_export(const void* ptr, uint64_t size, hm_dmabuf* out) {
  return guarded("dmabuf_export", [&] {
    hm::kit::require_struct(out, HM_DMABUF_SIZE_V1, "out");
    Memory m = classify(ptr);
    if (m.kind != HM_MEM_DEVICE)
      fail(HM_ERR_INVALID_ARGUMENT, "%p is not device memory of this plugin", ptr);
    require(device_state(m.device), HM_CAP_DMABUF_EXPORT, "dma-buf export");
    uint64_t page = hm::kit::page_size();
    auto start = reinterpret_cast<uintptr_t>(ptr);
    if (size == 0 || start % page != 0 || size % page != 0)
      fail(HM_ERR_INVALID_ARGUMENT,
           "dma-buf ranges must be page-aligned: %p + %llu (page size %llu)", ptr,
           static_cast<unsigned long long>(size), static_cast<unsigned long long>(page));
    ContextScope scope(m.device);
    CUdeviceptr base = 0;
    size_t extent = 0;
    HM_CU(cuMemGetAddressRange, &base, &extent, static_cast<CUdeviceptr>(start));
    if (start + size > base + extent)
      fail(HM_ERR_INVALID_ARGUMENT, "%p + %llu overruns its allocation (%zu bytes at %p)", ptr,
           static_cast<unsigned long long>(size), extent, reinterpret_cast<void*>(base));
    int fd = -1;
    HM_CU(cuMemGetHandleForAddressRange, &fd, static_cast<CUdeviceptr>(start), size,
          CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
    out->fd = fd;
    out->offset = 0;
    out->length = size;
  });
}

hm_status dmabuf_release(const hm_dmabuf* dmabuf) {
  return guarded("dmabuf_release", [&] {
    hm::kit::require_struct(dmabuf, HM_DMABUF_SIZE_V1, "dmabuf");
    if (dmabuf->fd < 0 || close(dmabuf->fd) != 0)
      fail(HM_ERR_INVALID_ARGUMENT, "fd %d is not open", dmabuf->fd);
  });
}

// ---- extensions ----

hm_status stream_native(hm_stream stream, void** cu_stream, int32_t* cuda_ordinal) {
  return guarded("hm.cuda.native.stream_native", [&] {
    if (cu_stream == nullptr || cuda_ordinal == nullptr)
      fail(HM_ERR_INVALID_ARGUMENT, "cu_stream or cuda_ordinal is NULL");
    Stream& s = stream_of(stream);
    *cu_stream = s.stream;
    *cuda_ordinal = static_cast<int32_t>(device_state(s.device).handle);
  });
}

const hm_cuda_native_ext kNativeExtension = {{sizeof(hm_cuda_native_ext), HM_CUDA_NATIVE_VERSION},
                                             stream_native};

hm_status get_extension(const char* name, uint32_t min_version, const void** table) {
  return guarded("get_extension", [&] {
    if (name == nullptr || table == nullptr) fail(HM_ERR_INVALID_ARGUMENT, "name or table is NULL");
    if (std::strcmp(name, HM_CUDA_NATIVE_EXTENSION) != 0)
      fail(HM_ERR_NOT_SUPPORTED, "no extension named '%s'", name);
    if (min_version > HM_CUDA_NATIVE_VERSION)
      fail(HM_ERR_NOT_SUPPORTED, "'%s' version %u requested, this plugin has %u", name, min_version,
           HM_CUDA_NATIVE_VERSION);
    *table = &kNativeExtension;
  });
}

// ---- the table ----

hm_device_plugin_api make_table() {
  static char version[64];
  std::snprintf(version, sizeof version, "%s+cuda%d.%d", HETMESH_VERSION, CUDA_VERSION / 1000,
                CUDA_VERSION % 1000 / 10);
  hm_device_plugin_api t{};
  t.struct_size = sizeof t;
  t.abi_major = HM_DEVICE_PLUGIN_ABI_MAJOR;
  t.abi_minor = HM_DEVICE_PLUGIN_ABI_MINOR;
  t.name = "cuda";
  t.version = version;
  t.initialize = initialize;
  t.last_error = hm::kit::last_error;
  t.device_count = device_count;
  t.device_properties = device_properties;
  t.mem_alloc = mem_alloc;
  t.mem_free = mem_free;
  t.pointer_query = pointer_query;
  t.memcpy_async = memcpy_async;
  t.memset_async = memset_async;
  t.stream_create = stream_create;
  t.stream_destroy = stream_destroy;
  t.stream_synchronize = stream_synchronize;
  t.stream_query = stream_query;
  t.event_create = event_create;
  t.event_destroy = event_destroy;
  t.event_record = event_record;
  t.event_query = event_query;
  t.event_synchronize = event_synchronize;
  t.stream_wait_event = stream_wait_event;
  t.shutdown = shutdown;
  t.host_register = host_register;
  t.host_unregister = host_unregister;
  t.stream_add_callback = stream_add_callback;
  t.event_elapsed_ms = event_elapsed_ms;
  t.stream_write_value32 = stream_write_value32;
  t.stream_wait_value32 = stream_wait_value32;
  t.ipc_export = ipc_export;
  t.ipc_open = ipc_open;
  t.ipc_close = ipc_close;
  t.dmabuf_export = dmabuf_export;
  t.dmabuf_release = dmabuf_release;
  t.get_extension = get_extension;
  return t;
}

}  // namespace

extern "C" const hm_device_plugin_api* hm_device_plugin_v1(void) {
  static const hm_device_plugin_api table = make_table();
  return &table;
}
