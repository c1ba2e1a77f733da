// A process another launcher started (`hetmesh run`, docs/launching.md): where it stands in the
// job, from the variables of the launcher that started it, and the instance that makes it.
//
// Launchers are read innermost first, since one runs inside another's allocation (mpirun or
// torchrun in a Slurm job see SLURM_PROCID of the batch step): torchrun (RANK, WORLD_SIZE,
// LOCAL_RANK), Open MPI (OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK), Slurm's srun (SLURM_PROCID,
// SLURM_NTASKS, SLURM_LOCALID), LeaderWorkerSet (LWS_WORKER_INDEX, LWS_GROUP_SIZE), a Kubernetes
// indexed Job (JOB_COMPLETION_INDEX; the job's size is the config's).
#pragma once

#include <hetmesh/afd/job_config.hpp>

#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <utility>

// Exported from the library, which hides every other symbol (core/README.md, "Exports").
#pragma GCC visibility push(default)

namespace hetmesh::afd {

struct LaunchedProcess {
  std::string launcher;  // "torchrun", "openmpi", "slurm", "leaderworkerset", "kubernetes"
  std::string rank_variable, size_variable;  // where rank and size came from, for messages
  int rank = 0;
  int size = -1;  // -1: the launcher does not say (a Kubernetes indexed Job)
  int local_rank = 0;
  // Where rank 0 hosts the job's store, "host:port", from MASTER_ADDR and MASTER_PORT (as
  // torchrun sets them and PyTorch jobs under the other launchers export them; under torchrun the
  // port after MASTER_PORT, which its agent's own store holds), or LWS_LEADER_ADDRESS for the host
  // under LeaderWorkerSet; "" where they give none.
  std::string store;
};

using EnvironmentLookup = std::function<const char*(const char*)>;

// This process's place from its launcher's variables (`lookup`: the environment by default);
// nullopt when no launcher's are set. A value that is not a number, or a rank outside the size,
// is Error(INVALID_ARGUMENT) naming the variable and its value.
std::optional<LaunchedProcess> launched_process(const EnvironmentLookup& lookup = std::getenv);

// The instance a launched process is in `config`: ranks 0..A-1 the attention instances, then the
// FFN instances. A size other than the job's instances, or a rank past them, is
// Error(INVALID_ARGUMENT) naming the launcher's variables and the config's counts.
std::pair<Role, int> instance_of(const LaunchedProcess& process, const JobConfig& config);

// The config's device `selector` ("cuda:0") at the process's local rank ("cuda:3"): a device a
// process, as launchers start a process a GPU.
std::string device_at_local_rank(const std::string& selector, const LaunchedProcess& process);

}  // namespace hetmesh::afd

#pragma GCC visibility pop
