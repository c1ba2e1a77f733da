// Running a child process with a deadline and capturing its output: plugin isolation probes, the
// CTS's cross-process IPC checks, the multi-process tests and the instances of a job.
//
// A child dies with its parent (SIGKILL through PR_SET_PDEATHSIG), so a launcher killed without
// warning leaves no instance behind. Linux sends that signal when the *thread* that started the
// child ends: start children from a thread that outlives them (the main thread, or the thread
// that waits for them). A child starts with no signal blocked, whatever its parent blocks.
#pragma once

#include <chrono>
#include <string>
#include <vector>

// Exported from the library, which hides every other symbol (core/README.md, "Exports").
#pragma GCC visibility push(default)

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

// A running child process with pipes to its stdin and stdout (stderr is inherited): the peer in
// multi-process tests and demos. Destroying it kills the child if it still runs.
class ChildProcess {
 public:
  explicit ChildProcess(const std::vector<std::string>& argv);
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  int pid() const { return pid_; }
  // Writes `text` to the child's stdin; throws Error if it exited.
  void write(const std::string& text);
  // The next line of the child's stdout, without the newline; throws Error(TIMEOUT), or
  // Error(kStatusPeerLost) if the child closed its stdout.
  std::string read_line(std::chrono::milliseconds timeout);
  void kill(int signal);
  // Waits for the exit; on timeout kills the child with SIGKILL and reports timed_out.
  ProcessResult wait(std::chrono::milliseconds timeout);

 private:
  int pid_ = -1;
  int stdin_ = -1;
  int stdout_ = -1;
  std::string buffered_;
  bool reaped_ = false;
};

// Path of the running executable.
std::string self_executable();

}  // namespace hetmesh

#pragma GCC visibility pop
