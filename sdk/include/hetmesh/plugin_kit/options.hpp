// Parsing plugin options ("key=value;key=value") and environment overrides.
#pragma once

#include "status.hpp"

#include <cstdlib>
#include <map>
#include <string>

namespace hm::kit {

using Options = std::map<std::string, std::string>;

// Parses hm_host_api.options. Malformed entries fail with HM_ERR_INVALID_ARGUMENT.
inline Options parse_options(const char* text) {
  Options options;
  if (text == nullptr) return options;
  std::string all(text);
  size_t start = 0;
  while (start <= all.size()) {
    size_t end = all.find(';', start);
    if (end == std::string::npos) end = all.size();
    std::string item = all.substr(start, end - start);
    if (!item.empty()) {
      size_t eq = item.find('=');
      if (eq == std::string::npos || eq == 0)
        fail(HM_ERR_INVALID_ARGUMENT, "option '%s' is not of the form key=value", item.c_str());
      options[item.substr(0, eq)] = item.substr(eq + 1);
    }
    start = end + 1;
  }
  return options;
}

// Reads a non-negative number from `options[key]`, else from the environment variable `env`,
// else `fallback`; removes the key so unknown leftovers can be reported.
inline double take_number(Options& options, const char* key, const char* env, double fallback) {
  std::string text;
  std::string source;
  if (auto it = options.find(key); it != options.end()) {
    text = it->second;
    source = std::string("option ") + key;
    options.erase(it);
  } else if (const char* value = std::getenv(env); value != nullptr && *value != '\0') {
    text = value;
    source = std::string("environment variable ") + env;
  } else {
    return fallback;
  }
  char* end = nullptr;
  double number = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || *end != '\0' || !(number >= 0))
    fail(HM_ERR_INVALID_ARGUMENT, "%s='%s' is not a non-negative number", source.c_str(),
         text.c_str());
  return number;
}

// Fails naming the first option nobody consumed.
inline void reject_unknown(const Options& options, const char* known) {
  if (!options.empty())
    fail(HM_ERR_INVALID_ARGUMENT, "unknown option '%s' (known: %s)", options.begin()->first.c_str(),
         known);
}

}  // namespace hm::kit
