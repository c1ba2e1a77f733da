// Device plugins: discovery, loading, version negotiation and validation.
//
// Discovery order (docs/architecture.md):
//   1. HETMESH_PLUGINS=path[:path...]  -- exactly these plugins, nothing else is searched
//   2. PluginLoadOptions::explicit_paths (from a config or --plugin)
//   3. every libhetmesh-device-*.so in HETMESH_PLUGIN_PATH=dir[:dir...]
//   4. the installed plugin folder, <dir of libhetmesh.so>/hetmesh/plugins
// The first plugin of a name wins; later ones are reported as refused. Environment variables are
// ignored in setuid processes. A plugin that fails any check is refused with its path and reason,
// and never takes the process down; loaded plugins are never unloaded.
#pragma once

#include <hetmesh/device_plugin.h>
#include <hetmesh/core/error.hpp>

#include <chrono>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

// Exported from the library, which hides every other symbol (core/README.md, "Exports").
#pragma GCC visibility push(default)

namespace hetmesh {

class Device;
class Plugin;

// Loads one plugin file in this process: the checks of PluginRegistry::load for one path.
// Returns the plugin, or nullptr with *refusal set. Used by the registry and by
// hetmesh-plugin-probe. `host_abi_minor` is the minor this host announces to the plugin's
// initialize (hm_host_api.abi_minor): the conformance kit acts as an older host with it, to check
// the minor-version promises (HM-R38); nothing else lowers it.
std::shared_ptr<Plugin> load_plugin_file(const std::string& path, const std::string& options,
                                         std::string* refusal,
                                         uint32_t host_abi_minor = HM_DEVICE_PLUGIN_ABI_MINOR);

class Plugin {
 public:
  const std::string& path() const { return path_; }
  const std::string& name() const { return name_; }
  const std::string& version() const { return version_; }
  uint32_t plugin_abi_minor() const { return plugin_minor_; }
  // min(host minor, plugin minor): the operations both sides know.
  uint32_t negotiated_abi_minor() const { return negotiated_minor_; }
  int32_t device_count() const { return device_count_; }
  // Why a plugin with no devices has none, in its own words (its last_error after initialize),
  // e.g. "no CUDA driver (libcuda.so.1: cannot open shared object file)"; "" when it has devices.
  const std::string& no_devices_reason() const { return no_devices_reason_; }
  // The plugin's table, copied into a full-size table whose slots past the plugin's struct_size
  // are NULL.
  const hm_device_plugin_api& api() const { return api_; }

  // Throws Error("<plugin>: <operation>: <plugin's last_error>") unless status is HM_OK.
  void check(hm_status status, const char* operation) const;
  [[noreturn]] void raise(hm_status status, const char* operation) const;

 private:
  friend std::shared_ptr<Plugin> load_plugin_file(const std::string&, const std::string&,
                                                  std::string*, uint32_t);
  std::string path_, name_, version_, no_devices_reason_;
  uint32_t plugin_minor_ = 0, negotiated_minor_ = 0;
  int32_t device_count_ = 0;
  hm_device_plugin_api api_{};
};

struct RefusedPlugin {
  std::string path;
  std::string reason;
};

struct PluginLoadOptions {
  std::vector<std::string> explicit_paths;
  // Search HETMESH_PLUGIN_PATH and the install folder after the explicit paths.
  bool search = true;
  // The plugins wanted, by name; empty: all. The searched folders' files are then loaded only
  // where the name in the file name is wanted, so that a job never runs the initialize() of a
  // vendor runtime it does not use (a slow or broken one held up or crashed it); where a wanted
  // name has no such file there, every file is loaded, to find it by the name it gives itself.
  // Explicit paths and HETMESH_PLUGINS are always loaded.
  std::set<std::string> wanted;
  // Run each plugin's initialize() first in a child process (hetmesh-plugin-probe), so a plugin
  // that crashes or hangs is refused instead of killing this process. Costs one process per plugin.
  bool isolate = false;
  std::chrono::milliseconds isolate_timeout{15000};
  // Options per plugin name, passed to initialize() as hm_host_api.options ("k=v;k=v").
  std::map<std::string, std::string> plugin_options;
};

class PluginRegistry {
 public:
  // Loads what the options and environment name. Never throws for a bad plugin: it is refused.
  static PluginRegistry load(const PluginLoadOptions& options = {});

  const std::vector<std::shared_ptr<Plugin>>& plugins() const { return plugins_; }
  const std::vector<RefusedPlugin>& refused() const { return refused_; }
  // Where this load looked, in order: "HETMESH_PLUGINS: a.so:b.so (nothing else searched)",
  // "--plugin or [plugins] paths: x.so", "HETMESH_PLUGIN_PATH: /dir", "installed plugins: /dir".
  const std::vector<std::string>& searched() const { return searched_; }
  std::shared_ptr<Plugin> find(const std::string& name) const;

  // Every device of every plugin, in plugin order.
  std::vector<Device> devices() const;
  // "cpu:0", "asic_stub:1"; a bare "cpu" means "cpu:0". Throws Error naming what is available.
  Device device(const std::string& selector) const;

 private:
  std::vector<std::shared_ptr<Plugin>> plugins_;
  std::vector<RefusedPlugin> refused_;
  std::vector<std::string> searched_;
};

// The folder installed plugins live in, derived from where libhetmesh.so is.
std::string installed_plugin_dir();
// Where hetmesh-plugin-probe lives.
std::string plugin_probe_path();

}  // namespace hetmesh

#pragma GCC visibility pop
