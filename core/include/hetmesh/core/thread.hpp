// Starting the library's threads: a failure says which thread and why, as an hetmesh::Error.
#pragma once

#include <hetmesh/core/error.hpp>

#include <pthread.h>

#include <string>
#include <system_error>
#include <thread>
#include <utility>

#pragma GCC visibility push(default)
namespace hetmesh {

// What a thread that could not start says: Error(OUT_OF_MEMORY) naming the thread and what to
// check, in place of std::system_error's bare "Resource temporarily unavailable".
[[noreturn]] void throw_thread_start_failed(const char* name, const std::system_error& e);

// A new thread running fn(), named `name` (at most 15 characters: what top and gdb show). Where
// the process cannot start one (out of threads or of address space for its stack: ulimit -u,
// ulimit -v, the machine's memory), throws as throw_thread_start_failed.
template <typename Fn>
std::thread start_thread(const char* name, Fn&& fn) {
  try {
    return std::thread([name, fn = std::forward<Fn>(fn)]() mutable {
      pthread_setname_np(pthread_self(), name);
      fn();
    });
  } catch (const std::system_error& e) {
    throw_thread_start_failed(name, e);
  }
}

}  // namespace hetmesh
#pragma GCC visibility pop
