// `hetmesh info`: the plugins found (path, version, ABI), their devices and capabilities, and the
// plugins refused with their reasons.
#include "commands.hpp"

#include <hetmesh/device.hpp>
#include <hetmesh/plugin.hpp>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cstdio>

namespace hetmesh::cli {
namespace {

struct InfoOptions {
  std::vector<std::string> plugins;
  bool only = false;
  bool json = false;
  bool in_process = false;
};

nlohmann::json to_json(const PluginRegistry& registry) {
  nlohmann::json out;
  out["host_abi"] = fmt::format("{}.{}", HM_DEVICE_PLUGIN_ABI_MAJOR, HM_DEVICE_PLUGIN_ABI_MINOR);
  out["plugins"] = nlohmann::json::array();
  for (const auto& p : registry.plugins()) {
    nlohmann::json devices = nlohmann::json::array();
    for (int32_t i = 0; i < p->device_count(); ++i) {
      Device d(p, i);
      const auto& props = d.properties();
      devices.push_back({{"selector", d.selector()},
                         {"name", props.name},
                         {"vendor", props.vendor},
                         {"dlpack_device_type", props.dlpack_device_type},
                         {"pci_bus_id", props.pci_bus_id},
                         {"numa_node", props.numa_node},
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
         {"devices", devices}});
  }
  out["refused"] = nlohmann::json::array();
  for (const auto& r : registry.refused())
    out["refused"].push_back({{"path", r.path}, {"reason", r.reason}});
  return out;
}

void print_text(const nlohmann::json& info) {
  fmt::print("hetmesh host ABI {}\n", info["host_abi"].get<std::string>());
  fmt::print("\nplugins ({}):\n", info["plugins"].size());
  for (const auto& p : info["plugins"]) {
    fmt::print("  {:<10} version {:<8} ABI {} (negotiated {})  {}\n", p["name"].get<std::string>(),
               p["version"].get<std::string>(), p["abi"].get<std::string>(),
               p["negotiated_abi"].get<std::string>(), p["path"].get<std::string>());
    if (p["devices"].empty()) fmt::print("    (no devices)\n");
    for (const auto& d : p["devices"]) {
      std::string pci = d["pci_bus_id"].get<std::string>();
      fmt::print("    {:<12} {} [{}]  memory {} MiB  pci {}  numa {}  dlpack {}\n",
                 d["selector"].get<std::string>(), d["name"].get<std::string>(),
                 d["vendor"].get<std::string>(), d["total_memory"].get<uint64_t>() >> 20,
                 pci.empty() ? "-" : pci, d["numa_node"].get<int>(),
                 d["dlpack_device_type"].get<int>());
      fmt::print("      capabilities: {}\n", d["capabilities"].get<std::string>());
    }
  }
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
