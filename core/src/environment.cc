// The list of known HETMESH_* environment variables, in one place, and the check against it
// (environment.hpp). A variable that a new part of hetmesh reads is added here.
#include "environment.hpp"
#include "suggest.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <string_view>

extern char** environ;

namespace hetmesh {
namespace {

// Test-only variables are not hetmesh's: they are named HM_TEST_* (tests/README.md).
constexpr std::array<std::string_view, 33> kKnownVariables = {
    // The log (log.hpp).
    "HETMESH_LOG", "HETMESH_LOG_FILE",
    // The job's secret (job_secret.hpp), etcd's TLS files and user (rendezvous.hpp).
    "HETMESH_JOB_SECRET_FILE", "HETMESH_ETCD_CA_FILE", "HETMESH_ETCD_CERT_FILE",
    "HETMESH_ETCD_KEY_FILE", "HETMESH_ETCD_USER", "HETMESH_ETCD_PASSWORD_FILE",
    // The plugin loader (plugin.hpp).
    "HETMESH_PLUGINS", "HETMESH_PLUGIN_PATH",
    // The verbs transport (backends/src/verbs/verbs_device.cc).
    "HETMESH_VERBS_MAX_MSG", "HETMESH_VERBS_DISABLE_DMABUF", "HETMESH_VERBS_DISABLE_PEERMEM",
    "HETMESH_VERBS_ASSUME_PEERMEM",
    // Where `hetmesh demo` looks for a plugin's expert kernels (hetmesh/demo_experts.h).
    "HETMESH_DEMO_KERNELS",
    // The asic_stub plugin's options (plugins/asic_stub).
    "HETMESH_ASIC_STUB_DEVICES", "HETMESH_ASIC_STUB_MEMORY_MIB",
    "HETMESH_ASIC_STUB_COPY_LATENCY_US", "HETMESH_ASIC_STUB_COPY_BANDWIDTH_GBPS",
    // StepMesh's API on hetmesh (python/hetmesh/stepmesh.py): its job's settings and sizes.
    "HETMESH_CONFIG", "HETMESH_STEPMESH_MAX_BYTES", "HETMESH_STEPMESH_TENSORS",
    "HETMESH_STEPMESH_MICRO_BATCHES", "HETMESH_STEPMESH_MAX_BUFFERS", "HETMESH_STEPMESH_DEVICE",
    // The soft-RoCE VM (ci/rxe-vm.sh and its README), which runs hetmesh with them set.
    "HETMESH_CACHE", "HETMESH_RXE_VM", "HETMESH_RXE_DEVICE", "HETMESH_RXE_GID_INDEX",
    "HETMESH_RXE_IP", "HETMESH_RXE_RESULTS", "HETMESH_RXE_KERNEL", "HETMESH_RXE_VM_DEBUG"};

}  // namespace

std::vector<std::string> unknown_environment_warnings() {
  std::vector<std::string> warnings;
  for (char** entry = environ; entry && *entry; ++entry) {
    std::string_view text(*entry);
    if (!text.starts_with("HETMESH_")) continue;
    std::string_view name = text.substr(0, text.find('='));
    if (std::find(kKnownVariables.begin(), kKnownVariables.end(), name) != kKnownVariables.end())
      continue;
    auto best = closest_name(name, kKnownVariables);
    bool typo = best && best->distance <= 3;  // farther than 3 edits is not a typo
    warnings.push_back(fmt::format("unknown environment variable {} (ignored{})", name,
                                   typo ? fmt::format("; did you mean {}?", best->name) : ""));
  }
  return warnings;
}

}  // namespace hetmesh
