// Launching a job on this host: which instances of a job one `hetmesh demo` or `hetmesh bench afd`
// invocation starts here, which rendezvous store they meet at, and the child processes that run
// them. By default one invocation hosts the store and starts every instance; on several hosts, each
// host starts its share (`--instances`) and all but the store's host join it (`--store`). See
// docs/launching.md.
#pragma once

#include <hetmesh/afd/job_config.hpp>
#include <hetmesh/core/rendezvous.hpp>
#include <hetmesh/core/subprocess.hpp>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

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
// "ffn:1-3" (some ranks), one or several; none means every instance of the job. Throws
// Error(INVALID_ARGUMENT) naming a malformed value or a rank the job does not have.
LocalInstances parse_instances(const std::vector<std::string>& values, const JobConfig& config);

// The store of an invocation: hosted here (at the config's [rendezvous] address) unless `join`
// names one to connect to.
class JobStore {
 public:
  JobStore(const JobConfig& config, const std::string& join);
  const std::string& address() const { return address_; }
  bool hosted() const { return static_cast<bool>(server_); }

 private:
  std::unique_ptr<TcpStoreServer> server_;
  std::string address_;
};

// An instance of a LocalJob that did not exit with 0.
struct InstanceFailure {
  std::string role;
  int rank = 0;
  ProcessResult result;
  // "ffn:0 failed (exit code 1)", "attention:1 failed (timed out and was killed)"
  std::string describe() const;
};

// The instances started on this host, each a child process of this executable that runs `command`
// (the subcommand and its options, e.g. {"demo", "--config", FILE}) followed by
//   --role ROLE --rank N --store ADDRESS --out DIR
// and then the instance's own arguments.
class LocalJob {
 public:
  LocalJob(std::vector<std::string> command, std::string store, std::string out);

  // Starts one instance. Its stdout is read through the returned process; stderr is this one's.
  ChildProcess& start(const std::string& role, int rank,
                      const std::vector<std::string>& extra = {});

  // Waits until every instance has exited, for at most `limit`; those still running then are
  // killed and fail as timed out. When one fails, the others are killed at once: they would only
  // wait for it until their own timeouts. Returns the instances that failed (the ones killed for
  // another's failure are not among them), empty when every one exited with 0. For instances not
  // waited for one by one through their ChildProcess.
  std::vector<InstanceFailure> wait(std::chrono::milliseconds limit);

 private:
  struct Instance {
    std::string role;
    int rank;
    std::unique_ptr<ChildProcess> process;
    bool reaped = false;
  };
  std::vector<std::string> command_;
  std::string store_, out_;
  std::vector<Instance> instances_;
};

}  // namespace hetmesh::afd
