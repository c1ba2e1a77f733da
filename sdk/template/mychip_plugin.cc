// mychip: the template device plugin. Copy this folder, rename "mychip" everywhere, and replace
// each `// Vendor:` spot with the driver call it names (CUDA / HIP / Level Zero shown as examples).
//
// Until then it simulates one device with host memory: device and pinned allocations are aligned
// host allocations, and streams, events, host callbacks and stream memory operations run on host
// threads (hm::kit::install_host_streams). Its capabilities say exactly that: device memory,
// pinned host memory, host-addressable device memory, stream memops, host callbacks and event
// timing. Everything else (host_register, IPC, dma-buf, peer copy, extensions) is left out: those
// slots stay NULL and their bits clear. See docs/writing-a-plugin.md.
#include <hetmesh/device_plugin.h>
#include <hetmesh/plugin_kit/allocation_table.hpp>
#include <hetmesh/plugin_kit/host_streams.hpp>
#include <hetmesh/plugin_kit/options.hpp>
#include <hetmesh/plugin_kit/status.hpp>
#include <hetmesh/plugin_kit/table.hpp>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

using hm::kit::fail;
using hm::kit::guarded;

constexpr const char* kName = "mychip";    // selectors are "mychip:<index>"
constexpr const char* kVersion = "0.1.0";  // your plugin's own version, e.g. "1.2.0+driver550"
constexpr int32_t kDeviceCount = 1;
constexpr uint64_t kAlignment = 256;            // reported as memory_alignment
constexpr uint64_t kDeviceMemory = 4ull << 30;  // simulated device memory per device (4 GiB)

constexpr hm_capabilities kCapabilities = HM_CAP_DEVICE_MEMORY | HM_CAP_PINNED_HOST_MEMORY |
                                          HM_CAP_HOST_ADDRESSABLE_DEVICE_MEMORY |
                                          hm::kit::kHostStreamCapabilities;

struct Allocation {
  uint64_t size;  // bytes requested
  int32_t kind;   // HM_MEM_DEVICE or HM_MEM_PINNED_HOST
  int32_t device;
};

std::atomic<bool> g_initialized{false};
std::atomic<uint64_t> g_device_used{0};  // simulated capacity; a real driver tracks this itself
// Every live allocation by base address: answers pointer_query for interior pointers and
// validates mem_free and copy ranges. Thread-safe.
hm::kit::AllocationTable<Allocation> g_allocations;

void require_initialized() {
  if (!g_initialized.load(std::memory_order_acquire))
    fail(HM_ERR_UNINITIALIZED, "initialize() has not succeeded");
}

void check_device(int32_t device) {
  require_initialized();
  if (device < 0 || device >= kDeviceCount)
    fail(HM_ERR_INVALID_ARGUMENT, "device %d does not exist (%d devices)", device, kDeviceCount);
}

// ---- lifecycle ----

hm_status initialize(const hm_host_api* host) {
  return guarded("initialize", [&] {
    hm::kit::require_struct(host, HM_HOST_API_SIZE_V1, "host");
    if (g_initialized.load()) fail(HM_ERR_INVALID_ARGUMENT, "initialize() called twice");
    // This plugin takes no options; read yours with hm::kit::take_number before this line.
    hm::kit::reject_unknown(hm::kit::parse_options(host->options), "none");
    // Vendor: start the driver and count devices: cuInit + cuDeviceGetCount / hipInit +
    // hipGetDeviceCount / zeInit + zeDriverGet + zeDeviceGet. No device present is not an error:
    // succeed, report 0 devices, and leave the reason in last_error.
    g_initialized.store(true, std::memory_order_release);
  });
}

hm_status shutdown() {
  return guarded("shutdown", [&] {
    require_initialized();
    // Vendor: release what initialize() acquired: cuDevicePrimaryCtxRelease / zeContextDestroy.
    g_initialized.store(false, std::memory_order_release);
  });
}

// ---- devices ----

hm_status device_count(int32_t* count) {
  return guarded("device_count", [&] {
    require_initialized();
    if (count == nullptr) fail(HM_ERR_INVALID_ARGUMENT, "count is NULL");
    *count = kDeviceCount;
  });
}

hm_status device_properties(int32_t device, hm_device_properties* props) {
  return guarded("device_properties", [&] {
    hm::kit::require_struct(props, HM_DEVICE_PROPERTIES_SIZE_V1, "props");
    check_device(device);
    // Vendor: cuDeviceGetName, cuDeviceTotalMem, cuDeviceGetPCIBusId, cuDeviceGetAttribute /
    // hipGetDeviceProperties / zeDeviceGetProperties, zeDeviceGetMemoryProperties. NUMA node:
    // /sys/bus/pci/devices/<pci_bus_id>/numa_node.
    std::snprintf(props->name, sizeof props->name, "MyChip simulated accelerator");
    std::snprintf(props->vendor, sizeof props->vendor, "MyChip");
    props->dlpack_device_type = HM_DLPACK_EXT_DEV;
    props->pci_bus_id[0] = '\0';
    props->numa_node = -1;
    props->total_memory = kDeviceMemory;
    // Set a bit only for what really works: hetmesh-cts checks both directions.
    props->capabilities = kCapabilities;
    props->memory_alignment = kAlignment;
  });
}

// ---- memory ----

// The simulated memory: host allocations aligned to kAlignment; nullptr when out of memory.
void* aligned_host_alloc(uint64_t size) {
  if (size > (uint64_t{1} << 48)) return nullptr;  // more than any host has; no overflow below
  return std::aligned_alloc(kAlignment, (size + kAlignment - 1) / kAlignment * kAlignment);
}

bool reserve_device_memory(uint64_t size) {
  uint64_t used = g_device_used.load();
  do {
    if (size > kDeviceMemory - used) return false;
  } while (!g_device_used.compare_exchange_weak(used, used + size));
  return true;
}

void release(void* ptr, const Allocation& allocation) {
  // Vendor: device memory: cuMemFree / hipFree / zeMemFree; pinned host memory: cuMemFreeHost /
  // hipHostFree / zeMemFree.
  std::free(ptr);
  if (allocation.kind == HM_MEM_DEVICE) g_device_used -= allocation.size;
}

hm_status mem_alloc(int32_t device, uint64_t size, int32_t kind, void** ptr) {
  return guarded("mem_alloc", [&] {
    check_device(device);
    if (ptr == nullptr) fail(HM_ERR_INVALID_ARGUMENT, "ptr is NULL");
    if (size == 0) fail(HM_ERR_INVALID_ARGUMENT, "size is 0");
    void* p = nullptr;
    if (kind == HM_MEM_DEVICE) {
      // Vendor: cuMemAlloc / hipMalloc / zeMemAllocDevice (the driver enforces capacity).
      if (reserve_device_memory(size)) {
        p = aligned_host_alloc(size);
        if (p == nullptr) g_device_used -= size;
      }
    } else if (kind == HM_MEM_PINNED_HOST) {
      // Vendor: cuMemHostAlloc / hipHostMalloc / zeMemAllocHost.
      p = aligned_host_alloc(size);
    } else {
      fail(HM_ERR_INVALID_ARGUMENT, "kind %d is not HM_MEM_DEVICE or HM_MEM_PINNED_HOST", kind);
    }
    if (p == nullptr)
      fail(HM_ERR_OUT_OF_MEMORY, "cannot allocate %llu bytes of kind %d on device %d",
           static_cast<unsigned long long>(size), kind, device);
    Allocation allocation{size, kind, device};
    try {
      g_allocations.insert(p, allocation);
    } catch (...) {
      release(p, allocation);
      throw;
    }
    *ptr = p;
  });
}

hm_status mem_free(void* ptr) {
  return guarded("mem_free", [&] {
    require_initialized();
    if (ptr == nullptr) return;
    // erase() matches base addresses only, so an interior pointer is refused, and of two threads
    // freeing the same pointer exactly one succeeds.
    auto allocation = g_allocations.erase(ptr);
    if (!allocation)
      fail(HM_ERR_INVALID_ARGUMENT, "%p is not the start of an allocation from mem_alloc", ptr);
    release(ptr, *allocation);
  });
}

hm_status pointer_query(const void* ptr, hm_pointer_info* info) {
  return guarded("pointer_query", [&] {
    require_initialized();
    hm::kit::require_struct(info, HM_POINTER_INFO_SIZE_V1, "info");
    // Vendor: the driver can answer this instead of the table: cuPointerGetAttributes
    // (MEMORY_TYPE, RANGE_START_ADDR, RANGE_SIZE, DEVICE_ORDINAL) / hipPointerGetAttributes +
    // hipMemGetAddressRange / zeMemGetAllocProperties + zeMemGetAddressRange.
    auto hit = g_allocations.find(ptr);
    info->kind = hit ? hit->allocation.kind : HM_MEM_UNKNOWN;
    info->device = hit ? hit->allocation.device : -1;
    info->base = hit ? reinterpret_cast<void*>(hit->base) : nullptr;
    info->size = hit ? hit->allocation.size : 0;
  });
}

// A copy or memset operand: plain host memory, or a range that stays inside one allocation.
void check_operand(const void* ptr, uint64_t size, const char* what) {
  if (ptr == nullptr) fail(HM_ERR_INVALID_ARGUMENT, "%s is NULL", what);
  auto hit = g_allocations.find(ptr);
  if (!hit) return;  // not ours: plain host memory
  uint64_t offset = reinterpret_cast<uintptr_t>(ptr) - hit->base;
  if (size > hit->allocation.size - offset)
    fail(HM_ERR_INVALID_ARGUMENT, "%s range %p+%llu overruns its allocation of %llu bytes", what,
         ptr, static_cast<unsigned long long>(size),
         static_cast<unsigned long long>(hit->allocation.size));
}

hm_status memcpy_async(hm_stream stream, void* dst, const void* src, uint64_t size) {
  return guarded("memcpy_async", [&] {
    hm::kit::HostStream* s = hm::kit::host_stream(stream);  // NULL -> HM_ERR_INVALID_HANDLE
    if (size == 0) return;
    check_operand(dst, size, "dst");
    check_operand(src, size, "src");
    // Vendor: cuMemcpyAsync (unified addressing infers the direction) / hipMemcpyAsync with
    // hipMemcpyDefault / zeCommandListAppendMemoryCopy on the stream's command list.
    s->worker.submit([=] { std::memmove(dst, src, size); });
  });
}

hm_status memset_async(hm_stream stream, void* dst, int32_t value, uint64_t size) {
  return guarded("memset_async", [&] {
    hm::kit::HostStream* s = hm::kit::host_stream(stream);
    if (size == 0) return;
    check_operand(dst, size, "dst");
    // Vendor: cuMemsetD8Async / hipMemsetAsync / zeCommandListAppendMemoryFill.
    s->worker.submit([=] { std::memset(dst, value, size); });
  });
}

// ---- hooks for the kit's host streams ----

int32_t hook_device_count() {
  return g_initialized.load() ? kDeviceCount : 0;
}

// Where stream_write_value32 / stream_wait_value32 touch the word: it must be our memory.
void* hook_host_view(const void* address, uint64_t size) {
  if (!g_allocations.find_range(address, size))
    fail(HM_ERR_INVALID_ARGUMENT, "%p is not device or pinned memory of this plugin", address);
  return const_cast<void*>(address);
}

hm_device_plugin_api make_table() {
  // The header the host checks first (this SDK's struct_size and ABI version, kName, kVersion)
  // and the kit's last_error slot; every other slot starts NULL.
  hm_device_plugin_api t = hm::kit::plugin_table(kName, kVersion);
  t.initialize = initialize;
  t.device_count = device_count;
  t.device_properties = device_properties;
  t.mem_alloc = mem_alloc;
  t.mem_free = mem_free;
  t.pointer_query = pointer_query;
  t.memcpy_async = memcpy_async;
  t.memset_async = memset_async;
  t.shutdown = shutdown;
  // Streams, events, stream_add_callback, event_elapsed_ms and the stream memops, on host threads.
  // Vendor: a device with hardware queues sets these slots itself: cuStreamCreateWithFlags,
  // cuEventRecord, cuStreamWaitEvent, cuLaunchHostFunc, cuEventElapsedTime, cuStreamWriteValue32,
  // cuStreamWaitValue32 (HIP: the hip* equivalents; Level Zero: immediate command lists and
  // zeEvent*), and drops hm::kit::kHostStreamCapabilities for what it cannot do.
  hm::kit::install_host_streams(&t, {hook_device_count, hook_host_view});
  // host_register, ipc_*, dmabuf_* and get_extension stay NULL: the capability bits are clear and
  // the host treats a NULL optional slot as HM_ERR_NOT_SUPPORTED.
  return t;
}

}  // namespace

// The one exported symbol: cheap and side-effect free (no driver calls, no threads).
extern "C" const hm_device_plugin_api* hm_device_plugin_v1(void) {
  static const hm_device_plugin_api table = make_table();
  return &table;
}
