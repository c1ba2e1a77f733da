// Which instances run here, and where each is placed (instances.hpp).
#include <hetmesh/afd/instances.hpp>

#include "this_host.hpp"

#include <hetmesh/core/error.hpp>
#include <hetmesh/core/topology.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <sched.h>

#include <algorithm>
#include <charconv>
#include <set>

namespace hetmesh::afd {
namespace {

int parse_rank(std::string_view text, const std::string& value) {
  int rank = -1;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), rank);
  if (ec != std::errc() || end != text.data() + text.size() || rank < 0)
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("--instances {}: '{}' is not a rank", value, text));
  return rank;
}

}  // namespace

LocalInstances parse_instances(const std::vector<std::string>& values, const JobConfig& config) {
  std::set<int> attention, ffn;
  auto all = [](std::set<int>& ranks, int count) {
    for (int r = 0; r < count; ++r)
      ranks.insert(r);
  };
  if (values.empty()) {
    all(attention, config.job.attention);
    all(ffn, config.job.ffn);
  }
  for (const std::string& value : values) {
    if (value == "here") {  // the instances whose [hosts] address is this machine's
      for (int r = 0; r < config.job.attention; ++r)
        if (is_this_host(config.hosts.attention.at(static_cast<size_t>(r)))) attention.insert(r);
      for (int r = 0; r < config.job.ffn; ++r)
        if (is_this_host(config.hosts.ffn.at(static_cast<size_t>(r)))) ffn.insert(r);
      if (attention.empty() && ffn.empty())
        throw Error(HM_ERR_INVALID_ARGUMENT,
                    "--instances here: no [hosts] address of the job is this machine's");
      continue;
    }
    std::string_view role = value, list;
    if (auto colon = value.find(':'); colon != std::string::npos) {
      role = std::string_view(value).substr(0, colon);
      list = std::string_view(value).substr(colon + 1);
    }
    bool is_attention = role == "attention";
    if (!is_attention && role != "ffn")
      throw Error(HM_ERR_INVALID_ARGUMENT,
                  fmt::format("--instances {}: the role is 'attention' or 'ffn'", value));
    std::set<int>& ranks = is_attention ? attention : ffn;
    int count = is_attention ? config.job.attention : config.job.ffn;
    if (list.empty()) {
      all(ranks, count);
      continue;
    }
    while (!list.empty()) {
      auto comma = list.find(',');
      std::string_view item = list.substr(0, comma);
      list = comma == std::string_view::npos ? std::string_view() : list.substr(comma + 1);
      auto dash = item.find('-');
      int first = parse_rank(item.substr(0, dash), value);
      int last = dash == std::string_view::npos ? first : parse_rank(item.substr(dash + 1), value);
      if (last < first || last >= count)
        throw Error(HM_ERR_INVALID_ARGUMENT,
                    fmt::format("--instances {}: the job has {} {} instance(s), ranks 0..{}", value,
                                count, is_attention ? "attention" : "ffn", count - 1));
      for (int r = first; r <= last; ++r)
        ranks.insert(r);
    }
  }
  return {{attention.begin(), attention.end()}, {ffn.begin(), ffn.end()}};
}

std::vector<std::string> InstancePlaces::args(bool attention_role, size_t index) const {
  const auto& places = attention_role ? attention : ffn;
  if (index >= places.size()) return {};
  std::vector<std::string> out;
  if (!places[index].cpus.empty())
    out.insert(out.end(), {"--cpus", fmt::format("{}", fmt::join(places[index].cpus, ","))});
  if (!places[index].nic.empty()) out.insert(out.end(), {"--nic", places[index].nic});
  return out;
}

std::string InstancePlaces::describe(const LocalInstances& local) const {
  std::vector<std::string> parts;
  for (bool attention_role : {true, false}) {
    const auto& ranks = attention_role ? local.attention : local.ffn;
    const auto& places = attention_role ? attention : ffn;
    for (size_t i = 0; i < ranks.size() && i < places.size(); ++i) {
      std::vector<std::string> what;
      if (!places[i].cpus.empty())
        what.push_back(fmt::format("CPUs {}", fmt::join(places[i].cpus, ",")));
      if (!places[i].nic.empty()) what.push_back("NIC " + places[i].nic);
      if (!what.empty())
        parts.push_back(fmt::format("{} {}: {}", attention_role ? "attention" : "ffn", ranks[i],
                                    fmt::join(what, ", ")));
    }
  }
  return fmt::format("{}", fmt::join(parts, "; "));
}

InstancePlaces place_instances(const JobConfig& config, const LocalInstances& local,
                               const std::string& pin) {
  if (pin != "auto" && pin != "on" && pin != "off")
    throw Error(HM_ERR_INVALID_ARGUMENT, fmt::format("--pin {}: expected auto, on or off", pin));
  std::vector<int> allowed;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0)
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
      if (CPU_ISSET(cpu, &set)) allowed.push_back(cpu);
  const size_t instances = local.attention.size() + local.ffn.size();
  int each = instances > 0 ? static_cast<int>(allowed.size() / instances) : 0;
  if (pin == "off" || (pin == "auto" && (each < 4 || !config.affinity.comm_cpus.empty()))) each = 0;
  // The instances whose NIC is "auto" (attention first).
  std::vector<bool> auto_nic;
  for (Role role : {Role::attention, Role::ffn})
    for (int rank : role == Role::attention ? local.attention : local.ffn)
      auto_nic.push_back(engine_spec(config, role, rank).transport.rdma_device == "auto");
  const bool nics = std::find(auto_nic.begin(), auto_nic.end(), true) != auto_nic.end();
  InstancePlaces out;
  out.attention.resize(local.attention.size());
  out.ffn.resize(local.ffn.size());
  if (each < 1 && !nics) return out;
  // Each instance's device's PCI bus id, attention first: its NUMA node and its nearest NIC.
  PluginRegistry plugins = load_plugins(config);
  std::vector<std::string> pci;
  for (int a : local.attention)
    pci.push_back(plugins.device(config.devices.attention.at(static_cast<size_t>(a)))
                      .properties()
                      .pci_bus_id);
  for (int f : local.ffn)
    pci.push_back(
        plugins.device(config.devices.ffn.at(static_cast<size_t>(f))).properties().pci_bus_id);
  const Topology& topology = Topology::of_this_machine();
  std::vector<std::vector<int>> cpus =
      each >= 1 ? assign_cpus(pci, topology, each, allowed) : std::vector<std::vector<int>>();
  std::vector<std::string> nic = nics ? assign_nics(pci, topology) : std::vector<std::string>();
  for (size_t i = 0; i < pci.size(); ++i) {
    InstancePlace& place =
        i < local.attention.size() ? out.attention[i] : out.ffn[i - local.attention.size()];
    if (i < cpus.size()) place.cpus = cpus[i];
    if (i < nic.size() && auto_nic[i]) place.nic = nic[i];
  }
  return out;
}

}  // namespace hetmesh::afd
