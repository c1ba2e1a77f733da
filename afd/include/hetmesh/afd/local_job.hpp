// The instances a launcher starts on this host, each a child process, and how they stop: on the
// first failure, a stopped instance, a signal to the launcher, or the job's time limit; and
// replacing one mid-run. The building block of Launcher (launcher.hpp), for callers that start
// processes of their own making (tests, `bench faults`).
#pragma once

#include <hetmesh/afd/instance.hpp>
#include <hetmesh/core/subprocess.hpp>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

// Exported from the library, which hides every other symbol (core/README.md, "Exports").
#pragma GCC visibility push(default)

namespace hetmesh::afd {

// While one lives, SIGINT and SIGTERM no longer end this process at once: they are recorded, a
// LocalJob's wait() forwards them to its instances and stops the job, and the caller cleans up
// (its temporary folder) and ends with 128 + signal(). A second signal kills the instances at
// once. The previous handlers come back when it is destroyed. One at a time per process.
class InterruptGuard {
 public:
  InterruptGuard();
  ~InterruptGuard();
  InterruptGuard(const InterruptGuard&) = delete;
  InterruptGuard& operator=(const InterruptGuard&) = delete;
  // The first SIGINT or SIGTERM received, or 0.
  static int signal();

 private:
  struct sigaction previous_[2];
};

// Removes a job's temporary folder (and everything in it) when it goes out of scope: after
// success, a failure, an exception or an interruption alike.
class FolderRemover {
 public:
  explicit FolderRemover(std::filesystem::path folder) : folder_(std::move(folder)) {}
  ~FolderRemover();
  FolderRemover(const FolderRemover&) = delete;
  FolderRemover& operator=(const FolderRemover&) = delete;

 private:
  std::filesystem::path folder_;
};

// An instance of a LocalJob that did not exit with 0.
struct InstanceFailure {
  std::string role;
  int rank = 0;
  ProcessResult result;
  // It stopped after another instance's failure (exit status kExitAfterAnotherFailure).
  bool after_another = false;
  std::string reason;  // why the launcher killed it, if it did
  // "ffn:0 failed (exit code 1)", "attention:1 failed (timed out and was killed)"
  std::string describe() const;
};

// The instances started on this host, each a child process of this executable that runs `command`
// (the subcommand and its options, e.g. {"demo", "--config", FILE}) followed by
//   --role ROLE --rank N --store ADDRESS --out DIR
// and then the instance's own arguments. The children die with this process (subprocess.hpp).
class LocalJob {
 public:
  // `job` is the job's rendezvous id, for reading its published failure.
  LocalJob(std::vector<std::string> command, std::string store, std::string out,
           std::string job = "hetmesh");

  // Starts one instance. Its stdout is read through the returned process, or, with `on_line`,
  // by wait(), which hands each line to on_line as it comes. stderr is this process's.
  ChildProcess& start(const std::string& role, int rank, const std::vector<std::string>& extra = {},
                      std::function<void(const std::string&)> on_line = {});

  // Waits until every instance has exited, and returns those that failed; empty when every one
  // exited with 0. It stops the job early:
  //   - on the first failure: it is published through the store for the instance, unless the
  //     instance did (a crash, or killed here), so the others stop as after their own rendezvous
  //     failure; they get 100 ms to end on their own (their failures are then reported too), then
  //     are killed with SIGKILL, stopped (SIGSTOP) ones included; those killed are not among the
  //     failures;
  //   - when an instance stays stopped (SIGSTOP) for longer than `stopped_limit`: it is killed
  //     and fails, then as above;
  //   - on SIGINT or SIGTERM (with an InterruptGuard alive): the signal is forwarded to every
  //     instance (with SIGCONT, for stopped ones), which get 1 s to end before SIGKILL; none is
  //     reported (see interrupted());
  //   - at `limit`: those still running are killed and fail as timed out.
  // For instances not waited for one by one through their ChildProcess.
  std::vector<InstanceFailure> wait(std::chrono::milliseconds limit,
                                    std::chrono::milliseconds stopped_limit);
  std::vector<InstanceFailure> wait(std::chrono::milliseconds limit) { return wait(limit, limit); }

  // Kills instance (role, rank) with SIGKILL and, once it is dead, starts a new process in its
  // place with the same arguments and output handler: a replacement, which rejoins the running
  // job under a new epoch (docs/failures.md). The instance it replaces is no failure. Safe to call
  // from an on_line handler; done at wait()'s next turn. Returns the instances replaced so far.
  void replace(const std::string& role, int rank);
  int replaced() const { return replaced_; }

  // The signal that interrupted wait(), or 0.
  int interrupted() const { return interrupted_; }

  // What to tell the user about `failures`, one line each: every root cause (the instances that
  // failed on their own), or, when every failure here came after another's (on another host),
  // the job's first failure as published through the store; then how many stopped after it.
  std::vector<std::string> explain(const std::vector<InstanceFailure>& failures) const;

 private:
  struct Instance {
    std::string role;
    int rank;
    std::vector<std::string> extra;
    std::unique_ptr<ChildProcess> process;
    std::function<void(const std::string&)> on_line;
    bool output_open = true;
    bool reaped = false;
    std::optional<std::chrono::steady_clock::time_point> stopped_since;
  };
  void read_output(Instance& instance, bool until_closed);
  void start_replacements();
  void publish_failure(const Instance& instance, const InstanceFailure& failure);
  std::vector<std::string> command_;
  std::string store_, out_, job_;
  std::vector<Instance> instances_;
  int interrupted_ = 0;
  bool failure_published_ = false;
  std::vector<std::pair<std::string, int>> replace_;  // requested, not yet done
  int replaced_ = 0;
};

}  // namespace hetmesh::afd

#pragma GCC visibility pop
