// The IPC and dma-buf slots of the cuda plugin: device memory through cuIpc*MemHandle, pinned
// memory through its memfd (/proc/<pid>/fd/<fd>), and dma-buf fds for RDMA NICs.
#include "cuda_slots.hpp"
#include "cuda_state.hpp"

#include <hetmesh/plugin_kit/memfd.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <optional>

namespace hm::cuda {

constexpr uint32_t kIpcMagic = 0x41445543;  // "CUDA"
constexpr uint16_t kIpcVersion = 1;

// ---- slots: IPC ----

namespace {

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

}  // namespace hm::cuda
