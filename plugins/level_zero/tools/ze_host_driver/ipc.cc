// IPC of device memory, the way Intel's driver does it: the 64-byte handle starts with a file
// descriptor of the allocation (here its memfd; Intel's, a dma-buf), valid in the process that
// called zeMemGetIpcHandle. The importer must first bring that descriptor into its own process
// (pidfd_getfd, or a unix socket) and write its own number into the handle's first 4 bytes, as the
// level_zero plugin does; zeMemOpenIpcHandle then maps the allocation from the caller's descriptor
// (which stays the caller's to close). The rest of the handle (magic, version, size, the
// exporter's per-process nonce, the allocation's serial) lets the importer check that the
// descriptor is this driver's memfd of that allocation (its name carries nonce and serial) and of
// that size. A handle is treated as hostile: anything malformed is INVALID_ARGUMENT, never a crash.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstring>
#include <string>

#include "state.h"

namespace hetmesh_ze {
namespace {

constexpr uint64_t kIpcMagic = 0x3143504945'5a4d48ull;  // "HMZEIPC1" read little-endian
constexpr uint32_t kIpcVersion = 1;

struct IpcWire {
  int32_t fd;  // first, as in Intel's handles
  uint32_t version;
  uint64_t magic;
  uint64_t size;
  uint64_t nonce;
  uint64_t serial;
  uint8_t zero[24];
};
static_assert(sizeof(IpcWire) == ZE_MAX_IPC_HANDLE_SIZE);

// The target of a /proc/.../fd/N link, or "" when it cannot be read.
std::string link_target(const std::string& path) {
  char buffer[PATH_MAX];
  ssize_t n = readlink(path.c_str(), buffer, sizeof(buffer) - 1);
  if (n <= 0) return {};
  return std::string(buffer, static_cast<size_t>(n));
}

bool well_formed(const IpcWire& wire) {
  if (wire.magic != kIpcMagic || wire.version != kIpcVersion || wire.fd < 0) return false;
  if (wire.size == 0 || wire.size > kDeviceMemoryBytes) return false;
  if (wire.nonce == 0 || wire.serial == 0) return false;
  for (uint8_t b : wire.zero) {
    if (b != 0) return false;
  }
  return true;
}

}  // namespace

uint64_t process_nonce() {
  static const uint64_t nonce = [] {
    uint64_t value = 0;
    while (value == 0) {
      if (getrandom(&value, sizeof(value), 0) != static_cast<ssize_t>(sizeof(value))) {
        value = static_cast<uint64_t>(now_ns()) ^ (static_cast<uint64_t>(getpid()) << 32);
      }
    }
    return value;
  }();
  return nonce;
}

ze_result_t ZE_APICALL MemGetIpcHandle(ze_context_handle_t context, const void* ptr,
                                       ze_ipc_mem_handle_t* handle) {
  return guarded([&] {
    if (auto r = check_context(context); r != ZE_RESULT_SUCCESS) return r;
    if (ptr == nullptr || handle == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    auto alloc = find_allocation(ptr);
    // Device allocations made here; the handle names the whole allocation (open returns its base).
    if (!alloc || alloc->kind != AllocKind::kDevice) return ZE_RESULT_ERROR_INVALID_ARGUMENT;
    IpcWire wire{};
    wire.magic = kIpcMagic;
    wire.version = kIpcVersion;
    wire.fd = alloc->fd;
    wire.size = alloc->size;
    wire.nonce = process_nonce();
    wire.serial = alloc->serial;
    std::memset(handle->data, 0, sizeof(handle->data));
    std::memcpy(handle->data, &wire, sizeof(wire));
    return ZE_RESULT_SUCCESS;
  });
}

ze_result_t ZE_APICALL MemOpenIpcHandle(ze_context_handle_t context,
                                        ze_device_handle_t device_handle,
                                        ze_ipc_mem_handle_t handle, ze_ipc_memory_flags_t flags,
                                        void** ptr) {
  return guarded([&] {
    if (auto r = check_context(context); r != ZE_RESULT_SUCCESS) return r;
    Device* device = nullptr;
    if (auto r = check_device(device_handle, device); r != ZE_RESULT_SUCCESS) return r;
    if (ptr == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    if ((flags & ~static_cast<ze_ipc_memory_flags_t>(ZE_IPC_MEMORY_FLAG_BIAS_CACHED |
                                                     ZE_IPC_MEMORY_FLAG_BIAS_UNCACHED)) != 0) {
      return ZE_RESULT_ERROR_INVALID_ENUMERATION;
    }
    IpcWire wire;
    std::memcpy(&wire, handle.data, sizeof(wire));
    if (!well_formed(wire)) return ZE_RESULT_ERROR_INVALID_ARGUMENT;

    // The caller's descriptor, duplicated: the driver keeps its own.
    const int fd = fcntl(wire.fd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0) return ZE_RESULT_ERROR_INVALID_ARGUMENT;
    auto alloc = std::make_shared<Allocation>();
    alloc->fd = fd;  // closed by ~Allocation on every path below
    alloc->kind = AllocKind::kIpcImported;
    // What is mapped is what was checked: the caller's number could name anything.
    const std::string expected = "/memfd:" + memfd_name(wire.nonce, wire.serial) + " (deleted)";
    if (link_target("/proc/self/fd/" + std::to_string(fd)) != expected) {
      return ZE_RESULT_ERROR_INVALID_ARGUMENT;
    }
    struct stat st {};
    const size_t mapped = (wire.size + page_size() - 1) / page_size() * page_size();
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ||
        static_cast<uint64_t>(st.st_size) != mapped) {
      return ZE_RESULT_ERROR_INVALID_ARGUMENT;
    }
    alloc->size = wire.size;
    alloc->mapped = mapped;
    alloc->device = device;
    alloc->context = context;
    alloc->serial = next_serial();
    alloc->base = map_view(fd, mapped, PROT_NONE, 0);
    alloc->rw = map_view(fd, mapped, PROT_READ | PROT_WRITE, 0);
    if (alloc->base == nullptr || alloc->rw == nullptr) return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
    *ptr = alloc->base;
    register_allocation(std::move(alloc));
    return ZE_RESULT_SUCCESS;
  });
}

ze_result_t ZE_APICALL MemCloseIpcHandle(ze_context_handle_t context, const void* ptr) {
  return guarded([&] {
    if (auto r = check_context(context); r != ZE_RESULT_SUCCESS) return r;
    if (ptr == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    auto alloc = find_allocation(ptr);
    if (!alloc || alloc->base != ptr || alloc->kind != AllocKind::kIpcImported) {
      return ZE_RESULT_ERROR_INVALID_ARGUMENT;
    }
    // Unmapped once no pending command uses it any more.
    return unregister_allocation(ptr) ? ZE_RESULT_SUCCESS : ZE_RESULT_ERROR_INVALID_ARGUMENT;
  });
}

}  // namespace hetmesh_ze
