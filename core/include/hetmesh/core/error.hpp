// Errors in the C++ core: every failure is a hetmesh::Error carrying an hm_status and a message
// that says what was wrong and where. Library code never aborts; callers catch Error.
#pragma once

#include <hetmesh/device_plugin.h>

#include <stdexcept>
#include <string>

// Exported from the library, which hides every other symbol (core/README.md, "Exports").
#pragma GCC visibility push(default)

namespace hetmesh {

// Statuses the core adds to the plugin ABI's, numbered from 1000 so they never collide.
constexpr hm_status kStatusPeerLost = 1000;       // a transport peer died, closed or misbehaved
constexpr hm_status kStatusProtocolError = 1001;  // a peer sent something malformed
constexpr hm_status kStatusJobFailed = 1002;  // another instance of the job failed (rendezvous.hpp)
constexpr hm_status kStatusNotAuthorized = 1003;  // a peer refused: this side lacks the job secret
constexpr hm_status kStatusClosed = 1004;  // the engine was finished or closed during the call

// "HM_ERR_TIMEOUT" etc.; "HM_STATUS_<n>" for codes this build does not know.
const char* status_name(hm_status status);

// strerror(error), and where the process ran out of something, what to do:
//   EMFILE  "Too many open files (this process is out of file descriptors: raise its limit,
//           ulimit -n)"
//   ENFILE  "... (the system is out of file descriptors)"
//   ENOMEM  "Cannot allocate memory (out of memory)"
// For the message of a failed system call that names what it was creating and for whom.
std::string describe_errno(int error);

class Error : public std::runtime_error {
 public:
  Error(hm_status status, const std::string& message)
      : std::runtime_error(message), status_(status) {}
  hm_status status() const { return status_; }

 private:
  hm_status status_;
};

}  // namespace hetmesh

#pragma GCC visibility pop
