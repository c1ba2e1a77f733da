// Reading and validating the job configuration (job_config.hpp): the schema, its defaults and
// its cross-checks, on the checked TOML reader of core (toml_reader.hpp), which rejects unknown
// keys and prefixes every failure with "<file>:<line>:<column>: [table] key: ".
#include <hetmesh/afd/job.hpp>
#include <hetmesh/afd/job_config.hpp>
#include <hetmesh/core/bounded_file.hpp>
#include <hetmesh/core/error.hpp>
#include <hetmesh/core/socket.hpp>
#include <hetmesh/core/toml_reader.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <limits>
#include <optional>

namespace hetmesh::afd {
namespace {

constexpr int64_t kIntMax = std::numeric_limits<int>::max();
// Caps that keep every size the engine derives far from overflow.
constexpr int64_t kMaxInstances = 1024;
constexpr int64_t kMaxLayers = 1024;
constexpr int64_t kMaxMicroBatches = 64;
constexpr int64_t kMaxQueueDepth = 64;
constexpr int64_t kMaxTimeoutMs = 24LL * 3600 * 1000;     // a day; keeps deadlines representable
constexpr uint64_t kMaxMicroBatchBytes = 4ULL << 30;      // tokens x hidden x dtype, one direction
constexpr int64_t kMaxTopK = 1024;                        // experts per token; routing is 8 B each
constexpr uint64_t kMaxInstanceSlotBytes = 256ULL << 30;  // every slot of one A or F instance
constexpr int64_t kMaxCpu = 1023;                         // CPU_SETSIZE - 1
// A config is a page of text; a file past this is not one (or is /dev/zero).
constexpr size_t kMaxConfigBytes = 4 << 20;

// The names in the file, indexed by the enums' values.
constexpr std::array<std::string_view, 6> kDtypeNames = {"fp8",  "bf16",  "fp16",
                                                         "fp32", "int32", "int64"};
// The hidden states' (a2f_dtype, f2a_dtype): the floating ones, first in kDtypeNames.
constexpr std::array<std::string_view, 4> kHiddenDtypeNames = {"fp8", "bf16", "fp16", "fp32"};
constexpr std::array<std::string_view, 2> kGatherNames = {"all", "eager"};
constexpr std::array<std::string_view, 3> kTopologyNames = {"all", "groups", "map"};
constexpr std::array<std::string_view, 2> kRendezvousNames = {"tcp", "etcd"};
// "auto", then the transports by name (parse_transport_kind).
constexpr std::array<std::string_view, 5> kTransportNames = {"auto", "ipc", "tcp", "verbs",
                                                             "fabric"};

// The plugin ABI's name grammar: [a-z0-9_]{1,32}.
bool valid_plugin_name(std::string_view name) {
  return !name.empty() && name.size() <= 32 && std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
  });
}

// "name" or "name:index", normalised to "name:index".
std::optional<std::string> normalize_selector(std::string_view text) {
  size_t colon = text.find(':');
  std::string_view name = text.substr(0, colon);
  if (!valid_plugin_name(name)) return std::nullopt;
  int index = 0;
  if (colon != std::string_view::npos) {
    std::string_view digits = text.substr(colon + 1);
    if (digits.empty() || digits.size() > 6 ||
        !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
      return std::nullopt;
    std::from_chars(digits.data(), digits.data() + digits.size(), index);
  }
  return fmt::format("{}:{}", name, index);
}

// [devices] attention / ffn: one selector for every instance, or one per instance.
// A per-instance list of strings: one string for every instance of the role, or an array of one
// per instance; `fallback` for every instance when the key is absent. `normalize` returns the
// stored form of a value, or nullopt with `bad` saying what is wrong. `what` names a value
// ("selector").
template <typename Normalize, typename Bad>
std::vector<std::string> read_per_instance(const TomlSection& s, std::string_view key, int count,
                                           const char* role, const std::string& fallback,
                                           const char* what, Normalize normalize, Bad bad) {
  const toml::table* table = s.raw();
  const toml::node* n = table ? table->get(key) : nullptr;
  if (!n) return std::vector<std::string>(static_cast<size_t>(count), fallback);
  if (n->is_string()) {
    auto value = normalize(n->as_string()->get());
    if (!value) s.fail(key, bad(n->as_string()->get()));
    return std::vector<std::string>(static_cast<size_t>(count), *value);
  }
  if (!n->is_array())
    s.fail(key, fmt::format("expected a {} string or an array of them, got {}", what,
                            toml_describe(*n)));
  auto values = s.array<std::string>(key, "an array", [&](size_t i, const toml::node& e) {
    if (!e.is_string())
      s.fail_element(key, i, e,
                     fmt::format("expected a {} string, got {}", what, toml_describe(e)));
    auto value = normalize(e.as_string()->get());
    if (!value) s.fail_element(key, i, e, bad(e.as_string()->get()));
    return *value;
  });
  if (values.size() != static_cast<size_t>(count))
    s.fail(key, fmt::format("{} {}(s) for {} {} instance(s) ([job] {} = {}); give one per "
                            "instance or a single string for all",
                            values.size(), what, count, role, role[0] == 'A' ? "attention" : "ffn",
                            count));
  return values;
}

std::vector<std::string> read_selectors(const TomlSection& s, std::string_view key, int count,
                                        const char* role) {
  return read_per_instance(
      s, key, count, role, "cpu:0", "selector", normalize_selector, [](const std::string& text) {
        return fmt::format("bad device selector {} (expected name:index, e.g. \"cpu:0\")",
                           toml_quote(text));
      });
}

// [hosts] attention / ffn: an address this host's instances listen on, as listen_host is.
std::vector<std::string> read_hosts(const TomlSection& s, std::string_view key, int count,
                                    const char* role, const std::string& fallback) {
  return read_per_instance(
      s, key, count, role, fallback, "host address",
      [](const std::string& text) {
        return text.empty() || text.find_first_of(" /") != std::string::npos
                   ? std::nullopt
                   : std::optional<std::string>(text);
      },
      [](const std::string& text) {
        return fmt::format("bad host address {} (expected a host name or an address)",
                           toml_quote(text));
      });
}

// [hosts] attention_nic / ffn_nic: an RDMA device name, or "" for the first active one.
std::vector<std::string> read_nics(const TomlSection& s, std::string_view key, int count,
                                   const char* role, const std::string& fallback) {
  return read_per_instance(
      s, key, count, role, fallback, "NIC",
      [](const std::string& text) { return std::optional<std::string>(text); },
      [](const std::string& text) { return toml_quote(text); });
}

// [transport] nics: "auto" (verbs), or the rails' NICs, 2 to 16 different names (RDMA devices for
// verbs, local addresses for tcp, either for fabric: an address, or a provider's domain).
std::vector<std::string> read_rails(const TomlSection& s, std::optional<TransportKind> kind) {
  if (!s.has("nics")) return {};
  const bool rails_kind =
      kind == TransportKind::verbs || kind == TransportKind::tcp || kind == TransportKind::fabric;
  if (!rails_kind)
    s.fail("nics",
           "rails are for kind = \"verbs\", \"tcp\" or \"fabric\" (name the kind: each takes "
           "different names, RDMA devices, local addresses, or either)");
  if (s.raw()->get("nics")->is_string()) {
    if (s.string("nics", "") != "auto" || kind != TransportKind::verbs)
      s.fail("nics",
             "expected \"auto\" (verbs: every RDMA NIC near the device) or a list of "
             "NICs");
    return {"auto"};
  }
  auto nics = s.array<std::string>(
      "nics", "a list of NICs", [&](size_t i, const toml::node& n) -> std::string {
        if (!n.is_string() || n.as_string()->get().empty() || n.as_string()->get() == "auto")
          s.fail_element("nics", i, n, "a NIC's name (an RDMA device, or a local address)");
        return n.as_string()->get();
      });
  std::vector<std::string> unique = nics;
  std::sort(unique.begin(), unique.end());
  if (nics.size() < 2 || nics.size() > 16 ||
      std::adjacent_find(unique.begin(), unique.end()) != unique.end())
    s.fail("nics",
           fmt::format("2 to 16 different NICs make rails, got [{}]", fmt::join(nics, ", ")));
  return nics;
}

// A plugin's options as a "k=v;k=v" string: given so (checked for shape) or as a table of scalars.
std::string read_plugin_options(const TomlReporter& reporter, const std::string& plugin,
                                const toml::key& key, const toml::node& n) {
  std::string label = fmt::format("[plugins.options] {}", plugin);
  if (n.is_string()) {
    const std::string& text = n.as_string()->get();
    size_t start = 0;
    while (start <= text.size()) {
      size_t end = std::min(text.find(';', start), text.size());
      std::string_view item(text.data() + start, end - start);
      size_t eq = item.find('=');
      if (!item.empty() && (eq == std::string_view::npos || eq == 0))
        reporter.fail(key.source(),
                      fmt::format("{}: option {} is not key=value", label, toml_quote(item)));
      start = end + 1;
    }
    return text;
  }
  if (!n.is_table())
    reporter.fail(key.source(),
                  fmt::format("{}: expected a \"key=value;...\" string or a table, got {}", label,
                              toml_describe(n)));
  std::vector<std::string> items;
  for (auto&& [option, value] : *n.as_table()) {
    std::string where = fmt::format("[plugins.options.{}] {}", plugin, option.str());
    if (option.str().find_first_of("=;") != std::string_view::npos)
      reporter.fail(option.source(), where + ": option names cannot contain '=' or ';'");
    std::string text;
    if (value.is_string()) text = value.as_string()->get();
    if (value.is_integer()) text = fmt::format("{}", value.as_integer()->get());
    if (value.is_floating_point()) text = fmt::format("{}", value.as_floating_point()->get());
    if (value.is_boolean()) text = value.as_boolean()->get() ? "true" : "false";
    if (!value.is_value() || value.is_date() || value.is_time() || value.is_date_time())
      reporter.fail(option.source(), fmt::format("{}: expected a string, number or boolean, got {}",
                                                 where, toml_describe(value)));
    if (text.find(';') != std::string::npos)
      reporter.fail(option.source(), where + ": option values cannot contain ';'");
    items.push_back(fmt::format("{}={}", option.str(), text));
  }
  return fmt::format("{}", fmt::join(items, ";"));
}

// The plugins a job's options may be for: those its devices are on, and those of its [plugins]
// paths (named, as the loader keys their options, by the file name: libhetmesh-device-NAME.so).
std::vector<std::string> plugins_of_job(const DevicesSection& devices,
                                        const std::vector<std::string>& paths) {
  std::vector<std::string> names;
  auto add = [&](std::string name) {
    if (std::find(names.begin(), names.end(), name) == names.end())
      names.push_back(std::move(name));
  };
  for (const auto* role : {&devices.attention, &devices.ffn})
    for (const std::string& selector : *role)
      add(selector.substr(0, selector.find(':')));
  constexpr std::string_view kPrefix = HM_DEVICE_PLUGIN_PREFIX, kSuffix = ".so";
  for (const std::string& path : paths) {
    std::string_view file = std::string_view(path).substr(path.rfind('/') + 1);
    if (file.starts_with(kPrefix) && file.ends_with(kSuffix))
      add(std::string(file.substr(kPrefix.size(), file.size() - kPrefix.size() - kSuffix.size())));
  }
  return names;
}

PluginsSection read_plugins(const TomlReporter& reporter, const TomlSection& root,
                            const DevicesSection& devices) {
  static constexpr std::array<std::string_view, 2> kKeys = {"paths", "options"};
  TomlSection s = root.table("plugins", kKeys);
  PluginsSection out;
  out.paths =
      s.array<std::string>("paths", "an array of paths", [&](size_t i, const toml::node& e) {
        if (!e.is_string() || e.as_string()->get().empty())
          s.fail_element("paths", i, e,
                         fmt::format("expected a non-empty path, got {}", toml_describe(e)));
        return e.as_string()->get();
      });
  // Keys of [plugins.options] are plugin names, so it is read by hand rather than as a TomlSection.
  const toml::node* options = s.raw() ? s.raw()->get("options") : nullptr;
  if (!options) return out;
  if (!options->is_table())
    s.fail("options",
           fmt::format("expected a table of plugin names, got {}", toml_describe(*options)));
  for (auto&& [key, value] : *options->as_table()) {
    std::string name(key.str());
    if (!valid_plugin_name(name))
      reporter.fail(key.source(), fmt::format("[plugins.options] {}: not a plugin name "
                                              "([a-z0-9_], at most 32 characters)",
                                              name));
    out.options[name] = read_plugin_options(reporter, name, key, value);
    // Options for a plugin that no device of the job is on would be given to nobody: most often
    // a misspelt name.
    const std::vector<std::string> known = plugins_of_job(devices, out.paths);
    if (std::find(known.begin(), known.end(), name) == known.end()) {
      std::vector<std::string_view> candidates(known.begin(), known.end());
      reporter.fail(key.source(),
                    fmt::format("[plugins.options] {}: no device of this job is on a plugin of "
                                "that name, so nothing would read these options{}; the job's "
                                "plugins are {} (from [devices] and [plugins] paths)",
                                name, toml_did_you_mean(name, candidates), fmt::join(known, ", ")));
    }
  }
  return out;
}

// [job] ffns_of, with topology = "map": for each A, the Fs it sends to, each once; every F served.
std::vector<std::vector<int>> read_map(const TomlSection& job, const JobSection& j) {
  if (j.topology != JobTopology::map) {
    if (job.has("ffns_of"))
      job.fail("ffns_of", "names each A's Fs for topology = \"map\" only (the job's is " +
                              std::string(to_string(j.topology)) + ")");
    return {};
  }
  if (!job.has("ffns_of"))
    job.fail("topology", "\"map\" needs [job] ffns_of: for each A, the Fs it sends to");
  std::vector<int> served(static_cast<size_t>(j.ffn), 0);
  auto map = job.array<std::vector<int>>(
      "ffns_of", "an array of arrays of F ranks", [&](size_t a, const toml::node& e) {
        if (!e.is_array() || e.as_array()->empty())
          job.fail_element("ffns_of", a, e,
                           fmt::format("attention {}: expected a non-empty array of F ranks, "
                                       "got {}",
                                       a, toml_describe(e)));
        std::vector<int> ffns;
        for (const toml::node& f : *e.as_array()) {
          const int64_t rank = f.is_integer() ? f.as_integer()->get() : -1;
          if (!f.is_integer() || rank < 0 || rank >= j.ffn ||
              std::find(ffns.begin(), ffns.end(), rank) != ffns.end())
            job.fail_element("ffns_of", a, e,
                             fmt::format("attention {}: {} is not an F rank of its own (0..{}, "
                                         "each once)",
                                         a, toml_describe(f), j.ffn - 1));
          ffns.push_back(static_cast<int>(rank));
          ++served[static_cast<size_t>(rank)];
        }
        return ffns;
      });
  if (map.size() != static_cast<size_t>(j.attention))
    job.fail("ffns_of", fmt::format("{} lists for {} As (one each)", map.size(), j.attention));
  for (int f = 0; f < j.ffn; ++f)
    if (served[static_cast<size_t>(f)] == 0)
      job.fail("ffns_of", fmt::format("ffn {} serves no A", f));
  return map;
}

// [model.a2f_tensors]: its keys are the tensors' names, so they are checked here (TomlSection
// takes the names it is given as its known keys), each value a table of dtype and columns.
std::vector<TensorSection> read_tensors(const TomlReporter& reporter, const TomlSection& model,
                                        int tokens) {
  const toml::node* raw = model.raw() ? model.raw()->get("a2f_tensors") : nullptr;
  if (raw == nullptr) return {};
  if (!raw->is_table())
    model.fail("a2f_tensors",
               fmt::format("expected a table of tensor names, got {}", toml_describe(*raw)));
  static constexpr std::array<std::string_view, 5> kReserved = {"tokens", "routing", "experts",
                                                                "weights", "output"};
  std::vector<std::string> names;
  for (auto&& [key, value] : *raw->as_table()) {
    const std::string name(key.str());
    if (!valid_plugin_name(name) ||
        std::find(kReserved.begin(), kReserved.end(), name) != kReserved.end())
      reporter.fail(key.source(),
                    fmt::format("[model.a2f_tensors] {}: not a tensor name ([a-z0-9_], at most 32 "
                                "characters, none of {})",
                                name, fmt::join(kReserved, ", ")));
    names.push_back(name);
  }
  if (names.size() > static_cast<size_t>(kMaxA2fTensors - 2))
    model.fail("a2f_tensors", fmt::format("{} tensors; a push carries at most {} beside the "
                                          "tokens and routing",
                                          names.size(), kMaxA2fTensors - 2));
  const std::vector<std::string_view> known(names.begin(), names.end());
  TomlSection tensors = model.table("a2f_tensors", known);
  static constexpr std::array<std::string_view, 2> kTensor = {"dtype", "columns"};
  std::vector<TensorSection> out;
  for (const std::string& name : names) {
    TomlSection tensor = tensors.table(name, kTensor);
    TensorSection t{name, tensor.enumeration("dtype", Dtype::fp32, kDtypeNames),
                    tensor.small_integer("columns", 1, 1, 1 << 20)};
    const uint64_t bytes = uint64_t{static_cast<uint32_t>(tokens)} *
                           static_cast<uint64_t>(t.columns) * dtype_bytes(t.dtype);
    if (bytes > kMaxMicroBatchBytes)
      tensor.fail("columns",
                  fmt::format("tokens x columns x {} bytes = {} bytes per micro-batch exceeds the "
                              "{} GiB limit",
                              dtype_bytes(t.dtype), bytes, kMaxMicroBatchBytes >> 30));
    out.push_back(std::move(t));
  }
  return out;
}

// The slots one instance allocates (EngineSpec::instance_slot_bytes, computed as the engine will)
// stay under a cap; with the caps above, none of that arithmetic can overflow.
void check_slots_fit(const TomlSection& job, const TomlSection& model, const JobConfig& c) {
  for (Role role : {Role::attention, Role::ffn}) {
    uint64_t bytes = job_shape(c, role).instance_slot_bytes();
    if (bytes <= kMaxInstanceSlotBytes) continue;
    std::string what = fmt::format(
        "the slots of each {} instance would take {} bytes ({}), more than the {} GiB limit; "
        "use fewer micro_batches, tokens or instances",
        role == Role::attention ? "attention" : "ffn", bytes,
        role == Role::attention ? "micro_batches x (A2F slot + ffn x F2A slot)"
                                : "micro_batches x (row spaces of its As' A2F tensors and outputs)",
        kMaxInstanceSlotBytes >> 30);
    if (job.has("micro_batches")) job.fail("micro_batches", what);
    if (model.has("tokens")) model.fail("tokens", what);
    job.fail(role == Role::attention ? "ffn" : "attention", what);
  }
}

void check_model_fits(const TomlSection& job, const TomlSection& model, const JobConfig& c) {
  if (c.model.top_k > c.model.experts) {
    if (model.has("top_k"))
      model.fail("top_k",
                 fmt::format("{} is more than experts ({})", c.model.top_k, c.model.experts));
    model.fail("experts", fmt::format("{} is less than top_k ({}, the default)", c.model.experts,
                                      c.model.top_k));
  }
  if (c.model.experts < c.job.ffn) {
    if (model.has("experts") || !job.has("ffn"))
      model.fail("experts", fmt::format("{} expert(s) cannot be split across {} F instances "
                                        "([job] ffn); each F needs at least one",
                                        c.model.experts, c.job.ffn));
    job.fail("ffn",
             fmt::format("{} F instances need at least {} experts, but [model] experts is {}",
                         c.job.ffn, c.job.ffn, c.model.experts));
  }
  uint64_t widest = std::max(dtype_bytes(c.model.a2f_dtype), dtype_bytes(c.model.f2a_dtype));
  uint64_t bytes =
      static_cast<uint64_t>(c.model.tokens) * static_cast<uint64_t>(c.model.hidden) * widest;
  if (bytes > kMaxMicroBatchBytes)
    model.fail(model.has("hidden") ? "hidden" : "tokens",
               fmt::format("tokens x hidden x {} bytes = {} bytes per micro-batch exceeds the "
                           "{} GiB limit",
                           widest, bytes, kMaxMicroBatchBytes >> 30));
  check_slots_fit(job, model, c);
}

JobConfig read_config(const TomlReporter& reporter, const toml::table& document) {
  static constexpr std::array<std::string_view, 10> kTables = {
      "job",       "model",      "devices", "hosts",   "plugins",
      "transport", "rendezvous", "tracing", "metrics", "affinity"};
  TomlSection root(reporter, document, kTables);
  JobConfig c;

  static constexpr std::array<std::string_view, 13> kJob = {
      "attention",     "ffn",          "micro_batches",   "queue_depth", "layers",
      "gather",        "topology",     "ffns_of",         "timeout_ms",  "join_timeout_ms",
      "io_timeout_ms", "heartbeat_ms", "gather_window_ms"};
  TomlSection job = root.table("job", kJob);
  c.job.attention = job.small_integer("attention", c.job.attention, 1, kMaxInstances);
  c.job.ffn = job.small_integer("ffn", c.job.ffn, 1, kMaxInstances);
  c.job.micro_batches =
      job.small_integer("micro_batches", c.job.micro_batches, 1, kMaxMicroBatches);
  c.job.queue_depth = job.small_integer("queue_depth", c.job.queue_depth, 1, kMaxQueueDepth);
  c.job.layers = job.small_integer("layers", c.job.layers, 1, kMaxLayers);
  c.job.gather = job.enumeration("gather", c.job.gather, kGatherNames);
  c.job.topology = job.enumeration("topology", c.job.topology, kTopologyNames);
  if (c.job.topology == JobTopology::groups && c.job.attention % c.job.ffn != 0)
    job.fail("topology",
             fmt::format("\"groups\" maps attention / ffn As to each F: {} As do not divide "
                         "among {} Fs",
                         c.job.attention, c.job.ffn));
  c.job.ffns_of = read_map(job, c.job);
  c.job.timeout =
      std::chrono::milliseconds(job.integer("timeout_ms", c.job.timeout.count(), 1, kMaxTimeoutMs));
  c.job.join_timeout = std::chrono::milliseconds(
      job.integer("join_timeout_ms", c.job.timeout.count(), 1, kMaxTimeoutMs));
  c.job.io_timeout = std::chrono::milliseconds(
      job.integer("io_timeout_ms", c.job.timeout.count(), 1, kMaxTimeoutMs));
  c.job.heartbeat = std::chrono::milliseconds(
      job.integer("heartbeat_ms", c.job.heartbeat.count(), 100, kMaxTimeoutMs));
  c.job.gather_window = std::chrono::milliseconds(
      job.integer("gather_window_ms", std::min(c.job.gather_window, c.job.timeout).count(), 1,
                  c.job.timeout.count()));

  static constexpr std::array<std::string_view, 7> kModel = {
      "tokens", "hidden", "experts", "top_k", "a2f_dtype", "f2a_dtype", "a2f_tensors"};
  TomlSection model = root.table("model", kModel);
  c.model.tokens = model.small_integer("tokens", c.model.tokens, 1, kIntMax);
  c.model.hidden = model.small_integer("hidden", c.model.hidden, 1, kIntMax);
  c.model.experts = model.small_integer("experts", c.model.experts, 1, kIntMax);
  c.model.top_k = model.small_integer("top_k", c.model.top_k, 0, kMaxTopK);
  c.model.a2f_dtype = model.enumeration("a2f_dtype", c.model.a2f_dtype, kHiddenDtypeNames);
  c.model.f2a_dtype = model.enumeration("f2a_dtype", c.model.f2a_dtype, kHiddenDtypeNames);
  c.model.a2f_tensors = read_tensors(reporter, model, c.model.tokens);
  check_model_fits(job, model, c);

  static constexpr std::array<std::string_view, 2> kDevices = {"attention", "ffn"};
  TomlSection devices = root.table("devices", kDevices);
  c.devices.attention = read_selectors(devices, "attention", c.job.attention, "A");
  c.devices.ffn = read_selectors(devices, "ffn", c.job.ffn, "F");

  c.plugins = read_plugins(reporter, root, c.devices);

  static constexpr std::array<std::string_view, 8> kTransport = {
      "kind",          "listen_host",      "rdma_device", "gid_index",
      "staging_slots", "staging_slot_kib", "provider",    "nics"};
  TomlSection transport = root.table("transport", kTransport);
  if (size_t kind = transport.choice("kind", 0, kTransportNames); kind != 0)
    c.transport.kind = parse_transport_kind(std::string(kTransportNames[kind]));
  c.transport.listen_host = transport.string("listen_host", c.transport.listen_host, false);
  c.transport.rdma_device = transport.string("rdma_device", c.transport.rdma_device);
  c.transport.provider = transport.string("provider", c.transport.provider, false);
  c.transport.nics = read_rails(transport, c.transport.kind);
  static constexpr std::array<std::string_view, 4> kHosts = {"attention", "ffn", "attention_nic",
                                                             "ffn_nic"};
  TomlSection hosts = root.table("hosts", kHosts);
  c.hosts.attention = read_hosts(hosts, "attention", c.job.attention, "A", c.transport.listen_host);
  c.hosts.ffn = read_hosts(hosts, "ffn", c.job.ffn, "F", c.transport.listen_host);
  c.hosts.attention_nic =
      read_nics(hosts, "attention_nic", c.job.attention, "A", c.transport.rdma_device);
  c.hosts.ffn_nic = read_nics(hosts, "ffn_nic", c.job.ffn, "F", c.transport.rdma_device);
  c.transport.gid_index = transport.small_integer("gid_index", c.transport.gid_index, -1, 65535);
  c.transport.staging_slots =
      transport.small_integer("staging_slots", c.transport.staging_slots, 2, 64);
  c.transport.staging_slot_kib =
      transport.integer("staging_slot_kib", c.transport.staging_slot_kib, 4, 64 << 10);

  static constexpr std::array<std::string_view, 3> kRendezvous = {"kind", "address", "secret_file"};
  TomlSection rendezvous = root.table("rendezvous", kRendezvous);
  c.rendezvous.kind = static_cast<RendezvousKind>(
      rendezvous.choice("kind", static_cast<size_t>(c.rendezvous.kind), kRendezvousNames));
  if (c.rendezvous.kind == RendezvousKind::etcd) {
    c.rendezvous.address = rendezvous.string("address", "http://127.0.0.1:2379");
    if (!c.rendezvous.address.starts_with("http://") &&
        !c.rendezvous.address.starts_with("https://"))
      rendezvous.fail("address", fmt::format("etcd's address is http://host:port or "
                                             "https://host:port, got {}",
                                             toml_quote(c.rendezvous.address)));
  } else {
    c.rendezvous.address = rendezvous.string("address", c.rendezvous.address);
    if (!net::parse_host_port(c.rendezvous.address))
      rendezvous.fail("address", fmt::format("expected host:port (IPv6 as [addr]:port), got {}",
                                             toml_quote(c.rendezvous.address)));
  }
  c.rendezvous.secret_file = rendezvous.string("secret_file", c.rendezvous.secret_file);

  static constexpr std::array<std::string_view, 3> kTracing = {"enabled", "chrome_trace",
                                                               "straggler_factor"};
  TomlSection tracing = root.table("tracing", kTracing);
  c.tracing.enabled = tracing.boolean("enabled", c.tracing.enabled);
  c.tracing.chrome_trace = tracing.string("chrome_trace", c.tracing.chrome_trace);
  c.tracing.straggler_factor =
      tracing.number_above("straggler_factor", c.tracing.straggler_factor, 1.0);

  static constexpr std::array<std::string_view, 1> kMetrics = {"listen"};
  TomlSection metrics = root.table("metrics", kMetrics);
  c.metrics.listen = metrics.string("listen", c.metrics.listen);
  if (!c.metrics.listen.empty()) {
    if (!net::parse_host_port(c.metrics.listen))
      metrics.fail("listen", fmt::format("expected host:port (IPv6 as [addr]:port), got {}",
                                         toml_quote(c.metrics.listen)));
    const auto port = std::stoul(c.metrics.listen.substr(c.metrics.listen.rfind(':') + 1));
    const int instances = c.job.attention + c.job.ffn;
    if (port != 0 && port + static_cast<unsigned long>(instances) - 1 > 65535)
      metrics.fail("listen",
                   fmt::format("port {} + one per instance ({}) passes 65535", port, instances));
  }

  static constexpr std::array<std::string_view, 2> kAffinity = {"comm_cpus", "poller_cpu"};
  TomlSection affinity = root.table("affinity", kAffinity);
  c.affinity.comm_cpus =
      affinity.array<int>("comm_cpus", "an array of CPU ids", [&](size_t i, const toml::node& e) {
        std::optional<int64_t> cpu =
            e.is_integer() ? e.as_integer()->get() : std::optional<int64_t>();
        if (!cpu || *cpu < 0 || *cpu > kMaxCpu)
          affinity.fail_element("comm_cpus", i, e,
                                fmt::format("expected a CPU id in 0..{}, got {}", kMaxCpu,
                                            cpu ? fmt::format("{}", *cpu) : toml_describe(e)));
        return static_cast<int>(*cpu);
      });
  c.affinity.poller_cpu = affinity.small_integer("poller_cpu", c.affinity.poller_cpu, -1, kMaxCpu);
  return c;
}

template <size_t N>
const char* name_of(const std::array<std::string_view, N>& names, size_t index) {
  return index < N ? names[index].data() : "?";  // the arrays hold literals: NUL-terminated
}

}  // namespace

size_t dtype_bytes(Dtype dtype) {
  switch (dtype) {
    case Dtype::fp8:
      return 1;
    case Dtype::bf16:
    case Dtype::fp16:
      return 2;
    case Dtype::fp32:
    case Dtype::int32:
      return 4;
    case Dtype::int64:
      return 8;
  }
  return 0;
}

const char* to_string(Dtype dtype) {
  return name_of(kDtypeNames, static_cast<size_t>(dtype));
}
const char* to_string(Gather gather) {
  return name_of(kGatherNames, static_cast<size_t>(gather));
}
const char* to_string(JobTopology topology) {
  return name_of(kTopologyNames, static_cast<size_t>(topology));
}
const char* to_string(std::optional<TransportKind> kind) {
  return kind ? hetmesh::to_string(*kind) : kTransportNames[0].data();
}
const char* to_string(RendezvousKind kind) {
  return name_of(kRendezvousNames, static_cast<size_t>(kind));
}

JobConfig parse_config(std::string_view text, const std::string& source_name) {
  TomlReporter reporter(source_name);
  return read_config(reporter, parse_toml(reporter, text, source_name));
}

JobConfig load_config(const std::string& path) {
  return parse_config(read_bounded_file(path, "config", kMaxConfigBytes), path);
}

}  // namespace hetmesh::afd
