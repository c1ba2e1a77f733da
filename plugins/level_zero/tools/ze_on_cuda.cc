// A Level Zero driver made of the CUDA driver API: the calls the level_zero plugin makes
// (plugins/level_zero/README.md lists them), each done by its CUDA counterpart, so that the
// plugin's own code, through Debian's real loader (ZE_ENABLE_ALT_DRIVERS=<this library>), moves
// real bytes through a real GPU. A test tool for a project with no Intel GPU: ci/gpu/ runs the
// plugin's CTS through it on the H200, labelled as such. It says nothing about Intel hardware or
// its driver; it does run every line of the plugin's Level Zero calls on a device whose memory the
// host cannot touch.
//
// How Level Zero's model maps (README.md in this folder says more):
// - an immediate command list is a CUDA stream (in order, asynchronous appends);
// - an event is a 32-bit word in pinned, device-mapped host memory, as on Intel's hardware:
//   a list signals or resets it with cuStreamWriteValue32, waits on it with cuStreamWaitValue32,
//   the host signals, resets and polls it directly;
// - device memory is cuMemCreate'd with a POSIX file descriptor for IPC, so an IPC handle holds a
//   file descriptor in its first bytes, valid in the process that made it (Intel's driver hands
//   out a dma-buf fd the same way: the importer must bring the fd into its own process first);
// - global timestamps come from the GPU's %globaltimer (ns), written by a one-thread kernel;
// - Intel's experimental memory waits map to cuStreamWaitValue32/64: EQUAL and GREATER_THAN_EQUAL
//   only, and CUDA's GEQ is cyclic where Intel's is unsigned (the plugin waits GEQ only on 64-bit
//   tickets, which never wrap).
#include "ze_driver_calls.h"
#include "ze_export_chain.h"
#include "ze_memory_sync.h"

#include <cuda.h>
#include <level_zero/ze_api.h>

#include <unistd.h>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <thread>
#include <vector>

struct _ze_driver_handle_t {};
struct _ze_context_handle_t {};
struct _ze_device_handle_t {
  int index = 0;
  CUdevice cu = 0;
  CUcontext context = nullptr;
  CUmodule module = nullptr;  // the kernels below, loaded on first use
  CUfunction timestamp = nullptr;
  CUfunction host_copy = nullptr;
  std::mutex module_mutex;
};
struct _ze_command_list_handle_t {
  _ze_device_handle_t* device = nullptr;
  CUstream stream = nullptr;
};
struct _ze_event_pool_handle_t {
  uint32_t* words = nullptr;  // pinned, device-mapped: one per event
  uint32_t count = 0;
};
struct _ze_event_handle_t {
  _ze_event_pool_handle_t* pool = nullptr;
  uint32_t* word = nullptr;
};

// Everything below is hidden (the library exports only the table getters); the entry points are
// those ze_driver_calls.h declares.
namespace hetmesh_ze {

constexpr uint32_t kIpcMagic = 0x435a4f5a;  // "ZOZC"

struct Allocation {
  size_t size = 0;    // as asked
  size_t mapped = 0;  // reserved and mapped (device memory: a multiple of the granularity)
  ze_memory_type_t type = ZE_MEMORY_TYPE_UNKNOWN;
  _ze_device_handle_t* device = nullptr;
  CUmemGenericAllocationHandle handle = 0;
  int export_fd = -1;       // made by the first zeMemGetIpcHandle, closed by zeMemFree
  bool imported = false;    // mapped by zeMemOpenIpcHandle
  bool exportable = false;  // allocated with a dma-buf export descriptor
  int dmabuf_fd = -1;       // made by the first export query, closed by zeMemFree
};

struct Driver {
  _ze_driver_handle_t handle;
  _ze_context_handle_t context;
  std::vector<std::unique_ptr<_ze_device_handle_t>> devices;
  std::mutex mutex;  // the allocation table
  std::map<uintptr_t, Allocation> allocations;
};

Driver* g_driver = nullptr;
std::once_flag g_init_once;
ze_result_t g_init_result = ZE_RESULT_SUCCESS;

ze_result_t ze_error(CUresult r) {
  switch (r) {
    case CUDA_SUCCESS:
      return ZE_RESULT_SUCCESS;
    case CUDA_ERROR_NOT_READY:
      return ZE_RESULT_NOT_READY;
    case CUDA_ERROR_OUT_OF_MEMORY:
      return ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY;
    case CUDA_ERROR_INVALID_VALUE:
    case CUDA_ERROR_INVALID_HANDLE:
    case CUDA_ERROR_NOT_FOUND:
      return ZE_RESULT_ERROR_INVALID_ARGUMENT;
    case CUDA_ERROR_NOT_SUPPORTED:
      return ZE_RESULT_ERROR_UNSUPPORTED_FEATURE;
    case CUDA_ERROR_ILLEGAL_ADDRESS:
    case CUDA_ERROR_LAUNCH_FAILED:
    case CUDA_ERROR_ECC_UNCORRECTABLE:
      return ZE_RESULT_ERROR_DEVICE_LOST;
    case CUDA_ERROR_NO_DEVICE:
    case CUDA_ERROR_NOT_INITIALIZED:
      return ZE_RESULT_ERROR_UNINITIALIZED;
    default:
      return ZE_RESULT_ERROR_UNKNOWN;
  }
}

#define ZOC_TRY(call)                                                           \
  do {                                                                          \
    if (CUresult zoc_r = (call); zoc_r != CUDA_SUCCESS) return ze_error(zoc_r); \
  } while (0)

ze_result_t current(_ze_device_handle_t* d) {
  return ze_error(cuCtxSetCurrent(d->context));
}

size_t round_up(size_t n, size_t to) {
  return (n + to - 1) / to * to;
}

// The allocation containing `p`, or null; the table's lock is held by the caller.
std::map<uintptr_t, Allocation>::iterator find_locked(const void* p) {
  auto& table = g_driver->allocations;
  auto address = reinterpret_cast<uintptr_t>(p);
  auto it = table.upper_bound(address);
  if (it == table.begin()) return table.end();
  --it;
  return address < it->first + std::max<size_t>(it->second.mapped, 1) ? it : table.end();
}

bool known_device(ze_device_handle_t d) {
  if (g_driver == nullptr || d == nullptr) return false;
  for (auto& mine : g_driver->devices)
    if (mine.get() == d) return true;
  return false;
}

CUdeviceptr device_address(const void* p) {
  return reinterpret_cast<CUdeviceptr>(p);  // unified addressing: host-mapped memory included
}

// ---- driver, devices, context ----

ze_result_t ZE_APICALL Init(ze_init_flags_t flags) {
  if (flags != 0 && (flags & ZE_INIT_FLAG_GPU_ONLY) == 0) return ZE_RESULT_ERROR_UNINITIALIZED;
  std::call_once(g_init_once, [] {
    auto* driver = new Driver;
    int count = 0;
    CUresult r = cuInit(0);
    if (r == CUDA_SUCCESS) r = cuDeviceGetCount(&count);
    for (int i = 0; r == CUDA_SUCCESS && i < count; ++i) {
      auto device = std::make_unique<_ze_device_handle_t>();
      device->index = i;
      r = cuDeviceGet(&device->cu, i);
      if (r == CUDA_SUCCESS) r = cuDevicePrimaryCtxRetain(&device->context, device->cu);
      driver->devices.push_back(std::move(device));
    }
    g_init_result = ze_error(r);
    if (g_init_result == ZE_RESULT_SUCCESS && count == 0)
      g_init_result = ZE_RESULT_ERROR_UNINITIALIZED;
    g_driver = driver;  // never freed: the loader may call in while the process exits
  });
  return g_init_result;
}

ze_result_t ZE_APICALL DriverGet(uint32_t* count, ze_driver_handle_t* drivers) {
  if (count == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  if (g_driver == nullptr || g_init_result != ZE_RESULT_SUCCESS)
    return ZE_RESULT_ERROR_UNINITIALIZED;
  if (*count == 0 || drivers == nullptr) {
    *count = 1;
    return ZE_RESULT_SUCCESS;
  }
  *count = 1;
  drivers[0] = &g_driver->handle;
  return ZE_RESULT_SUCCESS;
}

bool our_driver(ze_driver_handle_t d) {
  return g_driver != nullptr && d == &g_driver->handle;
}

ze_result_t ZE_APICALL DriverGetApiVersion(ze_driver_handle_t d, ze_api_version_t* version) {
  if (!our_driver(d)) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (version == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  *version = ZE_API_VERSION_1_4;
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL DriverGetProperties(ze_driver_handle_t d, ze_driver_properties_t* p) {
  if (!our_driver(d)) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (p == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  std::memset(&p->uuid, 0, sizeof p->uuid);
  std::memcpy(p->uuid.id, "hetmesh-ze-cuda", 15);
  int version = 0;
  cuDriverGetVersion(&version);
  p->driverVersion = static_cast<uint32_t>(version);
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL DriverGetExtensionProperties(ze_driver_handle_t d, uint32_t* count,
                                                    ze_driver_extension_properties_t* out) {
  if (!our_driver(d)) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (count == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  const char* names[] = {ZE_PCI_PROPERTIES_EXT_NAME, HETMESH_ZE_MEMORY_SYNC_EXTENSION};
  constexpr uint32_t kCount = 2;
  if (*count == 0 || out == nullptr) {
    *count = kCount;
    return ZE_RESULT_SUCCESS;
  }
  *count = std::min(*count, kCount);
  for (uint32_t i = 0; i < *count; ++i) {
    std::memset(out[i].name, 0, sizeof out[i].name);
    std::strncpy(out[i].name, names[i], sizeof out[i].name - 1);
    out[i].version = 1;
  }
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL ContextCreate(ze_driver_handle_t d, const ze_context_desc_t* desc,
                                     ze_context_handle_t* out) {
  if (!our_driver(d)) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (desc == nullptr || out == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  *out = &g_driver->context;  // one context: CUDA's primary contexts are the process's anyway
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL ContextDestroy(ze_context_handle_t c) {
  return g_driver != nullptr && c == &g_driver->context ? ZE_RESULT_SUCCESS
                                                        : ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
}

bool our_context(ze_context_handle_t c) {
  return g_driver != nullptr && c == &g_driver->context;
}

ze_result_t ZE_APICALL DeviceGet(ze_driver_handle_t d, uint32_t* count, ze_device_handle_t* out) {
  if (!our_driver(d)) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (count == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  auto n = static_cast<uint32_t>(g_driver->devices.size());
  if (*count == 0 || out == nullptr) {
    *count = n;
    return ZE_RESULT_SUCCESS;
  }
  *count = std::min(*count, n);
  for (uint32_t i = 0; i < *count; ++i)
    out[i] = g_driver->devices[i].get();
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL DeviceGetProperties(ze_device_handle_t d, ze_device_properties_t* p) {
  if (!known_device(d)) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (p == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  void* next = p->pNext;
  ze_structure_type_t stype = p->stype;
  std::memset(p, 0, sizeof *p);
  p->stype = stype;
  p->pNext = next;
  p->type = ZE_DEVICE_TYPE_GPU;
  p->vendorId = 0x10de;  // what it really is; the plugin names Level Zero devices by their name
  char name[200] = {};
  cuDeviceGetName(name, sizeof name - 1, d->cu);
  std::snprintf(p->name, sizeof p->name, "%s (Level Zero on CUDA)", name);
  CUuuid uuid{};
  if (cuDeviceGetUuid(&uuid, d->cu) == CUDA_SUCCESS)
    std::memcpy(p->uuid.id, uuid.bytes, std::min(sizeof p->uuid.id, sizeof uuid.bytes));
  p->timerResolution = 1;  // ns per tick: %globaltimer counts nanoseconds
  p->timestampValidBits = 64;
  p->kernelTimestampValidBits = 64;
  p->maxMemAllocSize = UINT64_MAX;
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL DeviceGetMemoryProperties(ze_device_handle_t d, uint32_t* count,
                                                 ze_device_memory_properties_t* out) {
  if (!known_device(d)) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (count == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  if (*count == 0 || out == nullptr) {
    *count = 1;
    return ZE_RESULT_SUCCESS;
  }
  *count = 1;
  size_t total = 0;
  ZOC_TRY(cuDeviceTotalMem(&total, d->cu));
  out[0].totalSize = total;
  std::snprintf(out[0].name, sizeof out[0].name, "HBM");
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL DeviceGetCommandQueueGroupProperties(
    ze_device_handle_t d, uint32_t* count, ze_command_queue_group_properties_t* out) {
  if (!known_device(d)) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (count == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  // Ordinal 0 computes and copies, ordinal 1 only copies: both are CUDA streams here.
  constexpr uint32_t kGroups = 2;
  if (*count == 0 || out == nullptr) {
    *count = kGroups;
    return ZE_RESULT_SUCCESS;
  }
  *count = std::min(*count, kGroups);
  for (uint32_t i = 0; i < *count; ++i) {
    out[i].flags = ZE_COMMAND_QUEUE_GROUP_PROPERTY_FLAG_COPY;
    if (i == 0) out[i].flags |= ZE_COMMAND_QUEUE_GROUP_PROPERTY_FLAG_COMPUTE;
    out[i].maxMemoryFillPatternSize = 4;
    out[i].numQueues = 1;
  }
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL DeviceCanAccessPeer(ze_device_handle_t d, ze_device_handle_t peer,
                                           ze_bool_t* value) {
  if (!known_device(d) || !known_device(peer)) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (value == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  int can = d == peer ? 1 : 0;
  if (d != peer) ZOC_TRY(cuDeviceCanAccessPeer(&can, d->cu, peer->cu));
  *value = can != 0;
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL DevicePciGetPropertiesExt(ze_device_handle_t d, ze_pci_ext_properties_t* p) {
  if (!known_device(d)) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (p == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  int domain = 0, bus = 0, dev = 0;
  ZOC_TRY(cuDeviceGetAttribute(&domain, CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID, d->cu));
  ZOC_TRY(cuDeviceGetAttribute(&bus, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, d->cu));
  ZOC_TRY(cuDeviceGetAttribute(&dev, CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID, d->cu));
  p->address.domain = static_cast<uint32_t>(domain);
  p->address.bus = static_cast<uint32_t>(bus);
  p->address.device = static_cast<uint32_t>(dev);
  p->address.function = 0;
  return ZE_RESULT_SUCCESS;
}

// ---- memory ----

CUmemAllocationProp allocation_properties(const _ze_device_handle_t* d) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = d->index;
  return prop;
}

// Reserves an address range for `handle` and maps it, readable and writable by `d` and every
// device that can reach it.
ze_result_t map_handle(_ze_device_handle_t* d, CUmemGenericAllocationHandle handle, size_t bytes,
                       void** out) {
  CUdeviceptr va = 0;
  ZOC_TRY(cuMemAddressReserve(&va, bytes, 0, 0, 0));
  std::vector<CUmemAccessDesc> access;
  for (auto& other : g_driver->devices) {
    int can = other.get() == d ? 1 : 0;
    if (other.get() != d && cuDeviceCanAccessPeer(&can, other->cu, d->cu) != CUDA_SUCCESS) can = 0;
    if (can == 0) continue;
    CUmemAccessDesc a{};
    a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    a.location.id = other->index;
    a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    access.push_back(a);
  }
  CUresult r = cuMemMap(va, bytes, 0, handle, 0);
  if (r == CUDA_SUCCESS) {
    r = cuMemSetAccess(va, bytes, access.data(), access.size());
    if (r != CUDA_SUCCESS) cuMemUnmap(va, bytes);
  }
  if (r != CUDA_SUCCESS) {
    cuMemAddressFree(va, bytes);
    return ze_error(r);
  }
  *out = reinterpret_cast<void*>(va);
  return ZE_RESULT_SUCCESS;
}

void unmap_handle(void* ptr, size_t bytes) {
  auto va = reinterpret_cast<CUdeviceptr>(ptr);
  cuMemUnmap(va, bytes);
  cuMemAddressFree(va, bytes);
}

ze_result_t ZE_APICALL MemAllocDevice(ze_context_handle_t c, const ze_device_mem_alloc_desc_t* desc,
                                      size_t size, size_t alignment, ze_device_handle_t d,
                                      void** out) {
  if (!our_context(c) || !known_device(d)) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (desc == nullptr || out == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  if (size == 0) return ZE_RESULT_ERROR_UNSUPPORTED_SIZE;
  if (alignment & (alignment - 1)) return ZE_RESULT_ERROR_UNSUPPORTED_ALIGNMENT;
  bool exportable = false;
  if (ze_result_t r = export_request(desc->pNext, &exportable); r != ZE_RESULT_SUCCESS) return r;
  if (ze_result_t r = current(d); r != ZE_RESULT_SUCCESS) return r;
  CUmemAllocationProp prop = allocation_properties(d);
  // A dma-buf of VMM memory is for RDMA NICs: the allocation must be made for GPUDirect RDMA.
  if (exportable) prop.allocFlags.gpuDirectRDMACapable = 1;
  size_t granularity = 0;
  ZOC_TRY(cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  size_t bytes = round_up(size, std::max(granularity, alignment));
  CUmemGenericAllocationHandle handle = 0;
  ZOC_TRY(cuMemCreate(&handle, bytes, &prop, 0));
  void* ptr = nullptr;
  if (ze_result_t r = map_handle(d, handle, bytes, &ptr); r != ZE_RESULT_SUCCESS) {
    cuMemRelease(handle);
    return r;
  }
  Allocation a;
  a.size = size;
  a.mapped = bytes;
  a.type = ZE_MEMORY_TYPE_DEVICE;
  a.device = d;
  a.handle = handle;
  a.exportable = exportable;
  std::lock_guard lock(g_driver->mutex);
  g_driver->allocations[reinterpret_cast<uintptr_t>(ptr)] = a;
  *out = ptr;
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL MemAllocHost(ze_context_handle_t c, const ze_host_mem_alloc_desc_t* desc,
                                    size_t size, size_t alignment, void** out) {
  if (!our_context(c)) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (desc == nullptr || out == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  if (size == 0) return ZE_RESULT_ERROR_UNSUPPORTED_SIZE;
  if ((alignment & (alignment - 1)) || alignment > 65536u)
    return ZE_RESULT_ERROR_UNSUPPORTED_ALIGNMENT;
  if (ze_result_t r = current(g_driver->devices[0].get()); r != ZE_RESULT_SUCCESS) return r;
  void* ptr = nullptr;  // page-aligned
  ZOC_TRY(cuMemHostAlloc(&ptr, size, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP));
  Allocation a;
  a.size = size;
  a.mapped = size;
  a.type = ZE_MEMORY_TYPE_HOST;
  std::lock_guard lock(g_driver->mutex);
  g_driver->allocations[reinterpret_cast<uintptr_t>(ptr)] = a;
  *out = ptr;
  return ZE_RESULT_SUCCESS;
}

// Frees what the allocation holds; the table's entry is already gone.
ze_result_t release(void* ptr, const Allocation& a) {
  if (a.type == ZE_MEMORY_TYPE_HOST) return ze_error(cuMemFreeHost(ptr));
  if (ze_result_t r = current(a.device); r != ZE_RESULT_SUCCESS) return r;
  unmap_handle(ptr, a.mapped);
  if (a.export_fd >= 0) close(a.export_fd);
  if (a.dmabuf_fd >= 0) close(a.dmabuf_fd);
  return ze_error(cuMemRelease(a.handle));
}

ze_result_t ZE_APICALL MemFree(ze_context_handle_t c, void* ptr) {
  if (!our_context(c)) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (ptr == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  Allocation a;
  {
    std::lock_guard lock(g_driver->mutex);
    auto it = g_driver->allocations.find(reinterpret_cast<uintptr_t>(ptr));
    if (it == g_driver->allocations.end() || it->second.imported)
      return ZE_RESULT_ERROR_INVALID_ARGUMENT;
    a = it->second;
    g_driver->allocations.erase(it);
  }
  return release(ptr, a);
}

ze_result_t ZE_APICALL MemGetAllocProperties(ze_context_handle_t c, const void* ptr,
                                             ze_memory_allocation_properties_t* p,
                                             ze_device_handle_t* device) {
  if (!our_context(c)) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (ptr == nullptr || p == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  std::lock_guard lock(g_driver->mutex);
  auto it = find_locked(ptr);
  p->type = ZE_MEMORY_TYPE_UNKNOWN;
  p->id = 0;
  p->pageSize = 0;
  if (device != nullptr) *device = nullptr;
  if (it == g_driver->allocations.end()) return ZE_RESULT_SUCCESS;
  // The dma-buf of memory allocated exportable, kept by the driver as Intel's keeps its fd.
  ze_external_memory_export_fd_t* out = nullptr;
  if (ze_result_t r = export_fd_request(p, &out); r != ZE_RESULT_SUCCESS) return r;
  if (out != nullptr) {
    Allocation& a = it->second;
    if (!a.exportable) return ZE_RESULT_ERROR_INVALID_ARGUMENT;
    if (a.dmabuf_fd < 0) {
      if (ze_result_t r = current(a.device); r != ZE_RESULT_SUCCESS) return r;
      int fd = -1;
      ZOC_TRY(cuMemGetHandleForAddressRange(&fd, static_cast<CUdeviceptr>(it->first), a.mapped,
                                            CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0));
      a.dmabuf_fd = fd;
    }
    out->fd = a.dmabuf_fd;
  }
  p->type = it->second.type;
  p->id = it->first;
  p->pageSize = it->second.type == ZE_MEMORY_TYPE_DEVICE ? it->second.mapped : 4096;
  if (device != nullptr) *device = it->second.device;
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL MemGetAddressRange(ze_context_handle_t c, const void* ptr, void** base,
                                          size_t* size) {
  if (!our_context(c)) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (ptr == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  std::lock_guard lock(g_driver->mutex);
  auto it = find_locked(ptr);
  if (it == g_driver->allocations.end()) return ZE_RESULT_ERROR_INVALID_ARGUMENT;
  if (base != nullptr) *base = reinterpret_cast<void*>(it->first);
  if (size != nullptr) *size = it->second.size;
  return ZE_RESULT_SUCCESS;
}

// The handle: the exporter's fd in bytes 0-3 (as Intel's driver puts its dma-buf fd there), the
// mapped size in 8-15, the magic in 16-19.
struct IpcBytes {
  int32_t fd;
  uint32_t reserved;
  uint64_t mapped;
  uint32_t magic;
};
static_assert(sizeof(IpcBytes) <= ZE_MAX_IPC_HANDLE_SIZE);

ze_result_t ZE_APICALL MemGetIpcHandle(ze_context_handle_t c, const void* ptr,
                                       ze_ipc_mem_handle_t* out) {
  if (!our_context(c)) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (ptr == nullptr || out == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  std::lock_guard lock(g_driver->mutex);
  auto it = find_locked(ptr);
  if (it == g_driver->allocations.end() || it->second.type != ZE_MEMORY_TYPE_DEVICE ||
      it->second.imported)
    return ZE_RESULT_ERROR_INVALID_ARGUMENT;
  Allocation& a = it->second;
  if (a.export_fd < 0) {
    int fd = -1;
    ZOC_TRY(
        cuMemExportToShareableHandle(&fd, a.handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    a.export_fd = fd;
  }
  IpcBytes bytes{a.export_fd, 0, a.mapped, kIpcMagic};
  std::memset(out->data, 0, sizeof out->data);
  std::memcpy(out->data, &bytes, sizeof bytes);
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL MemOpenIpcHandle(ze_context_handle_t c, ze_device_handle_t d,
                                        ze_ipc_mem_handle_t handle, ze_ipc_memory_flags_t,
                                        void** out) {
  if (!our_context(c) || !known_device(d)) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (out == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  IpcBytes bytes;
  std::memcpy(&bytes, handle.data, sizeof bytes);
  if (bytes.magic != kIpcMagic || bytes.fd < 0 || bytes.mapped == 0 ||
      bytes.mapped > (uint64_t{1} << 40))
    return ZE_RESULT_ERROR_INVALID_ARGUMENT;
  if (ze_result_t r = current(d); r != ZE_RESULT_SUCCESS) return r;
  CUmemGenericAllocationHandle imported = 0;
  ZOC_TRY(cuMemImportFromShareableHandle(&imported,
                                         reinterpret_cast<void*>(static_cast<intptr_t>(bytes.fd)),
                                         CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
  void* ptr = nullptr;
  if (ze_result_t r = map_handle(d, imported, bytes.mapped, &ptr); r != ZE_RESULT_SUCCESS) {
    cuMemRelease(imported);
    return r;
  }
  Allocation a;
  a.size = bytes.mapped;
  a.mapped = bytes.mapped;
  a.type = ZE_MEMORY_TYPE_DEVICE;
  a.device = d;
  a.handle = imported;
  a.imported = true;
  std::lock_guard lock(g_driver->mutex);
  g_driver->allocations[reinterpret_cast<uintptr_t>(ptr)] = a;
  *out = ptr;
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL MemCloseIpcHandle(ze_context_handle_t c, const void* ptr) {
  if (!our_context(c)) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (ptr == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  Allocation a;
  {
    std::lock_guard lock(g_driver->mutex);
    auto it = g_driver->allocations.find(reinterpret_cast<uintptr_t>(ptr));
    if (it == g_driver->allocations.end() || !it->second.imported)
      return ZE_RESULT_ERROR_INVALID_ARGUMENT;
    a = it->second;
    g_driver->allocations.erase(it);
  }
  return release(const_cast<void*>(ptr), a);
}

// ---- events: words in pinned, device-mapped host memory ----

ze_result_t ZE_APICALL EventPoolCreate(ze_context_handle_t c, const ze_event_pool_desc_t* desc,
                                       uint32_t, ze_device_handle_t*, ze_event_pool_handle_t* out) {
  if (!our_context(c)) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (desc == nullptr || out == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  if (desc->count == 0) return ZE_RESULT_ERROR_INVALID_SIZE;
  if (desc->flags & (ZE_EVENT_POOL_FLAG_IPC | ZE_EVENT_POOL_FLAG_KERNEL_TIMESTAMP))
    return ZE_RESULT_ERROR_UNSUPPORTED_FEATURE;
  if (ze_result_t r = current(g_driver->devices[0].get()); r != ZE_RESULT_SUCCESS) return r;
  auto pool = std::make_unique<_ze_event_pool_handle_t>();
  void* words = nullptr;
  ZOC_TRY(cuMemHostAlloc(&words, size_t{desc->count} * sizeof(uint32_t),
                         CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP));
  std::memset(words, 0, size_t{desc->count} * sizeof(uint32_t));
  pool->words = static_cast<uint32_t*>(words);
  pool->count = desc->count;
  *out = pool.release();
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL EventPoolDestroy(ze_event_pool_handle_t pool) {
  if (pool == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  cuMemFreeHost(pool->words);
  delete pool;
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL EventCreate(ze_event_pool_handle_t pool, const ze_event_desc_t* desc,
                                   ze_event_handle_t* out) {
  if (pool == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (desc == nullptr || out == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  if (desc->index >= pool->count) return ZE_RESULT_ERROR_INVALID_ARGUMENT;
  auto* event = new (std::nothrow) _ze_event_handle_t;
  if (event == nullptr) return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
  event->pool = pool;
  event->word = pool->words + desc->index;
  __atomic_store_n(event->word, 0u, __ATOMIC_RELEASE);
  *out = event;
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL EventDestroy(ze_event_handle_t event) {
  if (event == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  delete event;
  return ZE_RESULT_SUCCESS;
}

bool signaled(ze_event_handle_t event) {
  return __atomic_load_n(event->word, __ATOMIC_ACQUIRE) != 0;
}

ze_result_t ZE_APICALL EventHostSynchronize(ze_event_handle_t event, uint64_t timeout_ns) {
  if (event == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  auto start = std::chrono::steady_clock::now();
  for (uint32_t spins = 0; !signaled(event); ++spins) {
    if (timeout_ns != UINT64_MAX &&
        std::chrono::steady_clock::now() - start >= std::chrono::nanoseconds(timeout_ns))
      return ZE_RESULT_NOT_READY;
    if (spins < 1000)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL EventQueryStatus(ze_event_handle_t event) {
  if (event == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  return signaled(event) ? ZE_RESULT_SUCCESS : ZE_RESULT_NOT_READY;
}

ze_result_t ZE_APICALL EventHostSignal(ze_event_handle_t event) {
  if (event == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  __atomic_store_n(event->word, 1u, __ATOMIC_RELEASE);
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL EventHostReset(ze_event_handle_t event) {
  if (event == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  __atomic_store_n(event->word, 0u, __ATOMIC_RELEASE);
  return ZE_RESULT_SUCCESS;
}

// ---- kernels ----

// hm_ze_timestamp: one thread stores %globaltimer (ns) at dst. hm_ze_host_copy: copies n bytes
// between device-mapped host buffers, a byte per thread and step. PTX the driver compiles for the
// GPU it runs on.
constexpr char kKernelsPtx[] = R"(
.version 7.0
.target sm_70
.address_size 64
.visible .entry hm_ze_timestamp(.param .u64 dst)
{
  .reg .b64 %rd<3>;
  ld.param.u64 %rd1, [dst];
  mov.u64 %rd2, %globaltimer;
  st.u64 [%rd1], %rd2;
  ret;
}
.visible .entry hm_ze_host_copy(.param .u64 dst, .param .u64 src, .param .u64 n)
{
  .reg .pred %p;
  .reg .b32 %r<6>;
  .reg .b64 %rd<9>;
  ld.param.u64 %rd1, [dst];
  ld.param.u64 %rd2, [src];
  ld.param.u64 %rd3, [n];
  mov.u32 %r1, %ctaid.x;
  mov.u32 %r2, %ntid.x;
  mov.u32 %r3, %tid.x;
  mov.u32 %r4, %nctaid.x;
  cvt.u64.u32 %rd4, %r3;
  mad.wide.u32 %rd4, %r1, %r2, %rd4;
  mul.wide.u32 %rd5, %r4, %r2;
LOOP:
  setp.ge.u64 %p, %rd4, %rd3;
  @%p bra DONE;
  add.u64 %rd6, %rd2, %rd4;
  ld.u8 %r5, [%rd6];
  add.u64 %rd7, %rd1, %rd4;
  st.u8 [%rd7], %r5;
  add.u64 %rd4, %rd4, %rd5;
  bra LOOP;
DONE:
  ret;
}
)";

ze_result_t load_kernels(_ze_device_handle_t* d) {
  std::lock_guard lock(d->module_mutex);
  if (d->module == nullptr) {
    CUmodule module = nullptr;
    ZOC_TRY(cuModuleLoadData(&module, kKernelsPtx));
    if (cuModuleGetFunction(&d->timestamp, module, "hm_ze_timestamp") != CUDA_SUCCESS ||
        cuModuleGetFunction(&d->host_copy, module, "hm_ze_host_copy") != CUDA_SUCCESS) {
      cuModuleUnload(module);
      return ZE_RESULT_ERROR_UNKNOWN;
    }
    d->module = module;
  }
  return ZE_RESULT_SUCCESS;
}

ze_result_t launch_host_copy(ze_command_list_handle_t list, void* dst, const void* src,
                             size_t size) {
  if (ze_result_t r = load_kernels(list->device); r != ZE_RESULT_SUCCESS) return r;
  CUdeviceptr to = device_address(dst), from = device_address(src);
  uint64_t n = size;
  void* params[] = {&to, &from, &n};
  constexpr unsigned kThreads = 256;
  auto blocks = static_cast<unsigned>(std::min<uint64_t>((n + kThreads - 1) / kThreads, 1024));
  ZOC_TRY(cuLaunchKernel(list->device->host_copy, blocks, 1, 1, kThreads, 1, 1, 0, list->stream,
                         params, nullptr));
  return ZE_RESULT_SUCCESS;
}

// ---- command lists: CUDA streams ----

ze_result_t ZE_APICALL CommandListCreateImmediate(ze_context_handle_t c, ze_device_handle_t d,
                                                  const ze_command_queue_desc_t* desc,
                                                  ze_command_list_handle_t* out) {
  if (!our_context(c) || !known_device(d)) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (desc == nullptr || out == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  if (desc->ordinal > 1 || desc->index != 0) return ZE_RESULT_ERROR_INVALID_ARGUMENT;
  if (ze_result_t r = current(d); r != ZE_RESULT_SUCCESS) return r;
  auto list = std::make_unique<_ze_command_list_handle_t>();
  list->device = d;
  ZOC_TRY(cuStreamCreate(&list->stream, CU_STREAM_NON_BLOCKING));
  *out = list.release();
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL CommandListDestroy(ze_command_list_handle_t list) {
  if (list == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (ze_result_t r = current(list->device); r != ZE_RESULT_SUCCESS) return r;
  // CUDA lets the stream's pending work finish after the destroy returns.
  cuStreamDestroy(list->stream);
  delete list;
  return ZE_RESULT_SUCCESS;
}

// Makes the list's device current and enqueues its waits.
ze_result_t begin(ze_command_list_handle_t list, uint32_t waits, ze_event_handle_t* events) {
  if (list == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (waits > 0 && events == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  if (ze_result_t r = current(list->device); r != ZE_RESULT_SUCCESS) return r;
  for (uint32_t i = 0; i < waits; ++i) {
    if (events[i] == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
    ZOC_TRY(cuStreamWaitValue32(list->stream, device_address(events[i]->word), 1,
                                CU_STREAM_WAIT_VALUE_EQ));
  }
  return ZE_RESULT_SUCCESS;
}

// Signals `event` once the list's work so far is done (CUDA's write orders it after).
ze_result_t finish(ze_command_list_handle_t list, ze_event_handle_t event) {
  if (event == nullptr) return ZE_RESULT_SUCCESS;
  return ze_error(cuStreamWriteValue32(list->stream, device_address(event->word), 1, 0));
}

// Both ends in host memory of this driver (zeMemAllocHost): CUDA would copy host to host on the
// calling thread once the stream got there (its host-to-host copies are synchronous), which
// deadlocks a caller that releases the stream only after enqueueing; Intel's copy is asynchronous.
bool host_to_host(const void* dst, const void* src, size_t size) {
  std::lock_guard lock(g_driver->mutex);
  for (const void* p : {dst, src}) {
    auto it = find_locked(p);
    if (it == g_driver->allocations.end() || it->second.type != ZE_MEMORY_TYPE_HOST ||
        reinterpret_cast<uintptr_t>(p) + size > it->first + it->second.size)
      return false;
  }
  return true;
}

ze_result_t ZE_APICALL CommandListAppendMemoryCopy(ze_command_list_handle_t list, void* dst,
                                                   const void* src, size_t size,
                                                   ze_event_handle_t signal, uint32_t waits,
                                                   ze_event_handle_t* events) {
  if (dst == nullptr || src == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  if (ze_result_t r = begin(list, waits, events); r != ZE_RESULT_SUCCESS) return r;
  if (size > 0 && host_to_host(dst, src, size)) {
    if (ze_result_t r = launch_host_copy(list, dst, src, size); r != ZE_RESULT_SUCCESS) return r;
  } else if (size > 0) {
    ZOC_TRY(cuMemcpyAsync(device_address(dst), device_address(src), size, list->stream));
  }
  return finish(list, signal);
}

ze_result_t ZE_APICALL CommandListAppendMemoryFill(ze_command_list_handle_t list, void* ptr,
                                                   const void* pattern, size_t pattern_size,
                                                   size_t size, ze_event_handle_t signal,
                                                   uint32_t waits, ze_event_handle_t* events) {
  if (ptr == nullptr || pattern == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  if (pattern_size != 1) return ZE_RESULT_ERROR_UNSUPPORTED_SIZE;  // all the plugin needs
  if (ze_result_t r = begin(list, waits, events); r != ZE_RESULT_SUCCESS) return r;
  if (size > 0)
    ZOC_TRY(cuMemsetD8Async(device_address(ptr), *static_cast<const uint8_t*>(pattern), size,
                            list->stream));
  return finish(list, signal);
}

ze_result_t ZE_APICALL CommandListAppendBarrier(ze_command_list_handle_t list,
                                                ze_event_handle_t signal, uint32_t waits,
                                                ze_event_handle_t* events) {
  if (ze_result_t r = begin(list, waits, events); r != ZE_RESULT_SUCCESS) return r;
  return finish(list, signal);  // a stream is in order: nothing else to hold
}

ze_result_t ZE_APICALL CommandListAppendSignalEvent(ze_command_list_handle_t list,
                                                    ze_event_handle_t event) {
  if (event == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (ze_result_t r = begin(list, 0, nullptr); r != ZE_RESULT_SUCCESS) return r;
  return finish(list, event);
}

ze_result_t ZE_APICALL CommandListAppendWaitOnEvents(ze_command_list_handle_t list, uint32_t count,
                                                     ze_event_handle_t* events) {
  return begin(list, count, events);
}

ze_result_t ZE_APICALL CommandListAppendEventReset(ze_command_list_handle_t list,
                                                   ze_event_handle_t event) {
  if (event == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (ze_result_t r = begin(list, 0, nullptr); r != ZE_RESULT_SUCCESS) return r;
  return ze_error(cuStreamWriteValue32(list->stream, device_address(event->word), 0, 0));
}

ze_result_t ZE_APICALL CommandListAppendWriteGlobalTimestamp(ze_command_list_handle_t list,
                                                             uint64_t* dst,
                                                             ze_event_handle_t signal,
                                                             uint32_t waits,
                                                             ze_event_handle_t* events) {
  if (dst == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  if (ze_result_t r = begin(list, waits, events); r != ZE_RESULT_SUCCESS) return r;
  if (ze_result_t r = load_kernels(list->device); r != ZE_RESULT_SUCCESS) return r;
  CUdeviceptr address = device_address(dst);
  void* params[] = {&address};
  ZOC_TRY(
      cuLaunchKernel(list->device->timestamp, 1, 1, 1, 1, 1, 1, 0, list->stream, params, nullptr));
  return finish(list, signal);
}

// ---- Intel's experimental memory waits and writes ----

ze_result_t wait_flags(const zex_wait_on_mem_desc_t* desc, unsigned* flags) {
  if (desc == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  switch (desc->actionFlag) {
    case ZEX_WAIT_ON_MEMORY_FLAG_EQUAL:
      *flags = CU_STREAM_WAIT_VALUE_EQ;
      return ZE_RESULT_SUCCESS;
    case ZEX_WAIT_ON_MEMORY_FLAG_GREATER_THAN_EQUAL:
      *flags = CU_STREAM_WAIT_VALUE_GEQ;  // cyclic here, unsigned on Intel's hardware
      return ZE_RESULT_SUCCESS;
    default:  // CUDA has no NOT_EQUAL, GREATER_THAN or LESSER_THAN*
      return ZE_RESULT_ERROR_UNSUPPORTED_ENUMERATION;
  }
}

ze_result_t ZE_APICALL wait_on_memory(ze_command_list_handle_t list, zex_wait_on_mem_desc_t* desc,
                                      void* ptr, uint32_t data, ze_event_handle_t signal) {
  unsigned flags = 0;
  if (ze_result_t r = wait_flags(desc, &flags); r != ZE_RESULT_SUCCESS) return r;
  if (ptr == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  if (ze_result_t r = begin(list, 0, nullptr); r != ZE_RESULT_SUCCESS) return r;
  ZOC_TRY(cuStreamWaitValue32(list->stream, device_address(ptr), data, flags));
  return finish(list, signal);
}

ze_result_t ZE_APICALL wait_on_memory64(ze_command_list_handle_t list, zex_wait_on_mem_desc_t* desc,
                                        void* ptr, uint64_t data, ze_event_handle_t signal) {
  unsigned flags = 0;
  if (ze_result_t r = wait_flags(desc, &flags); r != ZE_RESULT_SUCCESS) return r;
  if (ptr == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  if (ze_result_t r = begin(list, 0, nullptr); r != ZE_RESULT_SUCCESS) return r;
  ZOC_TRY(cuStreamWaitValue64(list->stream, device_address(ptr), data, flags));
  return finish(list, signal);
}

ze_result_t ZE_APICALL write_to_memory(ze_command_list_handle_t list, zex_write_to_mem_desc_t* desc,
                                       void* ptr, uint64_t data) {
  if (desc == nullptr || ptr == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  // As Intel's driver: always 8 bytes, whatever the value (ze_memory_sync.h).
  if (reinterpret_cast<uintptr_t>(ptr) % 8 != 0) return ZE_RESULT_ERROR_INVALID_ARGUMENT;
  if (ze_result_t r = begin(list, 0, nullptr); r != ZE_RESULT_SUCCESS) return r;
  ZOC_TRY(cuStreamWriteValue64(list->stream, device_address(ptr), data, 0));
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL DriverGetExtensionFunctionAddress(ze_driver_handle_t d, const char* name,
                                                         void** out) {
  if (!our_driver(d)) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (name == nullptr || out == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  if (std::strcmp(name, "zexCommandListAppendWaitOnMemory") == 0)
    *out = reinterpret_cast<void*>(&wait_on_memory);
  else if (std::strcmp(name, "zexCommandListAppendWaitOnMemory64") == 0)
    *out = reinterpret_cast<void*>(&wait_on_memory64);
  else if (std::strcmp(name, "zexCommandListAppendWriteToMemory") == 0)
    *out = reinterpret_cast<void*>(&write_to_memory);
  else
    return ZE_RESULT_ERROR_INVALID_ARGUMENT;
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL DriverGetIpcProperties(ze_driver_handle_t d, ze_driver_ipc_properties_t* p) {
  if (!our_driver(d)) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (p == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  p->flags = ZE_IPC_PROPERTY_FLAG_MEMORY;  // device memory only; events do not cross processes
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL DeviceGetSubDevices(ze_device_handle_t d, uint32_t* count,
                                           ze_device_handle_t*) {
  if (!known_device(d)) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (count == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  *count = 0;
  return ZE_RESULT_SUCCESS;
}

ze_result_t ZE_APICALL DeviceGetStatus(ze_device_handle_t d) {
  return known_device(d) ? ZE_RESULT_SUCCESS : ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
}

ze_result_t ZE_APICALL DeviceGetGlobalTimestamps(ze_device_handle_t d, uint64_t* host,
                                                 uint64_t* device) {
  if (!known_device(d)) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (host == nullptr || device == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  return ZE_RESULT_ERROR_UNSUPPORTED_FEATURE;  // the plugin does not ask; no host read of
                                               // %globaltimer
}

ze_result_t ZE_APICALL ContextGetStatus(ze_context_handle_t c) {
  return our_context(c) ? ZE_RESULT_SUCCESS : ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
}

}  // namespace hetmesh_ze
