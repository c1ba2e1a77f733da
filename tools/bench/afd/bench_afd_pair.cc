// `hetmesh bench afd`: the raw pair, for a job whose A or F memory is a device's that the host
// cannot address. The copies one A's round trip needs to cross between those memories and host
// memory, each made by its own plugin (memcpy_async into or out of that plugin's pinned host
// memory, then a sync), one after another: A's tokens device-to-host on A's device and
// host-to-device on F's, F's results device-to-host on F's and host-to-device on A's, for each F.
// What moving the bytes costs the copy engines alone, without a transport or an engine.
#include "bench_afd.hpp"

#include <hetmesh/afd/job.hpp>
#include <hetmesh/core/device.hpp>
#include <hetmesh/core/percentile.hpp>

#include <algorithm>

namespace hetmesh::cli {

namespace {

// A device's side of the pair: its memory, host memory for its copies, and a stream.
struct Side {
  Buffer memory;
  HostBuffer host;
  Stream stream;

  Side(const Device& d, uint64_t bytes)
      : memory(d.allocate(bytes)), host(d, bytes), stream(d.create_stream()) {}
  void to_host(uint64_t bytes) {
    stream.copy(host.data(), memory.data(), bytes);
    stream.synchronize();
  }
  void to_device(uint64_t bytes) {
    stream.copy(memory.data(), host.data(), bytes);
    stream.synchronize();
  }
};

bool needs_copies(const Device& d) {
  return !d.has(HM_CAP_HOST_ADDRESSABLE_DEVICE_MEMORY);
}

}  // namespace

std::optional<double> raw_pair_p50_us(const afd::JobConfig& c, uint64_t a2f, uint64_t f2a,
                                      int samples) {
  PluginRegistry plugins = afd::load_plugins(c);
  Device a = plugins.device(c.devices.attention.at(0)), f = plugins.device(c.devices.ffn.at(0));
  if (!needs_copies(a) && !needs_copies(f)) return std::nullopt;
  const uint64_t bytes = std::max(a2f, f2a);
  std::optional<Side> at_a, at_f;
  if (needs_copies(a)) at_a.emplace(a, bytes);
  if (needs_copies(f)) at_f.emplace(f, bytes);
  std::vector<double> us;
  for (int i = 0; i < samples + 10; ++i) {
    const int64_t start = afd::now_ns();
    for (int k = 0; k < c.job.ffn; ++k) {
      if (at_a) at_a->to_host(a2f);
      if (at_f) at_f->to_device(a2f);
      if (at_f) at_f->to_host(f2a);
      if (at_a) at_a->to_device(f2a);
    }
    if (i >= 10) us.push_back(static_cast<double>(afd::now_ns() - start) / 1e3);
  }
  return percentile(us, 0.5);
}

}  // namespace hetmesh::cli
