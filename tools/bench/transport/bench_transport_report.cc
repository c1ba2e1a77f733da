// The table on stdout and, with --json, the same rows as JSON (ci/bench.sh and ci/gpu/ keep them).
#include "bench_transport.hpp"
#include "provenance.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

namespace hetmesh::cli::transport_bench {

void report(const BenchOptions& o, const std::string& peer_memory, const std::vector<Row>& rows) {
  fmt::print("hetmesh bench transport: {}{} {}, {} -> {} memory, {} iterations, window {}{}{}\n",
             o.transport,
             o.rails.empty() ? std::string()
                             : fmt::format(" striped over {}", fmt::join(o.rails, " and ")),
             o.connect.empty() ? std::string("between two processes")
                               : fmt::format("to the end at {} on another host", o.connect),
             o.memory, peer_memory, o.iterations, o.window,
             o.notify_every == 1 ? std::string()
                                 : fmt::format(", a notification every {} writes", o.notify_every),
             o.transport != "verbs" ? ""
             : o.busy_poll          ? " (ib_write_bw -t too), busy poller"
                                    : " (ib_write_bw -t too), adaptive poller");
  // The tools: ucx_perftest's ucp_put_bw and ucp_am_lat, ib_write_bw and ib_write_lat, or
  // fi_pingpong (tcp has none: its columns stay empty).
  const char* tool = o.transport == "verbs"    ? "ib_write"
                     : o.transport == "ipc"    ? "ucx"
                     : o.transport == "fabric" ? "fi_pingpong"
                                               : "tool";
  fmt::print(
      "{:>8} {:>12} {:>12} {:>11} | {:>13} {:>12} {:>9} | {:>11} {:>9} {:>8} | {:>16} {:>8} "
      "{:>15} {:>9}\n",
      "size", "lat p50 us", "lat p99 us", "bw GB/s", "memcpy p50 us", "memcpy GB/s", "bw ratio",
      "1-DMA p50 us", "lat ratio", "bw ratio", fmt::format("{} bw GB/s", tool), "bw ratio",
      fmt::format("{} lat us", tool), "lat ratio");
  nlohmann::json out = {
      {"run", provenance()},
      {"across_hosts", o.connect.empty() ? nlohmann::json() : nlohmann::json(o.connect)},
      {"transport", o.transport},
      {"provider", o.transport == "fabric" ? nlohmann::json(o.provider) : nlohmann::json()},
      {"rdma_device", o.rdma_device},
      {"rails", o.rails},
      {"memory", o.memory},
      {"peer_memory", peer_memory},
      {"iterations", o.iterations},
      {"window", o.window},
      {"notify_every", o.notify_every},
      {"busy_poll", o.busy_poll},
      {"staging_slots", o.staging_slots},
      {"staging_slot_kib", o.staging_slot_kib},
      {"rows", nlohmann::json::array()}};
  for (const Row& r : rows) {
    double ratio = r.bandwidth_gbps / r.memcpy_gbps;
    std::string baseline =
        (r.tool_gbps > 0
             ? fmt::format("{:>16.3f} {:>8.2f}", r.tool_gbps, r.bandwidth_gbps / r.tool_gbps)
             : fmt::format("{:>16} {:>8}", "-", "-")) +
        (r.tool_lat_us > 0
             ? fmt::format(" {:>15.2f} {:>9.2f}", r.tool_lat_us, r.latency_p50_us / r.tool_lat_us)
             : fmt::format(" {:>15} {:>9}", "-", "-"));
    fmt::print(
        "{:>8} {:>12.2f} {:>12.2f} {:>11.3f} | {:>13.2f} {:>12.3f} {:>9.2f} | {:>11.2f} {:>9.2f} "
        "{:>8.2f} | {}\n",
        human(r.size), r.latency_p50_us, r.latency_p99_us, r.bandwidth_gbps, r.memcpy_p50_us,
        r.memcpy_gbps, ratio, r.dma_p50_us, r.latency_p50_us / r.dma_p50_us,
        r.bandwidth_gbps / r.dma_gbps, baseline);
    out["rows"].push_back({{"size", r.size},
                           {"latency_p50_us", r.latency_p50_us},
                           {"latency_p99_us", r.latency_p99_us},
                           {"bandwidth_GBps", r.bandwidth_gbps},
                           {"memcpy_p50_us", r.memcpy_p50_us},
                           {"memcpy_GBps", r.memcpy_gbps},
                           {"bandwidth_ratio_to_memcpy", ratio},
                           {"one_dma_p50_us", r.dma_p50_us},
                           {"one_dma_GBps", r.dma_gbps},
                           {"latency_ratio_to_one_dma", r.latency_p50_us / r.dma_p50_us},
                           {"bandwidth_ratio_to_one_dma", r.bandwidth_gbps / r.dma_gbps},
                           {"latency_samples_us", r.latency_us},
                           {"memcpy_samples_us", r.memcpy_us},
                           {"one_dma_samples_us", r.dma_us}});
    if (r.tool_gbps > 0) {
      out["rows"].back()[fmt::format("{}_bw_GBps", tool)] = r.tool_gbps;
      out["rows"].back()[fmt::format("bandwidth_ratio_to_{}", tool)] =
          r.bandwidth_gbps / r.tool_gbps;
    }
    if (r.tool_lat_us > 0) {
      out["rows"].back()[fmt::format("{}_lat_us", tool)] = r.tool_lat_us;
      out["rows"].back()[fmt::format("latency_ratio_to_{}", tool)] =
          r.latency_p50_us / r.tool_lat_us;
    }
  }
  if (o.json_out) o.json_out->write(out);
}

}  // namespace hetmesh::cli::transport_bench
