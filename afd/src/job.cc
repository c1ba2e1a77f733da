// From a job config to an instance's engine spec and the plugins it loads (job.hpp).
#include <hetmesh/afd/job.hpp>
#include <hetmesh/core/log.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>

namespace hetmesh::afd {

TransportSelection single_host_transport_choice(const JobConfig& c) {
  // Every instance of a single-host job is a process of this host, so its peers share the node.
  return choose_transport(c.transport.kind, /*same_node=*/true, c.transport.rdma_device);
}

TransportKind single_host_transport(const JobConfig& c) {
  return single_host_transport_choice(c).kind;
}

EngineSpec job_shape(const JobConfig& c, Role role, int rank) {
  EngineSpec spec;
  spec.role = role;
  spec.rank = rank;
  spec.attention = c.job.attention;
  spec.ffn = c.job.ffn;
  spec.micro_batches = c.job.micro_batches;
  spec.tokens = static_cast<uint32_t>(c.model.tokens);
  spec.hidden = static_cast<uint32_t>(c.model.hidden);
  spec.top_k = static_cast<uint32_t>(c.model.top_k);
  spec.a2f_bytes = static_cast<uint32_t>(dtype_bytes(c.model.a2f_dtype));
  spec.f2a_bytes = static_cast<uint32_t>(dtype_bytes(c.model.f2a_dtype));
  for (const TensorSection& t : c.model.a2f_tensors)
    spec.a2f_extra.push_back(
        {t.name, static_cast<uint32_t>(static_cast<uint64_t>(t.columns) * dtype_bytes(t.dtype))});
  spec.gather = c.job.gather;
  spec.topology = c.job.topology;
  spec.ffns_of = c.job.ffns_of;
  spec.queue_depth = c.job.queue_depth;
  spec.timeout = c.job.timeout;
  spec.join_timeout = c.job.join_timeout;
  spec.io_timeout = c.job.io_timeout;
  spec.heartbeat = c.job.heartbeat;
  spec.gather_window = c.job.gather_window;
  return spec;
}

EngineSpec engine_spec(const JobConfig& c, Role role, int rank) {
  EngineSpec spec = job_shape(c, role, rank);
  spec.transport.kind = single_host_transport(c);
  // This instance's own entries of [hosts]; a config built in code may have none for its rank.
  const auto index = static_cast<size_t>(rank);
  auto own = [&](const std::vector<std::string>& values, const std::string& fallback) {
    return index < values.size() ? values[index] : fallback;
  };
  const bool attention = role == Role::attention;
  spec.transport.listen_host =
      own(attention ? c.hosts.attention : c.hosts.ffn, c.transport.listen_host);
  spec.transport.rdma_device =
      own(attention ? c.hosts.attention_nic : c.hosts.ffn_nic, c.transport.rdma_device);
  spec.transport.gid_index = c.transport.gid_index;
  spec.transport.fabric_provider = c.transport.provider;
  spec.transport.rails = c.transport.nics;
  spec.transport.staging_slots = static_cast<uint32_t>(c.transport.staging_slots);
  spec.transport.staging_slot_bytes = static_cast<uint64_t>(c.transport.staging_slot_kib) << 10;
  spec.transport.poller_cpu = c.affinity.poller_cpu;
  spec.comm_cpus = c.affinity.comm_cpus;
  spec.metrics_listen = c.metrics.listen;
  return spec;
}

std::optional<std::string> shared_device_advice(const JobConfig& c) {
  for (const std::string& a : c.devices.attention) {
    if (a.rfind("cpu:", 0) == 0 || a.rfind("asic_stub:", 0) == 0) continue;
    if (std::find(c.devices.ffn.begin(), c.devices.ffn.end(), a) == c.devices.ffn.end()) continue;
    const char* pipe = std::getenv("CUDA_MPS_PIPE_DIRECTORY");
    const bool mps =
        a.rfind("cuda:", 0) == 0 &&
        std::filesystem::exists(std::filesystem::path(pipe ? pipe : "/tmp/nvidia-mps") / "control");
    if (mps) return std::nullopt;
    return fmt::format(
        "note: an attention and an FFN instance share {} as separate processes: the GPU "
        "time-slices their contexts (about 175 us per hop on an H200, whatever the size). On "
        "NVIDIA, start MPS first (nvidia-cuda-mps-control -d), which brought that to 12 us "
        "(docs/deploying.md)",
        a);
  }
  return std::nullopt;
}

std::vector<std::vector<int>> assign_cpus(const std::vector<std::string>& pci_bus_ids,
                                          const Topology& topology, int per_instance,
                                          const std::vector<int>& available) {
  std::vector<int> left = available;
  std::vector<std::vector<int>> out;
  for (const std::string& pci : pci_bus_ids) {
    std::vector<int> near;
    if (auto place = pci.empty() ? std::nullopt : topology.place(pci)) near = place->cpus;
    std::vector<int> mine;
    // Near ones first, in `available` order, then the rest.
    for (bool want_near : {true, false})
      for (int cpu : left) {
        if (static_cast<int>(mine.size()) == per_instance) break;
        bool is_near = std::find(near.begin(), near.end(), cpu) != near.end();
        if (is_near == want_near && std::find(mine.begin(), mine.end(), cpu) == mine.end())
          mine.push_back(cpu);
      }
    if (static_cast<int>(mine.size()) < per_instance) mine.clear();
    for (int cpu : mine)
      left.erase(std::find(left.begin(), left.end(), cpu));
    out.push_back(std::move(mine));
  }
  return out;
}

EngineSpec placed(EngineSpec spec, const InstancePlace& place) {
  if (!place.cpus.empty()) {
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int cpu : place.cpus)
      CPU_SET(cpu, &set);
    if (sched_setaffinity(0, sizeof set, &set) != 0)
      throw Error(HM_ERR_INTERNAL, fmt::format("cannot pin to CPUs {}: {}",
                                               fmt::join(place.cpus, ","), std::strerror(errno)));
    log(LogLevel::info, "pinned to CPUs {}", fmt::join(place.cpus, ","));
    spec.comm_cpus = place.cpus;
  }
  if (!place.nic.empty()) {
    log(LogLevel::info, "RDMA device {} (the launcher's choice for \"auto\")", place.nic);
    spec.transport.rdma_device = place.nic;
  }
  return spec;
}

std::vector<std::string> assign_nics(const std::vector<std::string>& pci_bus_ids,
                                     const Topology& topology) {
  std::map<std::string, int> taken;
  std::vector<std::string> out;
  for (const std::string& pci : pci_bus_ids) {
    std::optional<std::string> nic;
    if (!pci.empty()) nic = topology.nearest_nic(pci, taken);
    if (nic) ++taken[*nic];
    out.push_back(nic.value_or(""));
  }
  return out;
}

PluginRegistry load_plugins(const JobConfig& c) {
  PluginLoadOptions options;
  options.explicit_paths = c.plugins.paths;
  options.plugin_options = c.plugins.options;
  for (const auto* role : {&c.devices.attention, &c.devices.ffn})
    for (const std::string& selector : *role)
      options.wanted.insert(selector.substr(0, selector.find(':')));
  return PluginRegistry::load(options);
}

}  // namespace hetmesh::afd
