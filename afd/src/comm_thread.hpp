// The engine's comm thread, which polls the transport and runs the peer group's turns, and
// pinning an engine's threads to the CPUs the job gives them.
#pragma once

#include <atomic>
#include <functional>
#include <thread>
#include <vector>

namespace hetmesh::afd {

// Pins `thread` to `cpu`; logs a warning if that fails.
void pin_thread(std::thread& thread, int cpu, const char* what);

// A thread that runs `step` until stopped: the engine's comm loop, which polls the transport.
// Pinned to spec.comm_cpus[0] if given.
class CommThread {
 public:
  CommThread(const std::vector<int>& cpus, std::function<void()> step);
  ~CommThread();
  void stop();

 private:
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

}  // namespace hetmesh::afd
