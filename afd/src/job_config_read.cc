// Reading, validating and printing the job configuration (config.hpp).
//
// A Section wraps one TOML table: it rejects keys it does not know on construction, then hands
// out typed, range-checked values, each defaulted when absent. Every failure goes through
// Section::fail or Reporter::fail, which prefix "<file>:<line>:<column>: [table] key: ".
#include <hetmesh/afd/job_config.hpp>
#include <hetmesh/core/error.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <toml++/toml.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <span>

namespace hetmesh {
namespace {

using SourceRegion = toml::source_region;

constexpr int64_t kIntMax = std::numeric_limits<int>::max();
// Caps that keep every size the engine derives far from overflow.
constexpr int64_t kMaxInstances = 1024;
constexpr int64_t kMaxLayers = 1024;
constexpr int64_t kMaxMicroBatches = 64;
constexpr int64_t kMaxTimeoutMs = 24LL * 3600 * 1000;  // a day; keeps deadlines representable
constexpr uint64_t kMaxMicroBatchBytes = 4ULL << 30;   // tokens x hidden x dtype, one direction
constexpr int64_t kMaxCpu = 1023;                      // CPU_SETSIZE - 1

constexpr std::array<std::string_view, 4> kDtypeNames = {"fp8", "bf16", "fp16", "fp32"};
constexpr std::array<std::string_view, 2> kGatherNames = {"all", "eager"};
constexpr std::array<std::string_view, 4> kTransportNames = {"auto", "ipc", "tcp", "verbs"};
constexpr std::array<std::string_view, 1> kRendezvousNames = {"tcp"};

// TOML basic string with the escapes the grammar requires.
std::string quote(std::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f)
          out += fmt::format("\\u{:04x}", static_cast<unsigned>(static_cast<unsigned char>(c)));
        else
          out += c;
    }
  }
  return out + '"';
}

// What a node is, for "expected X, got Y".
std::string describe(const toml::node& node) {
  switch (node.type()) {
    case toml::node_type::string:
      return "string " + quote(node.as_string()->get());
    case toml::node_type::integer:
      return fmt::format("integer {}", node.as_integer()->get());
    case toml::node_type::floating_point:
      return fmt::format("float {}", node.as_floating_point()->get());
    case toml::node_type::boolean:
      return fmt::format("boolean {}", node.as_boolean()->get());
    case toml::node_type::array:
      return "an array";
    case toml::node_type::table:
      return "a table";
    default:
      return "a date/time";
  }
}

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j)
    row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1] ? 1 : 0)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// The closest candidate within a typo's reach of `word`, for "did you mean".
std::optional<std::string_view> closest(std::string_view word,
                                        std::span<const std::string_view> candidates) {
  std::optional<std::string_view> best;
  size_t best_distance = std::numeric_limits<size_t>::max();
  for (std::string_view c : candidates) {
    size_t d = edit_distance(word, c);
    if (d < best_distance) best = c, best_distance = d;
  }
  if (!best || best_distance > std::max<size_t>(2, best->size() / 3)) return std::nullopt;
  return best;
}

// " (did you mean X?)" or "".
std::string did_you_mean(std::string_view word, std::span<const std::string_view> candidates) {
  auto best = closest(word, candidates);
  return best ? fmt::format(" (did you mean {}?)", *best) : std::string();
}

std::string choices(std::span<const std::string_view> names) {
  return fmt::format("{}", fmt::join(names, ", "));
}

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

// "host:port" with a numeric port; IPv6 hosts in brackets.
bool valid_host_port(std::string_view text) {
  size_t colon = text.rfind(':');
  if (colon == std::string_view::npos || colon == 0) return false;
  std::string_view host = text.substr(0, colon), port = text.substr(colon + 1);
  bool bracketed = host.front() == '[';
  if (bracketed != (host.back() == ']') || (bracketed && host.size() < 3)) return false;
  if (!bracketed && host.find(':') != std::string_view::npos) return false;
  unsigned value = 0;
  auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
  return !port.empty() && ec == std::errc() && end == port.data() + port.size() && value <= 65535;
}

class Reporter {
 public:
  explicit Reporter(std::string file) : file_(std::move(file)) {}
  [[noreturn]] void fail(const SourceRegion& where, const std::string& message) const {
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("{}:{}:{}: {}", file_, where.begin.line, where.begin.column, message));
  }

 private:
  std::string file_;
};

class Section {
 public:
  // `table` is null when the file leaves the section out: every key then takes its default.
  Section(const Reporter& reporter, std::string name, const toml::table* table, SourceRegion where,
          std::span<const std::string_view> known)
      : reporter_(reporter), name_(std::move(name)), table_(table), where_(where) {
    if (!table_) return;
    for (auto&& [key, node] : *table_) {
      if (std::find(known.begin(), known.end(), key.str()) != known.end()) continue;
      std::string hint = did_you_mean(key.str(), known);
      if (name_.empty())
        reporter_.fail(key.source(), node.is_table()
                                         ? fmt::format("unknown table [{}]{}", key.str(), hint)
                                         : fmt::format("unknown top-level key {}{}; keys belong "
                                                       "in a table such as [job]",
                                                       key.str(), hint));
      reporter_.fail(key.source(),
                     node.is_table()
                         ? fmt::format("unknown table [{}.{}]{}", name_, key.str(), hint)
                         : fmt::format("unknown key [{}] {}{}", name_, key.str(), hint));
    }
  }

  const std::string& name() const { return name_; }
  bool has(std::string_view key) const { return node(key) != nullptr; }
  // The key's position, or the table's when the key is absent.
  SourceRegion where(std::string_view key) const {
    if (table_)
      if (auto it = table_->find(key); it != table_->end()) return it->first.source();
    return where_;
  }
  SourceRegion where() const { return where_; }

  [[noreturn]] void fail(std::string_view key, const std::string& message) const {
    reporter_.fail(where(key), fmt::format("[{}] {}: {}", name_, key, message));
  }
  [[noreturn]] void fail_element(std::string_view key, size_t index, const toml::node& element,
                                 const std::string& message) const {
    reporter_.fail(element.source(), fmt::format("[{}] {}[{}]: {}", name_, key, index, message));
  }

  Section table(std::string_view key, std::span<const std::string_view> known) const {
    std::string child = name_.empty() ? std::string(key) : fmt::format("{}.{}", name_, key);
    const toml::node* n = node(key);
    if (!n) return Section(reporter_, child, nullptr, where_, known);
    if (!n->is_table())
      reporter_.fail(where(key),
                     fmt::format("[{}]: expected a table, got {}", child, describe(*n)));
    return Section(reporter_, child, n->as_table(), n->source(), known);
  }
  const toml::table* raw() const { return table_; }

  int64_t integer(std::string_view key, int64_t fallback, int64_t min, int64_t max) const {
    const toml::node* n = node(key);
    if (!n) return fallback;
    if (!n->is_integer())
      fail(key, fmt::format("expected {}, got {}", range(min, max), describe(*n)));
    int64_t value = n->as_integer()->get();
    if (value < min || value > max)
      fail(key, fmt::format("expected {}, got {}", range(min, max), value));
    return value;
  }
  int small_integer(std::string_view key, int fallback, int64_t min, int64_t max) const {
    return static_cast<int>(integer(key, fallback, min, std::min(max, kIntMax)));
  }

  // A float, or an integer (TOML writes 2 for 2.0), strictly above `above`.
  double number_above(std::string_view key, double fallback, double above) const {
    const toml::node* n = node(key);
    if (!n) return fallback;
    std::optional<double> value;
    if (n->is_floating_point()) value = n->as_floating_point()->get();
    if (n->is_integer()) value = static_cast<double>(n->as_integer()->get());
    if (!value) fail(key, fmt::format("expected a number > {}, got {}", above, describe(*n)));
    if (!std::isfinite(*value) || *value <= above)
      fail(key, fmt::format("expected a number > {}, got {}", above, *value));
    return *value;
  }

  bool boolean(std::string_view key, bool fallback) const {
    const toml::node* n = node(key);
    if (!n) return fallback;
    if (!n->is_boolean()) fail(key, fmt::format("expected true or false, got {}", describe(*n)));
    return n->as_boolean()->get();
  }

  std::string string(std::string_view key, std::string fallback, bool allow_empty = true) const {
    const toml::node* n = node(key);
    if (!n) return fallback;
    if (!n->is_string()) fail(key, fmt::format("expected a string, got {}", describe(*n)));
    std::string value = n->as_string()->get();
    if (!allow_empty && value.empty()) fail(key, "expected a non-empty string");
    return value;
  }

  // One of `names`; returns its index, or `fallback` when absent.
  size_t choice(std::string_view key, size_t fallback,
                std::span<const std::string_view> names) const {
    const toml::node* n = node(key);
    if (!n) return fallback;
    if (!n->is_string())
      fail(key, fmt::format("expected one of {}, got {}", choices(names), describe(*n)));
    const std::string& value = n->as_string()->get();
    auto it = std::find(names.begin(), names.end(), value);
    if (it == names.end()) {
      auto best = closest(value, names);
      fail(key, fmt::format("unknown value {} (expected one of {}{})", quote(value), choices(names),
                            best ? fmt::format("; did you mean {}?", *best) : ""));
    }
    return static_cast<size_t>(it - names.begin());
  }

  // An array whose elements `each` converts (or rejects through fail_element).
  template <typename T, typename Convert>
  std::vector<T> array(std::string_view key, const char* expected, Convert each) const {
    const toml::node* n = node(key);
    if (!n) return {};
    if (!n->is_array()) fail(key, fmt::format("expected {}, got {}", expected, describe(*n)));
    std::vector<T> out;
    for (size_t i = 0; i < n->as_array()->size(); ++i)
      out.push_back(each(i, *n->as_array()->get(i)));
    return out;
  }

 private:
  const toml::node* node(std::string_view key) const { return table_ ? table_->get(key) : nullptr; }

  static std::string range(int64_t min, int64_t max) {
    if (max >= kIntMax)
      return min == 1 ? "a positive integer" : fmt::format("an integer >= {}", min);
    return fmt::format("an integer in {}..{}", min, max);
  }

  const Reporter& reporter_;
  std::string name_;  // "job", "plugins.options"; "" for the top level
  const toml::table* table_;
  SourceRegion where_;
};

template <typename Enum, size_t N>
Enum read_enum(const Section& s, std::string_view key, Enum fallback,
               const std::array<std::string_view, N>& names) {
  return static_cast<Enum>(s.choice(key, static_cast<size_t>(fallback), names));
}

// [devices] attention / ffn: one selector for every instance, or one per instance.
std::vector<std::string> read_selectors(const Section& s, std::string_view key, int count,
                                        const char* role) {
  const toml::table* table = s.raw();
  const toml::node* n = table ? table->get(key) : nullptr;
  if (!n) return std::vector<std::string>(static_cast<size_t>(count), "cpu:0");
  auto bad = [&](const std::string& text) {
    return fmt::format("bad device selector {} (expected name:index, e.g. \"cpu:0\")", quote(text));
  };
  if (n->is_string()) {
    auto selector = normalize_selector(n->as_string()->get());
    if (!selector) s.fail(key, bad(n->as_string()->get()));
    return std::vector<std::string>(static_cast<size_t>(count), *selector);
  }
  if (!n->is_array())
    s.fail(key,
           fmt::format("expected a selector string or an array of them, got {}", describe(*n)));
  auto selectors = s.array<std::string>(key, "an array", [&](size_t i, const toml::node& e) {
    if (!e.is_string())
      s.fail_element(key, i, e, fmt::format("expected a selector string, got {}", describe(e)));
    auto selector = normalize_selector(e.as_string()->get());
    if (!selector) s.fail_element(key, i, e, bad(e.as_string()->get()));
    return *selector;
  });
  if (selectors.size() != static_cast<size_t>(count))
    s.fail(key, fmt::format("{} selector(s) for {} {} instance(s) ([job] {} = {}); give one per "
                            "instance or a single string for all",
                            selectors.size(), count, role, key, count));
  return selectors;
}

// A plugin's options as a "k=v;k=v" string: given so (checked for shape) or as a table of scalars.
std::string read_plugin_options(const Reporter& reporter, const std::string& plugin,
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
                      fmt::format("{}: option {} is not key=value", label, quote(item)));
      start = end + 1;
    }
    return text;
  }
  if (!n.is_table())
    reporter.fail(key.source(),
                  fmt::format("{}: expected a \"key=value;...\" string or a table, got {}", label,
                              describe(n)));
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
                                                 where, describe(value)));
    if (text.find(';') != std::string::npos)
      reporter.fail(option.source(), where + ": option values cannot contain ';'");
    items.push_back(fmt::format("{}={}", option.str(), text));
  }
  return fmt::format("{}", fmt::join(items, ";"));
}

PluginsSection read_plugins(const Reporter& reporter, const Section& root) {
  static constexpr std::array<std::string_view, 2> kKeys = {"paths", "options"};
  Section s = root.table("plugins", kKeys);
  PluginsSection out;
  out.paths =
      s.array<std::string>("paths", "an array of paths", [&](size_t i, const toml::node& e) {
        if (!e.is_string() || e.as_string()->get().empty())
          s.fail_element("paths", i, e,
                         fmt::format("expected a non-empty path, got {}", describe(e)));
        return e.as_string()->get();
      });
  // Keys of [plugins.options] are plugin names, so it is read by hand rather than as a Section.
  const toml::node* options = s.raw() ? s.raw()->get("options") : nullptr;
  if (!options) return out;
  if (!options->is_table())
    s.fail("options", fmt::format("expected a table of plugin names, got {}", describe(*options)));
  for (auto&& [key, value] : *options->as_table()) {
    std::string name(key.str());
    if (!valid_plugin_name(name))
      reporter.fail(key.source(), fmt::format("[plugins.options] {}: not a plugin name "
                                              "([a-z0-9_], at most 32 characters)",
                                              name));
    out.options[name] = read_plugin_options(reporter, name, key, value);
  }
  return out;
}

void check_model_fits(const Section& job, const Section& model, const JobConfig& c) {
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
}

JobConfig read_config(const Reporter& reporter, const toml::table& document) {
  static constexpr std::array<std::string_view, 8> kTables = {
      "job", "model", "devices", "plugins", "transport", "rendezvous", "tracing", "affinity"};
  SourceRegion top{{1, 1}, {1, 1}, nullptr};
  Section root(reporter, "", &document, top, kTables);
  JobConfig c;

  static constexpr std::array<std::string_view, 6> kJob = {"attention", "ffn",    "micro_batches",
                                                           "layers",    "gather", "timeout_ms"};
  Section job = root.table("job", kJob);
  c.job.attention = job.small_integer("attention", c.job.attention, 1, kMaxInstances);
  c.job.ffn = job.small_integer("ffn", c.job.ffn, 1, kMaxInstances);
  c.job.micro_batches =
      job.small_integer("micro_batches", c.job.micro_batches, 1, kMaxMicroBatches);
  c.job.layers = job.small_integer("layers", c.job.layers, 1, kMaxLayers);
  c.job.gather = read_enum(job, "gather", c.job.gather, kGatherNames);
  c.job.timeout =
      std::chrono::milliseconds(job.integer("timeout_ms", c.job.timeout.count(), 1, kMaxTimeoutMs));

  static constexpr std::array<std::string_view, 6> kModel = {"tokens", "hidden",    "experts",
                                                             "top_k",  "a2f_dtype", "f2a_dtype"};
  Section model = root.table("model", kModel);
  c.model.tokens = model.small_integer("tokens", c.model.tokens, 1, kIntMax);
  c.model.hidden = model.small_integer("hidden", c.model.hidden, 1, kIntMax);
  c.model.experts = model.small_integer("experts", c.model.experts, 1, kIntMax);
  c.model.top_k = model.small_integer("top_k", c.model.top_k, 1, kIntMax);
  c.model.a2f_dtype = read_enum(model, "a2f_dtype", c.model.a2f_dtype, kDtypeNames);
  c.model.f2a_dtype = read_enum(model, "f2a_dtype", c.model.f2a_dtype, kDtypeNames);
  check_model_fits(job, model, c);

  static constexpr std::array<std::string_view, 2> kDevices = {"attention", "ffn"};
  Section devices = root.table("devices", kDevices);
  c.devices.attention = read_selectors(devices, "attention", c.job.attention, "A");
  c.devices.ffn = read_selectors(devices, "ffn", c.job.ffn, "F");

  c.plugins = read_plugins(reporter, root);

  static constexpr std::array<std::string_view, 4> kTransport = {"kind", "listen_host",
                                                                 "rdma_device", "gid_index"};
  Section transport = root.table("transport", kTransport);
  c.transport.kind = read_enum(transport, "kind", c.transport.kind, kTransportNames);
  c.transport.listen_host = transport.string("listen_host", c.transport.listen_host, false);
  c.transport.rdma_device = transport.string("rdma_device", c.transport.rdma_device);
  c.transport.gid_index = transport.small_integer("gid_index", c.transport.gid_index, -1, 65535);

  static constexpr std::array<std::string_view, 2> kRendezvous = {"kind", "address"};
  Section rendezvous = root.table("rendezvous", kRendezvous);
  // "etcd" is a known name, so it gets "not supported yet" rather than "unknown value".
  static constexpr std::array<std::string_view, 2> kRendezvousKinds = {"tcp", "etcd"};
  if (rendezvous.choice("kind", 0, kRendezvousKinds) != 0)
    rendezvous.fail("kind", "\"etcd\" is not supported yet (use \"tcp\", the embedded store)");
  c.rendezvous.kind = RendezvousKind::tcp;
  c.rendezvous.address = rendezvous.string("address", c.rendezvous.address);
  if (!valid_host_port(c.rendezvous.address))
    rendezvous.fail("address", fmt::format("expected host:port (IPv6 as [addr]:port), got {}",
                                           quote(c.rendezvous.address)));

  static constexpr std::array<std::string_view, 3> kTracing = {"enabled", "chrome_trace",
                                                               "straggler_factor"};
  Section tracing = root.table("tracing", kTracing);
  c.tracing.enabled = tracing.boolean("enabled", c.tracing.enabled);
  c.tracing.chrome_trace = tracing.string("chrome_trace", c.tracing.chrome_trace);
  c.tracing.straggler_factor =
      tracing.number_above("straggler_factor", c.tracing.straggler_factor, 1.0);

  static constexpr std::array<std::string_view, 2> kAffinity = {"comm_cpus", "poller_cpu"};
  Section affinity = root.table("affinity", kAffinity);
  c.affinity.comm_cpus =
      affinity.array<int>("comm_cpus", "an array of CPU ids", [&](size_t i, const toml::node& e) {
        std::optional<int64_t> cpu =
            e.is_integer() ? e.as_integer()->get() : std::optional<int64_t>();
        if (!cpu || *cpu < 0 || *cpu > kMaxCpu)
          affinity.fail_element("comm_cpus", i, e,
                                fmt::format("expected a CPU id in 0..{}, got {}", kMaxCpu,
                                            cpu ? fmt::format("{}", *cpu) : describe(e)));
        return static_cast<int>(*cpu);
      });
  c.affinity.poller_cpu = affinity.small_integer("poller_cpu", c.affinity.poller_cpu, -1, kMaxCpu);
  return c;
}

template <size_t N>
const char* name_of(const std::array<std::string_view, N>& names, size_t index) {
  return index < N ? names[index].data() : "?";  // the arrays hold literals: NUL-terminated
}

std::string toml_list(const std::vector<std::string>& items) {
  std::vector<std::string> quoted;
  for (const auto& item : items)
    quoted.push_back(quote(item));
  return fmt::format("[{}]", fmt::join(quoted, ", "));
}

std::string toml_selectors(const std::vector<std::string>& selectors) {
  bool uniform = std::all_of(selectors.begin(), selectors.end(),
                             [&](const std::string& s) { return s == selectors.front(); });
  return uniform && !selectors.empty() ? quote(selectors.front()) : toml_list(selectors);
}

// Shortest text that reads back to the same double, always with a fraction or exponent so TOML
// reads a float.
std::string toml_float(double value) {
  std::string text = fmt::format("{}", value);
  if (text.find_first_of(".eEn") == std::string::npos) text += ".0";
  return text;
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
      return 4;
  }
  return 0;
}

const char* to_string(Dtype dtype) {
  return name_of(kDtypeNames, static_cast<size_t>(dtype));
}
const char* to_string(GatherMode mode) {
  return name_of(kGatherNames, static_cast<size_t>(mode));
}
const char* to_string(TransportChoice choice) {
  return name_of(kTransportNames, static_cast<size_t>(choice));
}
const char* to_string(RendezvousKind kind) {
  return name_of(kRendezvousNames, static_cast<size_t>(kind));
}

JobConfig parse_config(std::string_view text, const std::string& source_name) {
  Reporter reporter(source_name);
  toml::table document;
  try {
    document = toml::parse(text, std::string_view(source_name));
  } catch (const toml::parse_error& e) {
    reporter.fail(e.source(), fmt::format("TOML syntax error: {}", e.description()));
  }
  return read_config(reporter, document);
}

JobConfig load_config(const std::string& path) {
  std::unique_ptr<FILE, int (*)(FILE*)> file(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!file)
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("cannot read config {}: {}", path, std::strerror(errno)));
  std::string text;
  char buffer[65536];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof buffer, file.get())) > 0)
    text.append(buffer, n);
  if (std::ferror(file.get()))  // e.g. EISDIR: fopen succeeds on a folder, reading fails
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("cannot read config {}: {}", path, std::strerror(errno)));
  return parse_config(text, path);
}

std::string to_toml(const JobConfig& c) {
  std::string out = "# hetmesh job configuration (effective values)\n";
  out += fmt::format(
      "\n[job]\nattention = {}\nffn = {}\nmicro_batches = {}\nlayers = {}\ngather = {}\n"
      "timeout_ms = {}\n",
      c.job.attention, c.job.ffn, c.job.micro_batches, c.job.layers, quote(to_string(c.job.gather)),
      c.job.timeout.count());
  out += fmt::format(
      "\n[model]\ntokens = {}\nhidden = {}\nexperts = {}\ntop_k = {}\na2f_dtype = {}\n"
      "f2a_dtype = {}\n",
      c.model.tokens, c.model.hidden, c.model.experts, c.model.top_k,
      quote(to_string(c.model.a2f_dtype)), quote(to_string(c.model.f2a_dtype)));
  out += fmt::format("\n[devices]\nattention = {}\nffn = {}\n", toml_selectors(c.devices.attention),
                     toml_selectors(c.devices.ffn));
  out += fmt::format("\n[plugins]\npaths = {}\n", toml_list(c.plugins.paths));
  if (!c.plugins.options.empty()) {
    out += "\n[plugins.options]\n";
    for (const auto& [name, options] : c.plugins.options)
      out += fmt::format("{} = {}\n", name, quote(options));
  }
  out +=
      fmt::format("\n[transport]\nkind = {}\nlisten_host = {}\nrdma_device = {}\ngid_index = {}\n",
                  quote(to_string(c.transport.kind)), quote(c.transport.listen_host),
                  quote(c.transport.rdma_device), c.transport.gid_index);
  out += fmt::format("\n[rendezvous]\nkind = {}\naddress = {}\n",
                     quote(to_string(c.rendezvous.kind)), quote(c.rendezvous.address));
  out += fmt::format("\n[tracing]\nenabled = {}\nchrome_trace = {}\nstraggler_factor = {}\n",
                     c.tracing.enabled, quote(c.tracing.chrome_trace),
                     toml_float(c.tracing.straggler_factor));
  out += fmt::format("\n[affinity]\ncomm_cpus = [{}]\npoller_cpu = {}\n",
                     fmt::join(c.affinity.comm_cpus, ", "), c.affinity.poller_cpu);
  return out;
}

}  // namespace hetmesh
