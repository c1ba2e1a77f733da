#include <hetmesh/core/error.hpp>
#include <hetmesh/core/log.hpp>
#include <hetmesh/core/thread.hpp>

#include <fmt/format.h>

#include <cerrno>
#include <cstring>

namespace hetmesh {

const char* status_name(hm_status status) {
  switch (status) {
    case HM_OK:
      return "HM_OK";
    case HM_ERR_INVALID_ARGUMENT:
      return "HM_ERR_INVALID_ARGUMENT";
    case HM_ERR_NOT_SUPPORTED:
      return "HM_ERR_NOT_SUPPORTED";
    case HM_ERR_OUT_OF_MEMORY:
      return "HM_ERR_OUT_OF_MEMORY";
    case HM_ERR_DEVICE_LOST:
      return "HM_ERR_DEVICE_LOST";
    case HM_ERR_NOT_READY:
      return "HM_ERR_NOT_READY";
    case HM_ERR_TIMEOUT:
      return "HM_ERR_TIMEOUT";
    case HM_ERR_INVALID_HANDLE:
      return "HM_ERR_INVALID_HANDLE";
    case HM_ERR_UNINITIALIZED:
      return "HM_ERR_UNINITIALIZED";
    case HM_ERR_BACKEND:
      return "HM_ERR_BACKEND";
    case HM_ERR_INTERNAL:
      return "HM_ERR_INTERNAL";
    case kStatusPeerLost:
      return "PEER_LOST";
    case kStatusProtocolError:
      return "PROTOCOL_ERROR";
    case kStatusJobFailed:
      return "JOB_FAILED";
    case kStatusNotAuthorized:
      return "NOT_AUTHORIZED";
    case kStatusClosed:
      return "CLOSED";
    default:
      return "HM_STATUS_UNKNOWN";
  }
}

std::string describe_errno(int error) {
  std::string text = std::strerror(error);
  switch (error) {
    case EMFILE:
      return text + " (this process is out of file descriptors: raise its limit, ulimit -n)";
    case ENFILE:
      return text + " (the system is out of file descriptors: raise fs.file-max, or close some)";
    case ENOMEM:
      return text + " (out of memory)";
    default:
      return text;
  }
}

void throw_thread_start_failed(const char* name, const std::system_error& e) {
  throw Error(HM_ERR_OUT_OF_MEMORY,
              fmt::format("cannot start thread {}: {} (this process is out of threads, or of "
                          "address space for a thread's stack: check ulimit -u and ulimit -v, "
                          "and the machine's free memory)",
                          name, e.code().message()));
}

void thread_escaped(const char* name, const char* what) noexcept {
  const char* why = what != nullptr ? what : "an exception that is not a std::exception";
  log(LogLevel::error,
      "thread {} ended on an error its code did not handle: {}; what it served has stopped (a bug "
      "of hetmesh's: please report it with this line)",
      name, why);
}

}  // namespace hetmesh
