#include <hetmesh/core/device.hpp>
#include <hetmesh/core/log.hpp>
#include <hetmesh/core/plugin.hpp>
#include <hetmesh/core/subprocess.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <dirent.h>
#include <dlfcn.h>
#include <sys/auxv.h>
#include <unistd.h>
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace hetmesh {
namespace {

// hm_host_api.log: a plugin's lines go through the host's log, so they carry the same prefix
// (time, host, pid, role:rank) and go to the same places. Called from C: nothing escapes.
void plugin_log(void*, int32_t level, const char* message) noexcept {
  LogLevel l = level <= HM_LOG_ERROR  ? LogLevel::error
               : level == HM_LOG_WARN ? LogLevel::warn
               : level == HM_LOG_INFO ? LogLevel::info
                                      : LogLevel::debug;
  try {
    log(l, "plugin: {}", message ? message : "(null)");
  } catch (...) {  // out of memory while formatting: the line is lost, the plugin is not
  }
}

const hm_host_api* host_api(const std::string& options, uint32_t abi_minor) {
  // initialize() may read `options` only during the call; the rest must live forever.
  static hm_host_api api{};
  api.struct_size = sizeof api;
  api.abi_major = HM_DEVICE_PLUGIN_ABI_MAJOR;
  api.abi_minor = abi_minor;
  api.log = plugin_log;
  api.log_context = nullptr;
  api.options = options.c_str();
  return &api;
}

// Required slots, by name, for the refusal message.
struct Slot {
  const char* name;
  size_t offset;
};
#define HM_SLOT(s)                        \
  Slot {                                  \
#s, offsetof(hm_device_plugin_api, s) \
  }
constexpr Slot kRequiredSlots[] = {
    HM_SLOT(initialize),        HM_SLOT(last_error),     HM_SLOT(device_count),
    HM_SLOT(device_properties), HM_SLOT(mem_alloc),      HM_SLOT(mem_free),
    HM_SLOT(pointer_query),     HM_SLOT(memcpy_async),   HM_SLOT(memset_async),
    HM_SLOT(stream_create),     HM_SLOT(stream_destroy), HM_SLOT(stream_synchronize),
    HM_SLOT(stream_query),      HM_SLOT(event_create),   HM_SLOT(event_destroy),
    HM_SLOT(event_record),      HM_SLOT(event_query),    HM_SLOT(event_synchronize),
    HM_SLOT(stream_wait_event)};
#undef HM_SLOT

bool slot_present(const hm_device_plugin_api& api, size_t offset) {
  void* p = nullptr;
  std::memcpy(&p, reinterpret_cast<const char*>(&api) + offset, sizeof p);
  return p != nullptr;
}

bool valid_name(const char* name) {
  if (name == nullptr || *name == '\0' || std::strlen(name) > 32) return false;
  for (const char* c = name; *c; ++c)
    if (!((*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') || *c == '_')) return false;
  return true;
}

const char* safe_last_error(const hm_device_plugin_api& api) {
  const char* e = api.last_error ? api.last_error() : nullptr;
  return e && *e ? e : "(no message)";
}

// Everything dlopen()ed by this process, by library handle: a plugin is initialized once per
// process however many registries load it, and a refusal is remembered.
struct Loaded {
  std::shared_ptr<Plugin> plugin;
  std::string refusal;
};
std::mutex g_loaded_mutex;
std::map<void*, Loaded>& loaded() {
  static auto* m = new std::map<void*, Loaded>;  // never destroyed: plugins are never unloaded
  return *m;
}

std::vector<std::string> split(const char* text, char separator) {
  std::vector<std::string> parts;
  if (text == nullptr) return parts;
  std::string all(text);
  size_t start = 0;
  while (start <= all.size()) {
    size_t end = all.find(separator, start);
    if (end == std::string::npos) end = all.size();
    if (end > start) parts.push_back(all.substr(start, end - start));
    start = end + 1;
  }
  return parts;
}

const char* secure_getenv_compat(const char* name) {
  // Honour no environment in setuid/setgid processes, as the dynamic loader does.
  if (getauxval(AT_SECURE) != 0) return nullptr;
  return std::getenv(name);
}

std::vector<std::string> plugins_in(const std::string& dir) {
  std::vector<std::string> found;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return found;
  while (dirent* e = readdir(d)) {
    std::string n = e->d_name;
    if (n.rfind(HM_DEVICE_PLUGIN_PREFIX, 0) == 0 && n.size() > 3 &&
        n.compare(n.size() - 3, 3, ".so") == 0)
      found.push_back(dir + "/" + n);
  }
  closedir(d);
  std::sort(found.begin(), found.end());
  return found;
}

std::string library_dir() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&installed_plugin_dir), &info) == 0 || !info.dli_fname)
    return {};
  std::string path = info.dli_fname;
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? std::string(".") : path.substr(0, slash);
}

// "; it said: <the first line the probe wrote on stderr>": a runtime's or a sanitizer's last words
// say more than the signal alone. Empty if it wrote nothing.
std::string probe_said(const std::string& err) {
  size_t start = err.find_first_not_of(" \t\r\n");
  if (start == std::string::npos) return {};
  std::string line = err.substr(start, err.find('\n', start) - start);
  if (line.size() > 240) line = line.substr(0, 240) + "...";
  return "; it said: " + line;
}

// Runs hetmesh-plugin-probe on `path` and returns a refusal reason, or "" if it loaded.
std::string probe_in_child(const std::string& path, const std::string& options,
                           std::chrono::milliseconds timeout) {
  std::string probe = plugin_probe_path();
  ProcessResult r;
  try {
    r = run_process({probe, path, options}, timeout);
  } catch (const Error& e) {
    return fmt::format("could not run the isolation probe {}: {}", probe, e.what());
  }
  if (r.timed_out)
    return fmt::format("loading or initialize() did not finish within {} ms (probe killed){}",
                       timeout.count(), probe_said(r.err));
  if (r.signal != 0)
    return fmt::format("loading or initialize() crashed the probe process with {}{}", r.describe(),
                       probe_said(r.err));
  if (r.exit_code == 0) return {};
  std::string reason = r.out;
  while (!reason.empty() && reason.back() == '\n')
    reason.pop_back();
  return reason.empty() ? fmt::format("probe failed with {}", r.describe()) : reason;
}

}  // namespace

void Plugin::raise(hm_status status, const char* operation) const {
  throw Error(status, fmt::format("{}: {} failed ({}): {}", name_, operation, status_name(status),
                                  safe_last_error(api_)));
}

void Plugin::check(hm_status status, const char* operation) const {
  if (status != HM_OK) raise(status, operation);
}

std::string installed_plugin_dir() {
  return library_dir() + "/hetmesh/plugins";
}

std::string plugin_probe_path() {
  return library_dir() + "/" HETMESH_PROBE_FROM_LIBDIR "/hetmesh-plugin-probe";
}

std::shared_ptr<Plugin> load_plugin_file(const std::string& path, const std::string& options,
                                         std::string* refusal, uint32_t host_abi_minor) {
  host_abi_minor = std::min<uint32_t>(host_abi_minor, HM_DEVICE_PLUGIN_ABI_MINOR);
  dlerror();
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* e = dlerror();
    *refusal = fmt::format("dlopen failed: {}", e ? e : "unknown error");
    return nullptr;
  }
  std::lock_guard lock(g_loaded_mutex);
  if (auto it = loaded().find(handle); it != loaded().end()) {
    *refusal = it->second.refusal;
    return it->second.plugin;
  }
  auto refuse = [&](std::string reason) -> std::shared_ptr<Plugin> {
    loaded()[handle] = Loaded{nullptr, reason};
    *refusal = std::move(reason);
    return nullptr;
  };

  auto entry =
      reinterpret_cast<hm_device_plugin_entry_fn>(dlsym(handle, HM_DEVICE_PLUGIN_ENTRY_V1));
  if (entry == nullptr)
    return refuse(
        fmt::format("does not export {} (not a hetmesh ABI v1 plugin)", HM_DEVICE_PLUGIN_ENTRY_V1));
  const hm_device_plugin_api* table = entry();
  if (table == nullptr) return refuse(fmt::format("{}() returned NULL", HM_DEVICE_PLUGIN_ENTRY_V1));
  constexpr size_t kVersionEnd = offsetof(hm_device_plugin_api, abi_minor) + sizeof(uint32_t);
  if (table->struct_size < kVersionEnd)
    return refuse(
        fmt::format("table struct_size {} is too small to hold a version", table->struct_size));
  if (table->abi_major != HM_DEVICE_PLUGIN_ABI_MAJOR)
    return refuse(fmt::format("ABI major version {} is not supported (this host speaks {}.{})",
                              table->abi_major, HM_DEVICE_PLUGIN_ABI_MAJOR,
                              HM_DEVICE_PLUGIN_ABI_MINOR));
  if (table->struct_size < HM_DEVICE_PLUGIN_API_MIN_SIZE)
    return refuse(
        fmt::format("table struct_size {} is shorter than the {} bytes the required slots need",
                    table->struct_size, HM_DEVICE_PLUGIN_API_MIN_SIZE));
  if (table->struct_size % sizeof(void*) != 0 || table->struct_size > 65536)
    return refuse(
        fmt::format("table struct_size {} is not a plausible table size", table->struct_size));

  auto plugin = std::make_shared<Plugin>();
  std::memcpy(&plugin->api_, table, std::min(table->struct_size, sizeof(hm_device_plugin_api)));
  plugin->api_.struct_size = sizeof(hm_device_plugin_api);
  const hm_device_plugin_api& api = plugin->api_;
  if (!valid_name(api.name)) return refuse("name is missing or not of the form [a-z0-9_]{1,32}");
  for (const Slot& slot : kRequiredSlots)
    if (!slot_present(api, slot.offset))
      return refuse(fmt::format("required slot '{}' is NULL", slot.name));

  plugin->path_ = path;
  plugin->name_ = api.name;
  plugin->version_ = api.version ? api.version : "";
  plugin->plugin_minor_ = table->abi_minor;
  plugin->negotiated_minor_ = std::min<uint32_t>(table->abi_minor, host_abi_minor);

  hm_status status = api.initialize(host_api(options, host_abi_minor));
  if (status != HM_OK)
    return refuse(
        fmt::format("initialize() failed with {}: {}", status_name(status), safe_last_error(api)));
  int32_t count = 0;
  status = api.device_count(&count);
  if (status != HM_OK || count < 0)
    return refuse(fmt::format("device_count() failed with {}: {}", status_name(status),
                              safe_last_error(api)));
  plugin->device_count_ = count;
  if (count == 0) {
    plugin->no_devices_reason_ = safe_last_error(api);
    log(LogLevel::info, "{}: no devices: {}", path, plugin->no_devices_reason_);
  }
  loaded()[handle] = Loaded{plugin, {}};
  log(LogLevel::debug, "loaded plugin {} {} from {} (ABI {}.{}, {} devices)", plugin->name_,
      plugin->version_, path, HM_DEVICE_PLUGIN_ABI_MAJOR, plugin->negotiated_minor_, count);
  return plugin;
}

PluginRegistry PluginRegistry::load(const PluginLoadOptions& options) {
  PluginRegistry registry;
  std::vector<std::string> candidates;
  size_t searched_from = 0;  // candidates from here on were found in folders
  if (const char* forced = secure_getenv_compat("HETMESH_PLUGINS"); forced && *forced) {
    candidates = split(forced, ':');
    searched_from = candidates.size();
    registry.searched_.push_back(
        fmt::format("HETMESH_PLUGINS: {} (nothing else searched)", forced));
  } else {
    candidates = options.explicit_paths;
    if (!candidates.empty())
      registry.searched_.push_back(
          fmt::format("--plugin or [plugins] paths: {}", fmt::join(candidates, ", ")));
    searched_from = candidates.size();
    if (options.search) {
      for (const auto& dir : split(secure_getenv_compat("HETMESH_PLUGIN_PATH"), ':')) {
        registry.searched_.push_back(fmt::format("HETMESH_PLUGIN_PATH: {}", dir));
        for (auto& p : plugins_in(dir))
          candidates.push_back(std::move(p));
      }
      registry.searched_.push_back(fmt::format("installed plugins: {}", installed_plugin_dir()));
      for (auto& p : plugins_in(installed_plugin_dir()))
        candidates.push_back(std::move(p));
    }
  }

  // Options and `wanted` are keyed by plugin name, which is known only after loading; the name in
  // the file name is the convention and is what we can use before that.
  auto guessed_name = [](const std::string& path) {
    std::string file = path.substr(path.rfind('/') + 1);
    return file.rfind(HM_DEVICE_PLUGIN_PREFIX, 0) == 0
               ? file.substr(std::strlen(HM_DEVICE_PLUGIN_PREFIX),
                             file.size() - std::strlen(HM_DEVICE_PLUGIN_PREFIX) - 3)
               : file;
  };
  if (!options.wanted.empty() && searched_from < candidates.size()) {
    std::set<std::string> named;
    for (const std::string& path : candidates)
      named.insert(guessed_name(path));
    const bool all_named = std::all_of(options.wanted.begin(), options.wanted.end(),
                                       [&](const std::string& w) { return named.count(w) > 0; });
    if (all_named) {
      auto unwanted = [&](const std::string& path) {
        return options.wanted.count(guessed_name(path)) == 0;
      };
      candidates.erase(std::remove_if(candidates.begin() + static_cast<ptrdiff_t>(searched_from),
                                      candidates.end(), unwanted),
                       candidates.end());
      registry.searched_.push_back(fmt::format("from those folders only {} (the plugins asked for)",
                                               fmt::join(options.wanted, ", ")));
    }
  }

  for (const auto& path : candidates) {
    auto opt = options.plugin_options.find(guessed_name(path));
    std::string plugin_options = opt == options.plugin_options.end() ? "" : opt->second;

    if (std::any_of(registry.plugins_.begin(), registry.plugins_.end(),
                    [&](const auto& p) { return p->path() == path; }))
      continue;
    std::string refusal;
    if (options.isolate) refusal = probe_in_child(path, plugin_options, options.isolate_timeout);
    std::shared_ptr<Plugin> plugin;
    if (refusal.empty()) plugin = load_plugin_file(path, plugin_options, &refusal);
    if (!plugin) {
      log(LogLevel::warn, "refused plugin {}: {}", path, refusal);
      registry.refused_.push_back({path, refusal});
      continue;
    }
    if (auto existing = registry.find(plugin->name())) {
      if (existing != plugin)
        registry.refused_.push_back({path, fmt::format("plugin name '{}' is already provided by {}",
                                                       plugin->name(), existing->path())});
      continue;
    }
    registry.plugins_.push_back(std::move(plugin));
  }
  return registry;
}

std::shared_ptr<Plugin> PluginRegistry::find(const std::string& name) const {
  for (const auto& p : plugins_)
    if (p->name() == name) return p;
  return nullptr;
}

std::vector<Device> PluginRegistry::devices() const {
  std::vector<Device> all;
  for (const auto& p : plugins_)
    for (int32_t i = 0; i < p->device_count(); ++i)
      all.emplace_back(p, i);
  return all;
}

Device PluginRegistry::device(const std::string& selector) const {
  std::string name = selector;
  int32_t index = 0;
  if (size_t colon = selector.find(':'); colon != std::string::npos) {
    name = selector.substr(0, colon);
    std::string digits = selector.substr(colon + 1);
    char* end = nullptr;
    long value = std::strtol(digits.c_str(), &end, 10);
    if (digits.empty() || *end != '\0' || value < 0 || value > INT32_MAX)
      throw Error(
          HM_ERR_INVALID_ARGUMENT,
          fmt::format("device selector '{}': '{}' is not a device index", selector, digits));
    index = static_cast<int32_t>(value);
  }
  auto plugin = find(name);
  if (!plugin) {
    std::string known;
    for (const auto& p : plugins_)
      known += (known.empty() ? "" : ", ") + p->name();
    for (const auto& r : refused_)
      if (r.path.find(HM_DEVICE_PLUGIN_PREFIX + name + ".so") != std::string::npos)
        throw Error(HM_ERR_INVALID_ARGUMENT,
                    fmt::format("device selector '{}': plugin '{}' was refused: {}: {}", selector,
                                name, r.path, r.reason));
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("device selector '{}': no plugin named '{}' was loaded (loaded: {})",
                            selector, name, known.empty() ? "none" : known));
  }
  if (index >= plugin->device_count())
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("device selector '{}': plugin '{}' has {} device(s)", selector, name,
                            plugin->device_count()));
  return Device(plugin, index);
}

}  // namespace hetmesh
