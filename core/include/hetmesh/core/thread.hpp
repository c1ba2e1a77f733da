// Starting the library's threads: a failure says which thread and why, as an hetmesh::Error.
#pragma once

#include <hetmesh/core/error.hpp>

#include <pthread.h>

#include <exception>
#include <string>
#include <system_error>
#include <thread>
#include <utility>

#pragma GCC visibility push(default)
namespace hetmesh {

// What a thread that could not start says: Error(OUT_OF_MEMORY) naming the thread and what to
// check, in place of std::system_error's bare "Resource temporarily unavailable".
[[noreturn]] void throw_thread_start_failed(const char* name, const std::system_error& e);

// The last resort of a thread whose code let an exception out (`what`, or nullptr for one that is
// not a std::exception): says so at error level naming the thread, where std::thread would call
// std::terminate and take the whole process (an application) down. The thread ends; what it served
// stops, and its users' bounded waits say so. Each thread's own code handles what it expects.
void thread_escaped(const char* name, const char* what) noexcept;

// A new thread running fn(), named `name` (at most 15 characters: what top and gdb show). Where
// the process cannot start one (out of threads or of address space for its stack: ulimit -u,
// ulimit -v, the machine's memory), throws as throw_thread_start_failed. An exception fn lets out
// ends the thread through thread_escaped, never the process.
template <typename Fn>
std::thread start_thread(const char* name, Fn&& fn) {
  try {
    return std::thread([name, fn = std::forward<Fn>(fn)]() mutable {
      pthread_setname_np(pthread_self(), name);
      try {
        fn();
      } catch (const std::exception& e) {
        thread_escaped(name, e.what());
      } catch (...) {
        thread_escaped(name, nullptr);
      }
    });
  } catch (const std::system_error& e) {
    throw_thread_start_failed(name, e);
  }
}

}  // namespace hetmesh
#pragma GCC visibility pop
