// Shareable host memory backed by memfd: the IPC and dma-buf mechanism of host-memory devices.
//
// An IPC handle names (exporter pid, fd number, size); the importer opens /proc/<pid>/fd/<fd>,
// which works between processes of the same user without a socket to pass the descriptor. A
// handle is a peer's bytes, so the importer opens only what the kit itself exported: a memfd
// named "hetmesh-<pid>-..." after the process the handle names, of exactly the size it names, and
// sealed against shrinking (so its pages cannot vanish under a mapping).
// Anything else (a regular file, a FIFO, a device, another program's memfd) is refused before
// it is mapped, and never opened if its name already says it is not the kit's.
#pragma once

#include "status.hpp"

#include <fcntl.h>
#include <linux/udmabuf.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

namespace hm::kit {

inline uint64_t page_size() {
  return static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

inline uint64_t round_up(uint64_t value, uint64_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}

// The name of the kit's memfds in process `pid` begins with this.
inline std::string memfd_prefix(int32_t pid) {
  return "hetmesh-" + std::to_string(pid) + "-";
}

// A memfd of `size` bytes (rounded up to pages), sealable so /dev/udmabuf accepts it, named
// after this process and `what`.
inline int create_memfd(const char* what, uint64_t size) {
  std::string name = memfd_prefix(getpid()) + what;
  int fd = memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) fail(HM_ERR_OUT_OF_MEMORY, "memfd_create failed: %s", std::strerror(errno));
  if (ftruncate(fd, static_cast<off_t>(round_up(size, page_size()))) != 0) {
    int err = errno;
    close(fd);
    fail(HM_ERR_OUT_OF_MEMORY, "ftruncate(memfd, %llu) failed: %s",
         static_cast<unsigned long long>(size), std::strerror(err));
  }
  // Sealed against shrinking: an importer's mapping can then never lose its pages under it
  // (SIGBUS), and /dev/udmabuf accepts it.
  if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) != 0) {
    int err = errno;
    close(fd);
    fail(HM_ERR_BACKEND, "sealing the memfd against shrinking failed: %s", std::strerror(err));
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

// Where a descriptor leads ("/memfd:hetmesh-42-pinned (deleted)"); empty if unreadable.
inline std::string link_target(const char* path) {
  char target[256];
  ssize_t n = readlink(path, target, sizeof target - 1);
  return n > 0 ? std::string(target, static_cast<size_t>(n)) : std::string();
}

// Why `fd` is not a memfd that the kit made in process `pid` with `size` bytes; null if it is.
inline const char* not_the_kits_memfd(int fd, int32_t pid, uint64_t size) {
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) return "it is not a memfd";
  int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0) return "it is a file, not a memfd";
  if ((seals & F_SEAL_SHRINK) == 0) return "it is not sealed against shrinking";
  char self[64];
  std::snprintf(self, sizeof self, "/proc/self/fd/%d", fd);
  if (link_target(self).rfind("/memfd:" + memfd_prefix(pid), 0) != 0)
    return "it is a memfd that the kit did not make in that process";
  if (static_cast<uint64_t>(st.st_size) != round_up(size, page_size()))
    return "its size is not the size the handle names";
  return nullptr;
}

// Opens the memfd `peer_fd` of process `pid` through procfs, if it is the kit's and holds `size`
// bytes. Fails clearly if the exporter is gone, and refuses anything else.
inline int open_peer_memfd(int32_t pid, int32_t peer_fd, uint64_t size) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/fd/%d", pid, peer_fd);
  // Opening can act (a FIFO blocks, a device may do anything): refuse what is not ours by name
  // first, then check what was opened, since the peer's descriptor may change in between.
  std::string target = link_target(path);
  if (target.empty())
    fail(errno == ENOENT ? HM_ERR_INVALID_ARGUMENT : HM_ERR_BACKEND,
         "cannot read %s (exporting process gone or not permitted): %s", path,
         std::strerror(errno));
  if (target.rfind("/memfd:" + memfd_prefix(pid), 0) != 0)
    fail(HM_ERR_INVALID_ARGUMENT, "handle refused: %s leads to %s, not to memory the kit exported",
         path, target.c_str());
  int fd = open(path, O_RDWR | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0)
    fail(errno == ENOENT ? HM_ERR_INVALID_ARGUMENT : HM_ERR_BACKEND,
         "cannot open %s (exporting process gone or not permitted): %s", path,
         std::strerror(errno));
  if (const char* wrong = not_the_kits_memfd(fd, pid, size)) {
    close(fd);
    fail(HM_ERR_INVALID_ARGUMENT, "handle refused: %s: %s", path, wrong);
  }
  return fd;
}

inline int open_peer_memfd(const MemfdHandle& h) {
  return open_peer_memfd(h.pid, h.fd, h.size);
}

// dma-buf through /dev/udmabuf, which wraps sealed memfd pages. Absent on many kernels.
inline bool udmabuf_available() {
  return access("/dev/udmabuf", R_OK | W_OK) == 0;
}

inline int export_udmabuf(int memfd, uint64_t offset, uint64_t size) {
  if (offset % page_size() != 0 || size % page_size() != 0 || size == 0)
    fail(HM_ERR_INVALID_ARGUMENT, "dma-buf range (offset %llu, size %llu) is not page-aligned",
         static_cast<unsigned long long>(offset), static_cast<unsigned long long>(size));
  // udmabuf requires the memfd to be sealed against shrinking (create_memfd did).
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
