// `hetmesh info`: the plugins found (path, version, ABI), their devices and capabilities and where
// each sits in the machine (hwloc: NUMA node, PCI path, local CPUs, nearest RDMA NIC), the RDMA
// devices, and the plugins refused with their reasons.
#include "commands.hpp"

#include <hetmesh/core/device.hpp>
#include <hetmesh/core/plugin.hpp>
#include <hetmesh/core/topology.hpp>
#include <hetmesh/transport/fabric_info.hpp>
#include <hetmesh/transport/rdma_info.hpp>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>

namespace hetmesh::cli {
namespace {

struct InfoOptions {
  std::vector<std::string> plugins;
  bool only = false;
  bool json = false;
  bool in_process = false;
};

// "0-3,8,10-11".
std::string cpu_ranges(const std::vector<int>& cpus) {
  std::string out;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1)
      ++j;
    out +=
        fmt::format("{}{}", out.empty() ? "" : ",",
                    i == j ? fmt::format("{}", cpus[i]) : fmt::format("{}-{}", cpus[i], cpus[j]));
    i = j + 1;
  }
  return out;
}

// Where a PCI device sits (hwloc): its PCI path, local CPUs and nearest RDMA NIC.
nlohmann::json place_json(const Topology& topology, const std::string& pci) {
  auto place = pci.empty() ? std::nullopt : topology.place(pci);
  if (!place) return nullptr;
  auto nic = topology.nearest_nic(pci);
  return {{"pci_path", place->path},
          {"cpus", cpu_ranges(place->cpus)},
          {"nearest_nic", nic ? nlohmann::json(*nic) : nlohmann::json()}};
}

// A device's one NUMA node, and who said it: the plugin where it knows (>= 0), else hwloc by its
// PCI address, else unknown (-1). The H200 machine's cuda plugin says -1 where hwloc says 0.
std::pair<int, const char*> numa_of(const Topology& topology, int plugin_says,
                                    const std::string& pci) {
  if (plugin_says >= 0) return {plugin_says, "plugin"};
  if (auto place = pci.empty() ? std::nullopt : topology.place(pci); place && place->numa_node >= 0)
    return {place->numa_node, "hwloc"};
  return {-1, "unknown"};
}

nlohmann::json to_json(const PluginRegistry& registry) {
  nlohmann::json out;
  out["hetmesh_version"] = HETMESH_VERSION;
  out["searched"] = registry.searched();
  out["host_abi"] = fmt::format("{}.{}", HM_DEVICE_PLUGIN_ABI_MAJOR, HM_DEVICE_PLUGIN_ABI_MINOR);
  const Topology topology = Topology::of_this_machine();
  out["topology"] = {{"numa_nodes", topology.numa_nodes()},
                     {"unknown_because", topology.empty() ? topology.why_empty() : ""}};
  out["plugins"] = nlohmann::json::array();
  for (const auto& p : registry.plugins()) {
    nlohmann::json devices = nlohmann::json::array();
    for (int32_t i = 0; i < p->device_count(); ++i) {
      Device d(p, i);
      const auto& props = d.properties();
      auto [numa, numa_source] = numa_of(topology, props.numa_node, props.pci_bus_id);
      devices.push_back({{"selector", d.selector()},
                         {"name", props.name},
                         {"vendor", props.vendor},
                         {"dlpack_device_type", props.dlpack_device_type},
                         {"pci_bus_id", props.pci_bus_id},
                         {"numa_node", numa},
                         {"numa_node_from", numa_source},
                         {"place", place_json(topology, props.pci_bus_id)},
                         {"total_memory", props.total_memory},
                         {"capabilities", capability_names(props.capabilities)}});
    }
    out["plugins"].push_back(
        {{"name", p->name()},
         {"version", p->version()},
         {"path", p->path()},
         {"abi", fmt::format("{}.{}", HM_DEVICE_PLUGIN_ABI_MAJOR, p->plugin_abi_minor())},
         {"negotiated_abi",
          fmt::format("{}.{}", HM_DEVICE_PLUGIN_ABI_MAJOR, p->negotiated_abi_minor())},
         {"devices", devices},
         {"no_devices_because", p->no_devices_reason()}});
  }
  out["refused"] = nlohmann::json::array();
  for (const auto& r : registry.refused())
    out["refused"].push_back({{"path", r.path}, {"reason", r.reason}});
  out["rdma"] = nlohmann::json::array();
  const std::vector<Topology::Nic> nics = topology.rdma_nics();
  for (const auto& d : list_rdma_devices()) {
    auto nic = std::find_if(nics.begin(), nics.end(),
                            [&](const Topology::Nic& n) { return n.name == d.name; });
    // The registration path for device memory, in the verbs transport's order of preference.
    std::string path = d.dmabuf_supported ? "dmabuf" : d.peermem_present ? "peermem" : "staging";
    out["rdma"].push_back(
        {{"device", d.name},
         {"port", d.port},
         {"state", d.port_state},
         {"link_layer", d.link_layer},
         {"active_mtu", d.active_mtu},
         {"gid_index", d.gid_index},
         {"gid", d.gid},
         {"max_qp_wr", d.max_qp_wr},
         {"max_sge", d.max_sge},
         {"max_inline", d.max_inline},
         {"max_mr_size", d.max_mr_size},
         {"max_msg_sz", d.max_msg_sz},
         {"dmabuf", d.dmabuf_supported},
         {"dmabuf_detail", d.dmabuf_detail},
         {"peermem", d.peermem_present},
         {"device_memory_path", path},
         {"place", nic == nics.end()
                       ? nlohmann::json()
                       : nlohmann::json{{"numa_node", nic->numa_node}, {"pci", nic->pci_bus_id}}},
         {"error", d.error}});
  }
  out["fabric"] = nlohmann::json::array();
  out["fabric_error"] = "";
  try {
    for (const auto& f : list_fabric_providers())
      out["fabric"].push_back({{"provider", f.provider},
                               {"domain", f.domain},
                               {"max_message", f.max_message},
                               {"ordered", f.ordered},
                               {"device_memory", f.device_memory}});
  } catch (const Error& e) {  // libfabric missing or unloadable here
    out["fabric_error"] = e.what();
  }
  return out;
}

void print_text(const nlohmann::json& info) {
  fmt::print("hetmesh {}, host ABI {}\n", info["hetmesh_version"].get<std::string>(),
             info["host_abi"].get<std::string>());
  const auto& topology = info["topology"];
  if (topology["unknown_because"].get<std::string>().empty())
    fmt::print("machine: {} NUMA node(s) (hwloc)\n", topology["numa_nodes"].get<int>());
  else
    fmt::print("machine: topology unknown: {}\n", topology["unknown_because"].get<std::string>());
  fmt::print("\nplugins ({}):\n", info["plugins"].size());
  for (const auto& p : info["plugins"]) {
    fmt::print("  {:<10} version {:<8} ABI {} (negotiated {})  {}\n", p["name"].get<std::string>(),
               p["version"].get<std::string>(), p["abi"].get<std::string>(),
               p["negotiated_abi"].get<std::string>(), p["path"].get<std::string>());
    if (p["devices"].empty()) {
      const std::string why = p["no_devices_because"].get<std::string>();
      fmt::print("    (no devices{})\n", why.empty() ? "" : ": " + why);
    }
    for (const auto& d : p["devices"]) {
      std::string pci = d["pci_bus_id"].get<std::string>();
      fmt::print("    {:<12} {} [{}]  memory {} MiB  pci {}  numa {} ({})  dlpack {}\n",
                 d["selector"].get<std::string>(), d["name"].get<std::string>(),
                 d["vendor"].get<std::string>(), d["total_memory"].get<uint64_t>() >> 20,
                 pci.empty() ? "-" : pci, d["numa_node"].get<int>(),
                 d["numa_node_from"].get<std::string>(), d["dlpack_device_type"].get<int>());
      if (const auto& where = d["place"]; !where.is_null())
        fmt::print(
            "      place: pci path {}, cpus {}, nearest RDMA NIC {}\n",
            where["pci_path"].get<std::string>(), where["cpus"].get<std::string>(),
            where["nearest_nic"].is_null() ? "none" : where["nearest_nic"].get<std::string>());
      fmt::print("      capabilities: {}\n", d["capabilities"].get<std::string>());
    }
  }
  fmt::print("\nRDMA devices ({}):\n", info["rdma"].size());
  if (info["rdma"].empty())
    fmt::print("  none (ibv_get_device_list found none): verbs is unavailable\n");
  for (const auto& d : info["rdma"]) {
    if (!d["error"].get<std::string>().empty()) {
      fmt::print("  {} port {}: {}\n", d["device"].get<std::string>(), d["port"].get<int>(),
                 d["error"].get<std::string>());
      continue;
    }
    fmt::print("  {} port {} {} {} mtu {} gid[{}] {}\n", d["device"].get<std::string>(),
               d["port"].get<int>(), d["state"].get<std::string>(),
               d["link_layer"].get<std::string>(), d["active_mtu"].get<int>(),
               d["gid_index"].get<int>(), d["gid"].get<std::string>());
    if (const auto& where = d["place"]; !where.is_null())
      fmt::print("    place: numa {}, pci {}\n", where["numa_node"].get<int>(),
                 where["pci"].get<std::string>().empty() ? "-" : where["pci"].get<std::string>());
    fmt::print("    limits: max_qp_wr {} max_sge {} max_inline {} max_mr_size {} max_msg_sz {}\n",
               d["max_qp_wr"].get<uint64_t>(), d["max_sge"].get<uint64_t>(),
               d["max_inline"].get<int64_t>(), d["max_mr_size"].get<uint64_t>(),
               d["max_msg_sz"].get<uint64_t>());
    fmt::print("    device memory registration: {} (dma-buf: {}; nvidia_peermem: {})\n",
               d["device_memory_path"].get<std::string>(), d["dmabuf_detail"].get<std::string>(),
               d["peermem"].get<bool>() ? "loaded" : "absent");
  }
  fmt::print("\nlibfabric providers for the fabric transport ({}):\n", info["fabric"].size());
  if (!info["fabric_error"].get<std::string>().empty())
    fmt::print("  none: {}\n", info["fabric_error"].get<std::string>());
  else if (info["fabric"].empty())
    fmt::print(
        "  none (no provider offers reliable datagrams with messages and RMA writes, or "
        "this build has no libfabric)\n");
  for (const auto& f : info["fabric"])
    fmt::print("  {:<16} domain {:<12} {}; messages up to {} bytes\n",
               f["provider"].get<std::string>(), f["domain"].get<std::string>(),
               f["ordered"].get<bool>() ? "writes and notices back to back"
                                        : "each write waits for the delivery of the one before",
               f["max_message"].get<uint64_t>());
  fmt::print("\nsearched:\n");
  for (const auto& where : info["searched"])
    fmt::print("  {}\n", where.get<std::string>());
  fmt::print("\nrefused ({}):\n", info["refused"].size());
  for (const auto& r : info["refused"])
    fmt::print("  {}\n    {}\n", r["path"].get<std::string>(), r["reason"].get<std::string>());
}

}  // namespace

void add_info_command(CLI::App& app) {
  auto options = std::make_shared<InfoOptions>();
  CLI::App* info = app.add_subcommand("info", "List device plugins, devices and capabilities");
  info->add_option("--plugin", options->plugins, "Load this plugin file (repeatable)");
  info->add_flag("--only", options->only, "Load only the --plugin files; search nothing else");
  info->add_flag("--json", options->json, "Print JSON instead of a table");
  info->add_flag("--in-process", options->in_process,
                 "Initialize plugins in this process (by default each is probed in a child first,"
                 " so a crashing plugin is reported instead of killing the tool)");
  info->callback([options] {
    PluginLoadOptions load;
    load.explicit_paths = options->plugins;
    load.search = !options->only;
    load.isolate = !options->in_process;
    auto info_json = to_json(PluginRegistry::load(load));
    if (options->json) {
      fmt::print("{}\n", info_json.dump(2));
    } else {
      print_text(info_json);
    }
  });
}

}  // namespace hetmesh::cli
