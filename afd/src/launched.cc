// A process another launcher started: its place from the launcher's variables (launched.hpp).
#include <hetmesh/afd/launched.hpp>

#include <hetmesh/core/error.hpp>
#include <hetmesh/core/socket.hpp>

#include <fmt/format.h>

#include <charconv>
#include <string_view>

namespace hetmesh::afd {
namespace {

// One launcher's variables: rank, size (nullptr: none), local rank (nullptr: 0).
struct Variables {
  const char* launcher;
  const char* rank;
  const char* size;
  const char* local_rank;
};

// Innermost first (launched.hpp).
constexpr Variables kLaunchers[] = {
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"},
    {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
    {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
    {"leaderworkerset", "LWS_WORKER_INDEX", "LWS_GROUP_SIZE", nullptr},
    {"kubernetes", "JOB_COMPLETION_INDEX", nullptr, nullptr},
};

int number(const EnvironmentLookup& lookup, const char* name, int low) {
  const char* text = lookup(name);
  std::string_view value = text == nullptr ? "" : text;
  int n = 0;
  auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), n);
  if (value.empty() || error != std::errc() || end != value.data() + value.size() || n < low)
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("{}={:?}: expected a whole number of at least {}", name,
                            std::string(value), low));
  return n;
}

}  // namespace

std::optional<LaunchedProcess> launched_process(const EnvironmentLookup& lookup) {
  for (const Variables& v : kLaunchers) {
    if (lookup(v.rank) == nullptr) continue;
    LaunchedProcess p;
    p.launcher = v.launcher;
    p.rank_variable = v.rank;
    p.rank = number(lookup, v.rank, 0);
    if (v.size != nullptr) {
      p.size_variable = v.size;
      p.size = number(lookup, v.size, 1);
      if (p.rank >= p.size)
        throw Error(HM_ERR_INVALID_ARGUMENT,
                    fmt::format("{}={} is not below {}={}: not a rank of the {} job", v.rank,
                                p.rank, v.size, p.size, v.launcher));
    }
    if (v.local_rank != nullptr && lookup(v.local_rank) != nullptr)
      p.local_rank = number(lookup, v.local_rank, 0);
    const char* host = lookup("MASTER_ADDR");
    if (host == nullptr) host = lookup("LWS_LEADER_ADDRESS");
    if (host != nullptr && lookup("MASTER_PORT") != nullptr) {
      // torchrun's agent hosts PyTorch's own store at MASTER_PORT: hetmesh's takes the next port.
      const int port = number(lookup, "MASTER_PORT", 1) + (p.launcher == "torchrun" ? 1 : 0);
      if (port > 65535)
        throw Error(HM_ERR_INVALID_ARGUMENT,
                    fmt::format("MASTER_PORT={}: no port after it for hetmesh's store", port - 1));
      p.store = net::join_host_port(host, static_cast<uint16_t>(port));
    }
    return p;
  }
  return std::nullopt;
}

std::pair<Role, int> instance_of(const LaunchedProcess& p, const JobConfig& config) {
  const int attention = config.job.attention, ffn = config.job.ffn;
  const int instances = attention + ffn;
  if (p.size >= 0 && p.size != instances)
    throw Error(
        HM_ERR_INVALID_ARGUMENT,
        fmt::format("{} started {} processes ({}={}); the job has {} attention + {} ffn "
                    "= {} instances, one a process",
                    p.launcher, p.size, p.size_variable, p.size, attention, ffn, instances));
  if (p.rank >= instances)
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("{}={} is past the job's {} attention + {} ffn = {} instances "
                            "(ranks 0..{})",
                            p.rank_variable, p.rank, attention, ffn, instances, instances - 1));
  if (p.rank < attention) return {Role::attention, p.rank};
  return {Role::ffn, p.rank - attention};
}

std::string device_at_local_rank(const std::string& selector, const LaunchedProcess& p) {
  return fmt::format("{}:{}", selector.substr(0, selector.find(':')), p.local_rank);
}

}  // namespace hetmesh::afd
