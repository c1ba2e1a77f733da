// From a job config to what the engine needs: the engine spec of one instance and the plugins;
// and the checks that refuse, before anything starts, a job this machine cannot run (job.cc,
// job_limits.cc). Shared by `hetmesh demo` and `hetmesh bench afd`.
#pragma once

#include <hetmesh/afd/engine.hpp>
#include <hetmesh/afd/job_config.hpp>
#include <hetmesh/core/topology.hpp>
#include <hetmesh/transport/selection.hpp>

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

// Exported from the library, which hides every other symbol (core/README.md, "Exports").
#pragma GCC visibility push(default)

namespace hetmesh::afd {

// The transport a single-host job uses, chosen by choose_transport (transport_selection.hpp),
// which logs why: `auto` resolves to ipc, since every instance shares the node; a config that
// names a transport gets it.
TransportSelection single_host_transport_choice(const JobConfig& config);
TransportKind single_host_transport(const JobConfig& config);

// The shape of instance (`role`, `rank`)'s engine as the config gives it: counts, sizes, gather
// mode and timeout, with no transport chosen (what the config's own checks and the memory
// estimate need). engine_spec adds the transport and the CPUs.
EngineSpec job_shape(const JobConfig& config, Role role, int rank = 0);
EngineSpec engine_spec(const JobConfig& config, Role role, int rank);

// Loads the plugins the config names (explicit paths, per-plugin options) plus, from the usual
// search, those its devices name (PluginLoadOptions::wanted).
PluginRegistry load_plugins(const JobConfig& config);

// Where the launcher placed an instance (InstancePlaces, launch.hpp; `--cpus`, `--nic`).
struct InstancePlace {
  std::vector<int> cpus;  // empty: not pinned
  std::string nic;        // the RDMA NIC its "auto" came to; empty: as the config says
};
// In the instance: pins this process to the place's CPUs, and returns `spec` with its comm
// threads on them and its NIC (each logged); `spec` as it is for an empty place. Throws
// Error(INTERNAL) naming the CPUs when the kernel refuses.
EngineSpec placed(EngineSpec spec, const InstancePlace& place);

// The RDMA NIC each of a host's instances takes, for instances whose devices have these PCI bus ids
// (in start order): the nearest (Topology::nearest_nic), the instances before it counted, so
// that equally near NICs are shared out evenly; "" where the topology names none.
std::vector<std::string> assign_nics(const std::vector<std::string>& pci_bus_ids,
                                     const Topology& topology);

// The CPUs to pin each of a host's instances to, `per_instance` each, for instances whose devices
// have these PCI bus ids (in start order; "" for a device that is not a PCI device): CPUs of the
// device's NUMA node (topology.hpp) while that node has some left, then any left, each CPU given
// once, in the order of `available`. An instance gets none when fewer than `per_instance` are left.
std::vector<std::vector<int>> assign_cpus(const std::vector<std::string>& pci_bus_ids,
                                          const Topology& topology, int per_instance,
                                          const std::vector<int>& available);

// ---- refusing, before anything starts, what cannot work ----

// Host memory, in bytes, that the engine of instance (`role`, `rank`) allocates: its slots when
// its device keeps memory in the host (cpu, asic_stub; a GPU's slots are in its own memory), and
// the pinned headers.
double engine_host_bytes(const JobConfig& config, Role role, int rank);

// One line of a memory estimate: what needs `bytes`.
struct MemoryNeed {
  std::string what;
  double bytes = 0;
};
// The memory this machine can still give: MemAvailable of /proc/meminfo (or the free pages), less
// where the cgroup's memory.max is lower. `source` says where the figure came from.
uint64_t available_memory_bytes(std::string* source = nullptr);
// Throws Error(HM_ERR_OUT_OF_MEMORY) when the needs, together, exceed the available memory, with
// a message naming `config_name`, the estimate, its parts and the memory available; so that a job
// too big for the machine is refused at once rather than after minutes of swapping.
void refuse_unless_memory_fits(const std::vector<MemoryNeed>& needs, const std::string& config_name,
                               const std::string& advice);
// In bytes, "1.5 GiB" style.
std::string format_bytes(double bytes);

// When an A and an F of this host run on the same GPU (one device selector, not the cpu
// plugin's) as separate processes, what that costs and what to do: two processes' contexts
// time-slice one GPU, about 175 us per hop on an H200 whatever the size, unless the GPU is shared
// through NVIDIA's MPS (seen from CUDA_MPS_PIPE_DIRECTORY or MPS's default pipe). nullopt else.
std::optional<std::string> shared_device_advice(const JobConfig& config);

// A new folder <temporary folder>/<prefix>-<pid>-XXXXXX/ (mkdtemp, mode 0700) for a job's files.
// The temporary folder comes from TMPDIR (or TMP, TEMP, TEMPDIR), else /tmp; one that is missing or
// not writable is an Error(INVALID_ARGUMENT) naming the folder, the variable and what to do.
std::filesystem::path make_job_folder(const std::string& prefix);

}  // namespace hetmesh::afd

#pragma GCC visibility pop
