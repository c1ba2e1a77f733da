// The level_zero plugin's IPC calls for the kit's GPU layer (hetmesh/plugin_kit/gpu_ipc.hpp has
// the slots): Level Zero IPC handles for device memory. Pinned memory (zeMemAllocHost) has no
// memfd behind it, so the kit refuses to export it (README.md).
//
// A handle's first 4 bytes are a file descriptor in the exporting process (Intel's driver puts
// its dma-buf fd there; the spec leaves the handle opaque, and
// zeMemGetFileDescriptorFromIpcHandleExp came only in 1.6). The importer fetches that descriptor
// with pidfd_getfd (or, where ptrace rules forbid it, through /proc/<pid>/fd, which works for
// files that can be opened again), writes its own number in its place, opens the handle and
// closes its copy: the driver has imported the memory by then.
#include "level_zero_slots.hpp"

#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

namespace hm::level_zero {

namespace {

// The exporter's descriptor `fd` of process `pid`, as a descriptor here; fails naming both ways.
int fetch_descriptor(int32_t pid, int32_t fd) {
  int pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  int getfd_error = errno;
  if (pidfd >= 0) {
    int ours = static_cast<int>(syscall(SYS_pidfd_getfd, pidfd, fd, 0));
    getfd_error = errno;
    close(pidfd);
    if (ours >= 0) return ours;
  }
  std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd);
  int ours = open(path.c_str(), O_RDWR | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);  // never a tty
  if (ours >= 0) return ours;
  hm::kit::fail(HM_ERR_INVALID_ARGUMENT,
                "cannot reach descriptor %d of the exporting process %d: pidfd_getfd: %s; open "
                "%s: %s",
                fd, pid, std::strerror(getfd_error), path.c_str(), std::strerror(errno));
}

}  // namespace

void Vendor::ipc_get(IpcNative* native, void* base) {
  HM_ZE(zeMemGetIpcHandle, device_state(DeviceScope::current()).driver->context, base,
        &native->handle);
  native->pid = static_cast<int32_t>(getpid());
}

void* Vendor::ipc_open(const IpcNative& native, Allocation* a) {
  const DeviceState& d = device_state(DeviceScope::current());
  int32_t theirs = -1;
  std::memcpy(&theirs, native.handle.data, sizeof theirs);
  if (native.pid <= 0 || theirs < 0)
    hm::kit::fail(HM_ERR_INVALID_ARGUMENT, "malformed Level Zero IPC handle (pid %d, fd %d)",
                  native.pid, theirs);
  int ours = fetch_descriptor(native.pid, theirs);
  ze_ipc_mem_handle_t local = native.handle;
  std::memcpy(local.data, &ours, sizeof ours);
  void* result = nullptr;
  ze_result_t opened = ze().zeMemOpenIpcHandle(d.driver->context, d.handle, local, 0, &result);
  close(ours);
  check(opened, "zeMemOpenIpcHandle");
  a->device_address = reinterpret_cast<uintptr_t>(result);
  return result;
}

void Vendor::ipc_close(void* ptr) {
  HM_ZE(zeMemCloseIpcHandle, device_state(DeviceScope::current()).driver->context, ptr);
}

}  // namespace hm::level_zero
