// The list of known HETMESH_* environment variables, in one place, and the check against it
// (environment.hpp). A variable that a new part of hetmesh reads is added here.
#include "environment.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <string_view>

extern char** environ;

namespace hetmesh {
namespace {

constexpr std::array<std::string_view, 21> kKnownVariables = {
    // The log (log.hpp).
    "HETMESH_LOG", "HETMESH_LOG_FILE",
    // The plugin loader (plugin.hpp).
    "HETMESH_PLUGINS", "HETMESH_PLUGIN_PATH",
    // The verbs transport (backends/src/verbs_device.cc).
    "HETMESH_VERBS_MAX_MSG", "HETMESH_VERBS_DISABLE_DMABUF", "HETMESH_VERBS_DISABLE_PEERMEM",
    "HETMESH_VERBS_ASSUME_PEERMEM",
    // The asic_stub plugin's options (plugins/asic_stub).
    "HETMESH_ASIC_STUB_DEVICES", "HETMESH_ASIC_STUB_MEMORY_MIB",
    "HETMESH_ASIC_STUB_COPY_LATENCY_US", "HETMESH_ASIC_STUB_COPY_BANDWIDTH_GBPS",
    // Tests and CI (tests/, ci/rxe-vm.sh), which run hetmesh with them set.
    "HETMESH_REQUIRE_TRANSPORTS", "HETMESH_CACHE", "HETMESH_RXE_VM", "HETMESH_RXE_DEVICE",
    "HETMESH_RXE_GID_INDEX", "HETMESH_RXE_IP", "HETMESH_RXE_RESULTS", "HETMESH_RXE_KERNEL",
    "HETMESH_RXE_VM_DEBUG"};

// Levenshtein distance, for "did you mean".
size_t distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j)
    row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

}  // namespace

std::vector<std::string> unknown_environment_warnings() {
  std::vector<std::string> warnings;
  for (char** entry = environ; entry && *entry; ++entry) {
    std::string_view text(*entry);
    if (!text.starts_with("HETMESH_")) continue;
    std::string_view name = text.substr(0, text.find('='));
    if (std::find(kKnownVariables.begin(), kKnownVariables.end(), name) != kKnownVariables.end())
      continue;
    std::string_view closest;
    size_t best = 4;  // farther than 3 edits is not a typo
    for (std::string_view known : kKnownVariables)
      if (size_t d = distance(name, known); d < best) best = d, closest = known;
    warnings.push_back(
        fmt::format("unknown environment variable {} (ignored{})", name,
                    closest.empty() ? "" : fmt::format("; did you mean {}?", closest)));
  }
  return warnings;
}

}  // namespace hetmesh
