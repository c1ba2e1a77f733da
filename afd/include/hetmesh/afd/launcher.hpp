// The launcher: "this job, these instances, here". One object takes a job config from the command
// line to its instances running on this host and back: which instances run here, a refusal at
// once of a job too big for the machine, the job's folder with the config in it, the store
// (hosted or joined) and the job's secret, each instance's place (CPUs, NIC), the child processes
// that run them (each then an Instance, instance.hpp), and how they end (a failure, a signal, the
// time limit). `hetmesh demo` and `hetmesh bench afd` launch through it; docs/launching.md.
#pragma once

#include <hetmesh/afd/instances.hpp>
#include <hetmesh/afd/job.hpp>
#include <hetmesh/afd/job_config.hpp>
#include <hetmesh/afd/job_store.hpp>
#include <hetmesh/afd/local_job.hpp>

#include <chrono>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

// Exported from the library, which hides every other symbol (core/README.md, "Exports").
#pragma GCC visibility push(default)

namespace hetmesh::afd {

// The options of a command that launches a job (its command line: tools/cli/job_options.hpp).
// The launcher's own, then those it hands each instance it starts (`--role ROLE --rank N --store
// ADDRESS --out DIR [--cpus LIST] [--nic NAME]`), which make the command an instance.
struct LaunchOptions {
  std::vector<std::string> instances;  // the instances started here (parse_instances); none = all
  std::string store;                   // the store to join; none = host it (JobStore)
  std::string pin = "auto";            // auto, on, off (place_instances)
  std::string role;                    // in an instance: its role; "" in the launcher
  int rank = 0;
  std::string out;         // in an instance: the job's folder, for its results
  InstancePlace place;     // in an instance: its CPUs and NIC
  std::string device;      // in an instance: its device instead of the config's ("": the config's)
  int metrics_index = -1;  // in an instance: InstanceOptions::metrics_index

  bool in_instance() const { return !role.empty(); }
  // What an instance is handed to find its job (instance.hpp).
  InstanceOptions instance_options() const { return {store, place, device, {}, {}, metrics_index}; }
};

// What a launching command says of its job.
struct LaunchRequest {
  // The subcommand its instances run ({"demo"}, {"bench", "afd"}): each is started as this
  // executable with it, `--config <the job's folder>/job.toml`, then LaunchOptions' instance
  // arguments.
  std::vector<std::string> command;
  std::string config_name;  // for messages: the config file, or "the default job"
  // Host memory an instance needs besides its engine's slots (the demo's model), and what to do
  // when the job does not fit.
  std::function<double(Role role, int rank)> extra_bytes;
  std::string memory_advice;
};

class Launcher {
 public:
  // Everything before the instances start: decides which run here, refuses a job whose instances
  // here would not fit in this machine's memory (Error(OUT_OF_MEMORY), before anything else),
  // holds SIGINT and SIGTERM (InterruptGuard), makes the job's folder (`hetmesh-<name>-<pid>`,
  // removed with the launcher) and writes the config there, hosts or joins the store, and places
  // each instance. Throws Error(INVALID_ARGUMENT) as parse_instances, JobStore and
  // place_instances do.
  Launcher(const JobConfig& config, const LaunchOptions& options, LaunchRequest request,
           const std::string& name);
  Launcher(const Launcher&) = delete;
  Launcher& operator=(const Launcher&) = delete;

  const LocalInstances& local() const { return local_; }
  bool everything() const { return local_.everything(config_); }  // every instance runs here
  const JobStore& store() const { return store_; }
  const InstancePlaces& places() const { return places_; }
  const std::filesystem::path& folder() const { return folder_; }
  // "here: attention 0,1, ffn none; rendezvous store ..." for an invocation that starts part of
  // the job (what the other hosts' invocations need); "" when every instance runs here.
  std::string share() const;

  // One run of this host's instances.
  struct Run {
    std::string job = EngineSpec{}.job;  // the instances' rendezvous id
    std::string role_prefix;             // before each role on their command line ("bare-")
    std::vector<std::string> args;       // after the config file, for every instance
    // Each line an attention instance prints (its stdout), as it comes, with the job (to
    // replace an instance, LocalJob::replace). None: their stdout is not read.
    std::function<void(LocalJob& job, int rank, const std::string& line)> on_attention_line;
    std::chrono::milliseconds limit{0};          // LocalJob::wait's
    std::chrono::milliseconds stopped_limit{0};  // likewise
  };
  struct Outcome {
    std::vector<InstanceFailure> failures;
    std::vector<std::string> explanation;  // LocalJob::explain's, one line each
    int interrupted = 0;                   // the signal that stopped the run, or 0
    bool ok() const { return failures.empty() && interrupted == 0; }
  };
  // Starts this host's instances (ffn first, then attention), each in its place, and waits for
  // them all (LocalJob::wait).
  Outcome run(const Run& run);

  // 128 + the signal that interrupted the launch, else `status`: the command's exit status.
  int exit_status(int status) const;

 private:
  JobConfig config_;
  LaunchOptions options_;
  LaunchRequest request_;
  LocalInstances local_;
  InterruptGuard interrupts_;
  std::filesystem::path folder_;
  FolderRemover remove_folder_;
  JobStore store_;
  InstancePlaces places_;
};

}  // namespace hetmesh::afd

#pragma GCC visibility pop
