// Which instances of a job one `hetmesh demo` or `hetmesh bench afd` invocation starts on this
// host, and which rendezvous store they meet at. By default one invocation hosts the store and
// starts every instance; on several hosts, each host starts its share (`--instances`) and all but
// the store's host join it (`--store`). See docs/launching.md.
#pragma once

#include <hetmesh/afd/job_config.hpp>
#include <hetmesh/core/rendezvous.hpp>

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

}  // namespace hetmesh::afd
