// Running a child process with a deadline and capturing its output: plugin isolation probes, the
// CTS's cross-process IPC checks and the multi-process tests.
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace hetmesh {

struct ProcessResult {
  bool timed_out = false;  // killed with SIGKILL at the deadline
  int exit_code = -1;      // valid when signal == 0 and !timed_out
  int signal = 0;          // the signal that ended it, or 0
  std::string out;         // stdout
  std::string err;         // stderr
  // "exit code 3", "signal 11 (Segmentation fault)", "timed out after 1000 ms"
  std::string describe() const;
};

// Runs argv[0] (a path) with `input` on stdin. Throws Error only if it cannot be started.
ProcessResult run_process(const std::vector<std::string>& argv, std::chrono::milliseconds timeout,
                          const std::string& input = {});

// Path of the running executable.
std::string self_executable();

}  // namespace hetmesh
