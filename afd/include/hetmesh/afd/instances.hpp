// Which of a job's instances one invocation starts on this host (`--instances`), and where the
// launcher places each of them (CPUs near its device, its NIC). See docs/launching.md.
#pragma once

#include <hetmesh/afd/job.hpp>
#include <hetmesh/afd/job_config.hpp>

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

}  // namespace hetmesh::afd

#pragma GCC visibility pop
