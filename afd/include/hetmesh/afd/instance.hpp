// One instance of a job, in the process that runs it: what it runs on (the config's plugins, its
// device, the job's store, its engine spec in the place the launcher gave it) and the engine of
// its role; and how it ends when it fails (run_instance). Every way an instance starts uses it:
// the demo's and the benches' child processes, and the Python package.
#pragma once

#include <hetmesh/afd/engine.hpp>
#include <hetmesh/afd/job.hpp>
#include <hetmesh/afd/job_config.hpp>
#include <hetmesh/core/device.hpp>
#include <hetmesh/core/rendezvous.hpp>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>

// Exported from the library, which hides every other symbol (core/README.md, "Exports").
#pragma GCC visibility push(default)

namespace hetmesh::afd {

// How an instance finds its job, beyond the config.
struct InstanceOptions {
  std::string store;        // the job's store ("host:port", or etcd's URL); "": the config's
  InstancePlace place;      // the CPUs and NIC its launcher handed it; empty: not placed
  std::string device;       // its device instead of the config's ("cuda:1"); "": the config's
  std::string secret_file;  // the job's secret; "": the config's [rendezvous] secret_file, else
                            // the file the launcher handed it (HETMESH_JOB_SECRET_FILE), else none
  std::string job;  // the job's rendezvous namespace (EngineSpec::job); "": "hetmesh". Two jobs
                    // that share one store need one each
  int metrics_index = -1;  // EngineSpec::metrics_index: its place among its host's instances
};

// What instance (role, rank) of a job runs on, set up in order: the config's plugins loaded, its
// device opened, its engine spec built and placed (this process pinned to the place's CPUs), the
// job's store connected (with the job's secret). Its engine joins the job when first asked for and
// ends first, before what it runs on.
class Instance {
 public:
  // Throws Error(INVALID_ARGUMENT) for a rank the job does not have or a store address with port
  // 0 (only the store's host knows its port), and what loading, opening or connecting throws.
  Instance(const JobConfig& config, Role role, int rank, const InstanceOptions& options = {});
  ~Instance();
  Instance(const Instance&) = delete;
  Instance& operator=(const Instance&) = delete;

  const JobConfig& config() const { return config_; }  // with InstanceOptions::device applied
  const EngineSpec& spec() const { return spec_; }
  const Device& device() const { return *device_; }
  KeyValueStore& store() { return *store_; }

  // The engine of its role, made (joined to the job) on the first call. Throws
  // Error(INVALID_ARGUMENT) for the other role's engine, or once close() has ended it.
  AttentionEngine& attention();
  FfnEngine& ffn();
  // Ends the engine now (AttentionEngine: without finish(), as one that failed), while what it
  // runs on stays.
  void close();

 private:
  JobConfig config_;
  EngineSpec spec_;
  std::optional<JobSecret> secret_;
  PluginRegistry plugins_;
  std::optional<Device> device_;
  std::unique_ptr<KeyValueStore> store_;
  std::unique_ptr<AttentionEngine> attention_;  // declared last: ends first
  std::unique_ptr<FfnEngine> ffn_;
  bool closed_ = false;
};

// Instance (role, rank) of the job `config`, ready for its engine.
std::unique_ptr<Instance> open_instance(const JobConfig& config, Role role, int rank,
                                        const InstanceOptions& options = {});

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

}  // namespace hetmesh::afd

#pragma GCC visibility pop
