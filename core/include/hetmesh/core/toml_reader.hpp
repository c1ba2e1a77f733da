// A checked reader of TOML files (TOML++) for programs that validate their whole input before they
// start: a TomlSection wraps one table, rejects the keys it does not know (with a "did you mean"),
// then hands out typed, range-checked values, each defaulted when absent.
//
// Every failure is an Error(HM_ERR_INVALID_ARGUMENT) whose message starts with
// "<file>:<line>:<column>: " and, through a TomlSection, names the key path:
//   job.toml:12:1: [model] hidden: expected an integer in 1..1048576, got -5
//   job.toml:3:1: unknown key [job] micro_batchs (did you mean micro_batches?)
#pragma once

#include <toml++/toml.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

// Exported from the library, which hides every other symbol (core/README.md, "Exports").
#pragma GCC visibility push(default)

namespace hetmesh {

// `text` as a TOML basic string, with the escapes the grammar requires.
std::string toml_quote(std::string_view text);

// " (did you mean X?)" with the candidate within a typo's reach of `word`, or "": the hint of
// every unknown key, for a reader that checks names of its own (plugin names).
std::string toml_did_you_mean(std::string_view word, std::span<const std::string_view> candidates);

// What a node is, for "expected X, got Y": `string "abc"`, `integer 5`, `an array`, ...
std::string toml_describe(const toml::node& node);

// Throws the errors of one file, each prefixed with its position.
class TomlReporter {
 public:
  explicit TomlReporter(std::string file) : file_(std::move(file)) {}
  [[noreturn]] void fail(const toml::source_region& where, const std::string& message) const;

 private:
  std::string file_;
};

// Parses `text`; a syntax error is reported as "<file>:<line>:<column>: TOML syntax error: ...".
toml::table parse_toml(const TomlReporter& reporter, std::string_view text,
                       const std::string& source_name);

// One table of a document. It refers to its reporter and its document: both must outlive it.
class TomlSection {
 public:
  // The document's top level, whose keys are the tables named in `known`.
  TomlSection(const TomlReporter& reporter, const toml::table& document,
              std::span<const std::string_view> known);

  bool has(std::string_view key) const { return node(key) != nullptr; }
  // The key's position, or the table's when the key is absent.
  toml::source_region where(std::string_view key) const;
  // The table itself; null when the file leaves it out.
  const toml::table* raw() const { return table_; }

  // "[name] key: message" at the key.
  [[noreturn]] void fail(std::string_view key, const std::string& message) const;
  // "[name] key[index]: message" at the array element.
  [[noreturn]] void fail_element(std::string_view key, size_t index, const toml::node& element,
                                 const std::string& message) const;

  // The sub-table `key`, whose keys must be in `known`; absent, every key takes its default.
  TomlSection table(std::string_view key, std::span<const std::string_view> known) const;

  int64_t integer(std::string_view key, int64_t fallback, int64_t min, int64_t max) const;
  // An integer that fits an int (max is capped at INT_MAX).
  int small_integer(std::string_view key, int fallback, int64_t min, int64_t max) const;
  // A float, or an integer (TOML writes 2 for 2.0), strictly above `above`.
  double number_above(std::string_view key, double fallback, double above) const;
  bool boolean(std::string_view key, bool fallback) const;
  std::string string(std::string_view key, std::string fallback, bool allow_empty = true) const;
  // One of `names`; returns its index, or `fallback` when absent.
  size_t choice(std::string_view key, size_t fallback,
                std::span<const std::string_view> names) const;
  // An enum whose values are the indices of `names`.
  template <typename Enum, size_t N>
  Enum enumeration(std::string_view key, Enum fallback,
                   const std::array<std::string_view, N>& names) const {
    return static_cast<Enum>(choice(key, static_cast<size_t>(fallback), names));
  }

  // An array whose elements `each(index, node)` converts (or rejects through fail_element).
  template <typename T, typename Convert>
  std::vector<T> array(std::string_view key, const char* expected, Convert each) const {
    const toml::node* n = node(key);
    if (!n) return {};
    if (!n->is_array())
      fail(key, "expected " + std::string(expected) + ", got " + toml_describe(*n));
    std::vector<T> out;
    for (size_t i = 0; i < n->as_array()->size(); ++i)
      out.push_back(each(i, *n->as_array()->get(i)));
    return out;
  }

 private:
  // `table` is null when the file leaves the section out.
  TomlSection(const TomlReporter& reporter, std::string name, const toml::table* table,
              toml::source_region where, std::span<const std::string_view> known);
  const toml::node* node(std::string_view key) const { return table_ ? table_->get(key) : nullptr; }

  const TomlReporter& reporter_;
  std::string name_;  // "job", "plugins.options"; "" for the top level
  const toml::table* table_;
  toml::source_region where_;
};

}  // namespace hetmesh

#pragma GCC visibility pop
