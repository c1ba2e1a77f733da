// The comm thread and thread pinning (comm_thread.hpp).
#include "comm_thread.hpp"

#include <hetmesh/core/log.hpp>
#include <hetmesh/core/thread.hpp>

#include <pthread.h>

#include <cstring>

namespace hetmesh::afd {

void pin_thread(std::thread& thread, int cpu, const char* what) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (int rc = pthread_setaffinity_np(thread.native_handle(), sizeof set, &set); rc != 0)
    log(LogLevel::warn, "cannot pin {} to CPU {}: {}", what, cpu, std::strerror(rc));
}

CommThread::CommThread(const std::vector<int>& cpus, std::function<void()> step)
    : thread_(start_thread("hm-comm", [this, step = std::move(step)] {
        while (!stopping_.load(std::memory_order_acquire))
          step();
      })) {
  if (!cpus.empty()) pin_thread(thread_, cpus.front(), "the comm thread");
}

CommThread::~CommThread() {
  stop();
}

void CommThread::stop() {
  stopping_.store(true, std::memory_order_release);
  if (thread_.joinable()) thread_.join();
}

}  // namespace hetmesh::afd
