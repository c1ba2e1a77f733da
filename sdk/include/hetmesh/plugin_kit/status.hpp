// Turning C++ failures into hm_status values at the ABI boundary.
//
// Wrap the body of every exported slot in hm::kit::guarded("slot_name", [&] { ... }). Inside it,
// throw hm::kit::Failure (via fail()) for expected errors; any other exception becomes
// HM_ERR_INTERNAL or HM_ERR_OUT_OF_MEMORY. Nothing escapes into the host.
#pragma once

#include <hetmesh/device_plugin.h>

#include <cstdio>
#include <exception>
#include <new>
#include <string>
#include <system_error>
#include <type_traits>
#include <utility>

namespace hm::kit {

// The calling thread's last error, returned by the plugin's last_error slot. A fixed buffer, not a
// std::string: the C library registers a thread_local's destructor at its first use, and glibc
// ends the process ("failed to register TLS destructor: out of memory") when that registration
// cannot allocate, as when a thread's first failure is running out of memory; recording one must
// not allocate either.
inline constexpr size_t kLastErrorBytes = 1024;

inline char* last_error_buffer() {
  thread_local char message[kLastErrorBytes] = {};
  return message;
}

inline const char* last_error() {
  return last_error_buffer();
}

// printf-style into `buffer`, cut to fit; a format without arguments is taken as it is (a '%' in
// a message passed alone is not a conversion).
template <typename... Args>
void format_into(char* buffer, size_t bytes, const char* format, Args... args) {
  if constexpr (sizeof...(Args) == 0) {
    std::snprintf(buffer, bytes, "%s", format);
  } else {
    std::snprintf(buffer, bytes, format, args...);
  }
}

// Records the thread's last error (printf-style; cut at kLastErrorBytes - 1 bytes).
template <typename... Args>
void set_last_error(const char* format, Args... args) {
  format_into(last_error_buffer(), kLastErrorBytes, format, args...);
}

// An expected failure with a status code, thrown inside guarded().
struct Failure {
  hm_status status;
  std::string message;
};

template <typename... Args>
[[noreturn]] void fail(hm_status status, const char* format, Args... args) {
  char buffer[512];
  format_into(buffer, sizeof buffer, format, args...);
  throw Failure{status, buffer};
}

// Runs `body` (which returns void or hm_status) and maps whatever it throws to a status, recording
// "<slot>: <reason>" as the thread's last error.
template <typename Body>
hm_status guarded(const char* slot, Body&& body) noexcept {
  try {
    if constexpr (std::is_same_v<decltype(body()), void>) {
      body();
      return HM_OK;
    } else {
      return body();
    }
  } catch (const Failure& failure) {
    set_last_error("%s: %s", slot, failure.message.c_str());
    return failure.status;
  } catch (const std::bad_alloc&) {
    set_last_error("%s: out of host memory", slot);
    return HM_ERR_OUT_OF_MEMORY;
  } catch (const std::system_error& e) {
    // A thread that could not start (EAGAIN): out of threads or of address space for its stack.
    if (e.code() != std::errc::resource_unavailable_try_again) {
      set_last_error("%s: internal error: %s", slot, e.what());
      return HM_ERR_INTERNAL;
    }
    set_last_error(
        "%s: cannot start a thread: %s (out of threads, or of address space for a thread's stack)",
        slot, e.what());
    return HM_ERR_OUT_OF_MEMORY;
  } catch (const std::exception& e) {
    set_last_error("%s: internal error: %s", slot, e.what());
    return HM_ERR_INTERNAL;
  } catch (...) {
    set_last_error("%s: internal error: unknown exception", slot);
    return HM_ERR_INTERNAL;
  }
}

// Validates a caller-provided argument struct's struct_size.
template <typename T>
void require_struct(const T* arg, size_t known_size, const char* what) {
  if (arg == nullptr) fail(HM_ERR_INVALID_ARGUMENT, "%s is NULL", what);
  if (arg->struct_size < known_size)
    fail(HM_ERR_INVALID_ARGUMENT, "%s.struct_size is %zu, expected at least %zu", what,
         arg->struct_size, known_size);
}

}  // namespace hm::kit
