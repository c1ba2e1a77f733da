// Launching a job on this host: which instances of a job one `hetmesh demo` or `hetmesh bench afd`
// invocation starts here, which rendezvous store they meet at, and the child processes that run
// them. By default one invocation hosts the store and starts every instance; on several hosts, each
// host starts its share (`--instances`) and all but the store's host join it (`--store`). See
// docs/launching.md.
#pragma once

#include <hetmesh/afd/job.hpp>
#include <hetmesh/afd/job_config.hpp>
#include <hetmesh/core/rendezvous.hpp>
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

struct LocalInstances {
  std::vector<int> attention;  // ranks started here, ascending
  std::vector<int> ffn;
  bool everything(const JobConfig& config) const {
    return static_cast<int>(attention.size()) == config.job.attention &&
           static_cast<int>(ffn.size()) == config.job.ffn;
  }
};

// Parses `--instances` values: "attention" or "ffn" (every rank of the role), "attention:0,2",
// "ffn:1-3" (some ranks), "here" (the ranks whose [hosts] address is this machine's: one config
// for every host), one or several; none means every instance of the job. Throws
// Error(INVALID_ARGUMENT) naming a malformed value or a rank the job does not have.
LocalInstances parse_instances(const std::vector<std::string>& values, const JobConfig& config);

// Where the launcher places each of this host's instances (InstancePlace, job.hpp):
//  - CPUs (`pin`): an equal share of the CPUs this process may run on, of the instance's device's
//    NUMA node first (assign_cpus). "on", "off", or "auto", which pins only where every instance
//    gets at least 4 CPUs (its comm thread, a sender per peer, the caller) and the job's
//    [affinity] names none;
//  - the RDMA NIC, for an instance whose [hosts] NIC is "auto": the nearest to its device, the
//    host's instances before it counted, so that equally near NICs are shared out evenly
//    (assign_nics); an instance left to itself would take the nearest alone.
// Attention ranks first, then ffn, as `local` lists them. Throws Error(INVALID_ARGUMENT) for
// another `pin`.
struct InstancePlaces {
  std::vector<InstancePlace> attention, ffn;
  // The arguments that hand the index-th attention (or ffn) instance of `local` its place
  // ("--cpus 4,5,6,7 --nic mlx5_1"), none when it has none.
  std::vector<std::string> args(bool attention_role, size_t index) const;
  // "attention 0: CPUs 0-3, NIC mlx5_0; ffn 0: CPUs 4-7" for the instances of `local`; "" when
  // none is placed.
  std::string describe(const LocalInstances& local) const;
};
InstancePlaces place_instances(const JobConfig& config, const LocalInstances& local,
                               const std::string& pin);

// The store of an invocation: hosted here (at the config's [rendezvous] address) unless `join`
// names one to connect to, or that address is another machine's (one config for every host: the
// store's host hosts it, every other joins it), or the store is etcd; and the job's secret. The
// secret is the config's [rendezvous] secret_file, or the one this process was handed
// (HETMESH_JOB_SECRET_FILE); else a store hosted here makes one, in a 0600 file in `folder`. Its
// file is then named in this process's HETMESH_JOB_SECRET_FILE, which the instances it starts
// inherit (never their command lines).
class JobStore {
 public:
  // `whole_job`: this invocation starts every instance of the job. Throws Error(INVALID_ARGUMENT)
  // when the job needs a secret file that it does not name: a store reachable from other hosts,
  // or etcd with the job split over invocations.
  JobStore(const JobConfig& config, const std::string& join, bool whole_job,
           const std::filesystem::path& folder);
  const std::string& address() const { return address_; }
  bool hosted() const { return static_cast<bool>(server_); }
  // The job secret's file ("" when the job has none: a store joined without one).
  const std::string& secret_file() const { return secret_file_; }

 private:
  std::unique_ptr<TcpStoreServer> server_;
  std::string address_;
  std::string secret_file_;
};

// "here: attention 0,1, ffn none; rendezvous store HOST:PORT (hosted here)": what an invocation
// that starts part of a job says first, so that the other hosts' invocations can join it.
std::string describe_share(const LocalInstances& local, const JobStore& store);

// Exit status of an instance that stopped because another instance of the job failed first: its
// error is that one's, already reported, so the launcher does not count it as a root cause.
constexpr int kExitAfterAnotherFailure = 3;

// Who an instance is, for its failure report.
struct InstanceIdentity {
  std::string store;  // the job's store, "host:port"
  std::string job;    // the job's rendezvous id (EngineSpec::job)
  std::string role;   // "attention" or "ffn"
  int rank = 0;
  std::chrono::milliseconds timeout{10000};  // the job's timeout: bounds reaching the store
};

// Runs an instance's body (what `--role` runs in a child of a LocalJob) and returns its exit
// status. When body throws, the instance reports why, once for the whole job: the job's first
// failure is published through the store (Rendezvous::report_failure), which ends the others'
// rendezvous waits within a fraction of a second, printed on stderr as
//   hetmesh: error: ROLE:RANK on HOST pid PID: MESSAGE
// and 1 is returned. An instance that failed after another had published its failure (its error
// is a consequence, e.g. Error(kStatusJobFailed)) prints nothing more and returns
// kExitAfterAnotherFailure.
int run_instance(const InstanceIdentity& who, const std::function<int()>& body);

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
