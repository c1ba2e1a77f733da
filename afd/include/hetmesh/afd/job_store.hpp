// The rendezvous store of an invocation that launches (part of) a job: hosted here or joined,
// and the job's secret. See docs/launching.md and docs/security.md.
#pragma once

#include <hetmesh/afd/instances.hpp>
#include <hetmesh/afd/job_config.hpp>
#include <hetmesh/core/rendezvous.hpp>

#include <filesystem>
#include <memory>
#include <string>

// Exported from the library, which hides every other symbol (core/README.md, "Exports").
#pragma GCC visibility push(default)

namespace hetmesh::afd {

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

}  // namespace hetmesh::afd

#pragma GCC visibility pop
