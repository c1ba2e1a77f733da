// Shareable host memory backed by memfd: the IPC and dma-buf mechanism of host-memory devices.
//
// An IPC handle names (exporter pid, fd number, size); the importer opens /proc/<pid>/fd/<fd>,
// which works between processes of the same user without a socket to pass the descriptor.
#pragma once

#include "status.hpp"

#include <fcntl.h>
#include <linux/udmabuf.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cerrno>
#include <cstring>

namespace hm::kit {

inline uint64_t page_size() {
  return static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

inline uint64_t round_up(uint64_t value, uint64_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}

// A memfd of `size` bytes (rounded up to pages), sealable so /dev/udmabuf accepts it.
inline int create_memfd(const char* name, uint64_t size) {
  int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) fail(HM_ERR_OUT_OF_MEMORY, "memfd_create failed: %s", std::strerror(errno));
  if (ftruncate(fd, static_cast<off_t>(round_up(size, page_size()))) != 0) {
    int err = errno;
    close(fd);
    fail(HM_ERR_OUT_OF_MEMORY, "ftruncate(memfd, %llu) failed: %s",
         static_cast<unsigned long long>(size), std::strerror(err));
  }
  return fd;
}

// Maps `size` bytes of `fd` with `protection`.
inline void* map_memfd(int fd, uint64_t size, int protection) {
  void* p = mmap(nullptr, round_up(size, page_size()), protection, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED)
    fail(HM_ERR_OUT_OF_MEMORY, "mmap of %llu bytes failed: %s",
         static_cast<unsigned long long>(size), std::strerror(errno));
  return p;
}

inline void unmap(void* p, uint64_t size) {
  if (p != nullptr) munmap(p, round_up(size, page_size()));
}

// What a memfd-backed IPC handle carries.
struct MemfdHandle {
  uint32_t magic;  // identifies the exporting plugin
  uint32_t kind;   // hm_memory_kind of the exported allocation
  int32_t pid;
  int32_t fd;
  uint64_t size;
};
static_assert(sizeof(MemfdHandle) <= HM_IPC_HANDLE_BYTES);

inline hm_ipc_handle encode_handle(const MemfdHandle& h) {
  hm_ipc_handle handle{};
  std::memcpy(handle.bytes, &h, sizeof h);
  return handle;
}

inline MemfdHandle decode_handle(const hm_ipc_handle* handle, uint32_t magic) {
  if (handle == nullptr) fail(HM_ERR_INVALID_ARGUMENT, "handle is NULL");
  MemfdHandle h;
  std::memcpy(&h, handle->bytes, sizeof h);
  if (h.magic != magic)
    fail(HM_ERR_INVALID_ARGUMENT, "handle was not exported by this plugin (magic %08x)", h.magic);
  if (h.size == 0 || h.pid <= 0 || h.fd < 0)
    fail(HM_ERR_INVALID_ARGUMENT, "handle is malformed (pid %d, fd %d, size %llu)", h.pid, h.fd,
         static_cast<unsigned long long>(h.size));
  return h;
}

// Opens the exporter's memfd through procfs. Fails clearly if the exporter is gone.
inline int open_peer_memfd(int32_t pid, int32_t peer_fd) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/fd/%d", pid, peer_fd);
  int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0)
    fail(errno == ENOENT ? HM_ERR_INVALID_ARGUMENT : HM_ERR_BACKEND,
         "cannot open %s (exporting process gone or not permitted): %s", path,
         std::strerror(errno));
  return fd;
}

inline int open_peer_memfd(const MemfdHandle& h) {
  return open_peer_memfd(h.pid, h.fd);
}

// dma-buf through /dev/udmabuf, which wraps sealed memfd pages. Absent on many kernels.
inline bool udmabuf_available() {
  return access("/dev/udmabuf", R_OK | W_OK) == 0;
}

inline int export_udmabuf(int memfd, uint64_t offset, uint64_t size) {
  if (offset % page_size() != 0 || size % page_size() != 0 || size == 0)
    fail(HM_ERR_INVALID_ARGUMENT, "dma-buf range (offset %llu, size %llu) is not page-aligned",
         static_cast<unsigned long long>(offset), static_cast<unsigned long long>(size));
  // udmabuf requires the memfd to be sealed against shrinking.
  if (fcntl(memfd, F_ADD_SEALS, F_SEAL_SHRINK) != 0 && errno != EPERM)
    fail(HM_ERR_BACKEND, "sealing memfd for udmabuf failed: %s", std::strerror(errno));
  int device = open("/dev/udmabuf", O_RDWR | O_CLOEXEC);
  if (device < 0) fail(HM_ERR_NOT_SUPPORTED, "/dev/udmabuf: %s", std::strerror(errno));
  udmabuf_create create{};
  create.memfd = static_cast<uint32_t>(memfd);
  create.flags = UDMABUF_FLAGS_CLOEXEC;
  create.offset = offset;
  create.size = size;
  int fd = ioctl(device, UDMABUF_CREATE, &create);
  int err = errno;
  close(device);
  if (fd < 0) fail(HM_ERR_BACKEND, "UDMABUF_CREATE failed: %s", std::strerror(err));
  return fd;
}

}  // namespace hm::kit
