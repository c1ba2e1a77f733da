// IPC: HIP IPC handles for device memory, the exporter's memfd for pinned memory.
#include "rocm_memory.hpp"
#include "slots.hpp"

#include <hetmesh/plugin_kit/memfd.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace hm::rocm {

using hm::kit::fail;
using hm::kit::guarded;

namespace {

constexpr uint32_t kIpcMagic = 0x4d434f52;  // "ROCM"
constexpr uint16_t kIpcVersion = 1;

struct IpcHandle {
  uint32_t magic;         // kIpcMagic
  uint16_t version;       // kIpcVersion
  uint16_t kind;          // HM_MEM_DEVICE or HM_MEM_PINNED_HOST
  int32_t pid;            // the exporting process
  int32_t fd;             // pinned: the exporter's memfd
  uint64_t nonce;         // the exporter's State::nonce
  uint64_t size;          // bytes of the exported allocation
  int32_t device;         // the exporter's device
  uint32_t reserved;      // 0
  hipIpcMemHandle_t hip;  // device memory: hipIpcGetMemHandle
};
static_assert(sizeof(IpcHandle) <= HM_IPC_HANDLE_BYTES);

IpcHandle decode(const hm_ipc_handle* handle) {
  IpcHandle h;
  std::memcpy(&h, handle->bytes, sizeof h);
  if (h.magic != kIpcMagic)
    fail(HM_ERR_INVALID_ARGUMENT, "handle was not exported by the rocm plugin (magic %08x)",
         h.magic);
  if (h.version != kIpcVersion)
    fail(HM_ERR_INVALID_ARGUMENT, "handle version %u, this plugin reads %u", h.version,
         kIpcVersion);
  if ((h.kind != HM_MEM_DEVICE && h.kind != HM_MEM_PINNED_HOST) || h.size == 0 || h.pid <= 0 ||
      (h.kind == HM_MEM_PINNED_HOST && h.fd < 0))
    fail(HM_ERR_INVALID_ARGUMENT, "handle is malformed (kind %u, size %llu, pid %d)", h.kind,
         static_cast<unsigned long long>(h.size), h.pid);
  return h;
}

// Maps and registers the exporter's memfd, named through /proc/<pid>/fd/<fd>.
void* open_pinned(int32_t device, const IpcHandle& h, Allocation* a) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/fd/%d", h.pid, h.fd);
  int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0)
    fail(errno == ENOENT ? HM_ERR_INVALID_ARGUMENT : HM_ERR_BACKEND,
         "cannot open %s (exporting process gone or not permitted): %s", path,
         std::strerror(errno));
  a->fd = fd;
  a->host = true;
  a->mapped = hm::kit::round_up(h.size, hm::kit::page_size());
  void* result = nullptr;
  try {
    result = hm::kit::map_memfd(fd, h.size, PROT_READ | PROT_WRITE);
    register_host_range(device, result, a->mapped);
  } catch (...) {
    hm::kit::unmap(result, h.size);
    close(fd);
    throw;
  }
  return result;
}

}  // namespace

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
      DeviceScope scope(a.device);
      HM_HIP(hipIpcGetMemHandle, &h.hip, reinterpret_cast<void*>(hit->base));
    } else {
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
    require(device_state(device), HM_CAP_IPC, "IPC");
    IpcHandle h = decode(handle);
    if (h.pid == static_cast<int32_t>(getpid()) && h.nonce == s.nonce)
      fail(HM_ERR_NOT_SUPPORTED,
           "the handle was exported by this process; use the exported pointer directly");
    Allocation a;
    a.size = h.size;
    a.kind = HM_MEM_IPC_MAPPED;
    a.device = device;
    void* result = nullptr;
    if (h.kind == HM_MEM_DEVICE) {
      DeviceScope scope(device);
      HM_HIP(hipIpcOpenMemHandle, &result, h.hip, hipIpcMemLazyEnablePeerAccess);
    } else {
      result = open_pinned(device, h, &a);
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
    DeviceScope scope(a.device);
    if (a.host)
      release_memfd_mapping(ptr, a);
    else
      HM_HIP(hipIpcCloseMemHandle, ptr);
  });
}

}  // namespace hm::rocm
