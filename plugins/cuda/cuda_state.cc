// The cuda plugin's shared state and the helpers every slot file uses (declared in cuda_state.hpp):
// state access, the driver-call check, primary contexts, handle checks and address lookups.
#include "cuda_state.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <mutex>
#include <string>

namespace hm::cuda {

// ---- state ----

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

DeviceState& device_state(int32_t device) {
  State& s = state();
  if (device < 0 || device >= static_cast<int32_t>(s.devices.size()))
    fail(HM_ERR_INVALID_ARGUMENT, "device %d does not exist (%zu devices)", device,
         s.devices.size());
  return *s.devices[static_cast<size_t>(device)];
}

void require(const DeviceState& d, hm_capabilities cap, const char* what) {
  if ((d.capabilities & cap) != cap)
    fail(HM_ERR_NOT_SUPPORTED, "%s is not supported on %s", what, d.name.c_str());
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

// ---- streams and events ----

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

// ---- memory ----

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

CUdeviceptr host_device_address(void* base) {
  CUdeviceptr address = 0;
  HM_CU(cuMemHostGetDevicePointer, &address, base, 0);
  return address;
}

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

void release_memfd_mapping(void* ptr, const Allocation& a) {
  CUresult result = drv().cuMemHostUnregister(ptr);
  munmap(ptr, a.mapped);
  close(a.fd);
  check(result, "cuMemHostUnregister");
}

}  // namespace hm::cuda
