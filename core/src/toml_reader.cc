// The checked TOML reader (toml_reader.hpp): typed, range-checked getters, unknown keys with a
// "did you mean", and every failure prefixed with its file position through TomlReporter::fail.
#include "suggest.hpp"

#include <hetmesh/core/error.hpp>
#include <hetmesh/core/toml_reader.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

namespace hetmesh {
namespace {

constexpr int64_t kIntMax = std::numeric_limits<int>::max();

// The closest candidate within a typo's reach of `word`, for "did you mean".
std::optional<std::string_view> closest(std::string_view word,
                                        std::span<const std::string_view> candidates) {
  auto best = closest_name(word, candidates);
  if (!best || best->distance > std::max<size_t>(2, best->name.size() / 3)) return std::nullopt;
  return best->name;
}

// " (did you mean X?)" or "".
std::string did_you_mean(std::string_view word, std::span<const std::string_view> candidates) {
  auto best = closest(word, candidates);
  return best ? fmt::format(" (did you mean {}?)", *best) : std::string();
}

std::string choices(std::span<const std::string_view> names) {
  return fmt::format("{}", fmt::join(names, ", "));
}

// "an integer in 1..64", "a positive integer", ...
std::string range(int64_t min, int64_t max) {
  if (max >= kIntMax) return min == 1 ? "a positive integer" : fmt::format("an integer >= {}", min);
  return fmt::format("an integer in {}..{}", min, max);
}

}  // namespace

std::string toml_did_you_mean(std::string_view word, std::span<const std::string_view> candidates) {
  return did_you_mean(word, candidates);
}

std::string toml_quote(std::string_view text) {
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

std::string toml_describe(const toml::node& node) {
  switch (node.type()) {
    case toml::node_type::string:
      return "string " + toml_quote(node.as_string()->get());
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

void TomlReporter::fail(const toml::source_region& where, const std::string& message) const {
  throw Error(HM_ERR_INVALID_ARGUMENT,
              fmt::format("{}:{}:{}: {}", file_, where.begin.line, where.begin.column, message));
}

toml::table parse_toml(const TomlReporter& reporter, std::string_view text,
                       const std::string& source_name) {
  try {
    return toml::parse(text, std::string_view(source_name));
  } catch (const toml::parse_error& e) {
    reporter.fail(e.source(), fmt::format("TOML syntax error: {}", e.description()));
  }
}

TomlSection::TomlSection(const TomlReporter& reporter, const toml::table& document,
                         std::span<const std::string_view> known)
    : TomlSection(reporter, "", &document, toml::source_region{{1, 1}, {1, 1}, nullptr}, known) {}

TomlSection::TomlSection(const TomlReporter& reporter, std::string name, const toml::table* table,
                         toml::source_region where, std::span<const std::string_view> known)
    : reporter_(reporter), name_(std::move(name)), table_(table), where_(where) {
  if (!table_) return;
  for (auto&& [key, node] : *table_) {
    if (std::find(known.begin(), known.end(), key.str()) != known.end()) continue;
    std::string hint = did_you_mean(key.str(), known);
    if (name_.empty()) {  // the top level holds only tables: name the first known one
      std::string tables =
          known.empty() ? "a table" : fmt::format("a table such as [{}]", known.front());
      reporter_.fail(key.source(),
                     node.is_table() ? fmt::format("unknown table [{}]{}", key.str(), hint)
                                     : fmt::format("unknown top-level key {}{}; keys belong in {}",
                                                   key.str(), hint, tables));
    }
    reporter_.fail(key.source(),
                   node.is_table() ? fmt::format("unknown table [{}.{}]{}", name_, key.str(), hint)
                                   : fmt::format("unknown key [{}] {}{}", name_, key.str(), hint));
  }
}

toml::source_region TomlSection::where(std::string_view key) const {
  if (table_)
    if (auto it = table_->find(key); it != table_->end()) return it->first.source();
  return where_;
}

void TomlSection::fail(std::string_view key, const std::string& message) const {
  reporter_.fail(where(key), fmt::format("[{}] {}: {}", name_, key, message));
}

void TomlSection::fail_element(std::string_view key, size_t index, const toml::node& element,
                               const std::string& message) const {
  reporter_.fail(element.source(), fmt::format("[{}] {}[{}]: {}", name_, key, index, message));
}

TomlSection TomlSection::table(std::string_view key,
                               std::span<const std::string_view> known) const {
  std::string child = name_.empty() ? std::string(key) : fmt::format("{}.{}", name_, key);
  const toml::node* n = node(key);
  if (!n) return TomlSection(reporter_, child, nullptr, where_, known);
  if (!n->is_table())
    reporter_.fail(where(key),
                   fmt::format("[{}]: expected a table, got {}", child, toml_describe(*n)));
  return TomlSection(reporter_, child, n->as_table(), n->source(), known);
}

int64_t TomlSection::integer(std::string_view key, int64_t fallback, int64_t min,
                             int64_t max) const {
  const toml::node* n = node(key);
  if (!n) return fallback;
  if (!n->is_integer())
    fail(key, fmt::format("expected {}, got {}", range(min, max), toml_describe(*n)));
  int64_t value = n->as_integer()->get();
  if (value < min || value > max)
    fail(key, fmt::format("expected {}, got {}", range(min, max), value));
  return value;
}

int TomlSection::small_integer(std::string_view key, int fallback, int64_t min, int64_t max) const {
  return static_cast<int>(integer(key, fallback, min, std::min(max, kIntMax)));
}

double TomlSection::number_above(std::string_view key, double fallback, double above) const {
  const toml::node* n = node(key);
  if (!n) return fallback;
  std::optional<double> value;
  if (n->is_floating_point()) value = n->as_floating_point()->get();
  if (n->is_integer()) value = static_cast<double>(n->as_integer()->get());
  if (!value) fail(key, fmt::format("expected a number > {}, got {}", above, toml_describe(*n)));
  if (!std::isfinite(*value) || *value <= above)
    fail(key, fmt::format("expected a number > {}, got {}", above, *value));
  return *value;
}

bool TomlSection::boolean(std::string_view key, bool fallback) const {
  const toml::node* n = node(key);
  if (!n) return fallback;
  if (!n->is_boolean()) fail(key, fmt::format("expected true or false, got {}", toml_describe(*n)));
  return n->as_boolean()->get();
}

std::string TomlSection::string(std::string_view key, std::string fallback,
                                bool allow_empty) const {
  const toml::node* n = node(key);
  if (!n) return fallback;
  if (!n->is_string()) fail(key, fmt::format("expected a string, got {}", toml_describe(*n)));
  std::string value = n->as_string()->get();
  if (!allow_empty && value.empty()) fail(key, "expected a non-empty string");
  return value;
}

size_t TomlSection::choice(std::string_view key, size_t fallback,
                           std::span<const std::string_view> names) const {
  const toml::node* n = node(key);
  if (!n) return fallback;
  if (!n->is_string())
    fail(key, fmt::format("expected one of {}, got {}", choices(names), toml_describe(*n)));
  const std::string& value = n->as_string()->get();
  auto it = std::find(names.begin(), names.end(), value);
  if (it == names.end()) {
    auto best = closest(value, names);
    fail(key, fmt::format("unknown value {} (expected one of {}{})", toml_quote(value),
                          choices(names), best ? fmt::format("; did you mean {}?", *best) : ""));
  }
  return static_cast<size_t>(it - names.begin());
}

}  // namespace hetmesh
