// `hetmesh bench afd`: the report of one run, a table on stdout and optionally JSON. ci/bench.sh
// and ci/gpu/afd_summary.py read the JSON: its keys stay.
#include "bench_afd.hpp"
#include "provenance.hpp"

#include <hetmesh/afd/job.hpp>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <thread>

namespace hetmesh::cli {
namespace {

// Metrics a run lacks read as zeros (operator[]), in the table and then in the JSON.
// The scraped run's p50 over the mean of the unserved runs before and after it: drift between
// runs that grows or shrinks steadily cancels.
double scraped_over_unserved(AfdBenchResults& r) {
  const double before = r.metrics.values["round trip"].p50, after = r.again_round_trip->p50;
  return r.scraped_round_trip->p50 / ((before + after) / 2);
}

void print_table(const afd::JobConfig& c, const AfdBenchOptions& o, AfdBenchResults& r) {
  const afd::Percentiles& rt = r.metrics.values["round trip"];
  const unsigned cpus = std::thread::hardware_concurrency();
  const int instances = c.job.attention + c.job.ffn;

  fmt::print(
      "hetmesh bench afd ({}): {}A{}F, {} tokens x hidden {}, A2F {} ({} KiB per A per F), "
      "F2A {} ({} KiB per A per F), {} micro-batches, transport {}, A on {}, F on {}\n",
      HETMESH_VERSION, c.job.attention, c.job.ffn, c.model.tokens, c.model.hidden,
      to_string(c.model.a2f_dtype), r.a2f_bytes / 1024, to_string(c.model.f2a_dtype),
      r.f2a_bytes / 1024, c.job.micro_batches, to_string(afd::single_host_transport(c)),
      c.devices.attention[0], c.devices.ffn[0]);
  fmt::print("instances: {}\n",
             r.cpu_block_size > 0
                 ? fmt::format("each pinned to {} CPUs of {}, of its device's NUMA node where "
                               "the topology says",
                               r.cpu_block_size, cpus)
                 : fmt::format("not pinned ({} CPUs)", cpus));
  if (o.gap_us > 0)
    fmt::print("host work between a micro-batch's result and its next push: {} us (--gap-us)\n",
               o.gap_us);
  fmt::print("{:<30} {:>10} {:>10}\n", "(us)", "p50", "p99");
  for (auto [label, name] : {std::pair{"A2F", "A2F network*"}, std::pair{"F2A", "F2A network*"},
                             std::pair{"round trip", "round trip"},
                             std::pair{"net cost (skew-free)", "net cost (skew-free)"}})
    fmt::print("{:<30} {:>10.1f} {:>10.1f}\n", label, r.metrics.values[name].p50,
               r.metrics.values[name].p99);
  fmt::print("baselines, the same {} bytes per A per round trip, same run:\n",
             r.bytes_per_round_trip);
  fmt::print("{:<30} {:>10.1f} {:>10}   one thread, one buffer after another, cache-hot\n",
             "memcpy (serial, hot)", r.memcpy_us, "");
  fmt::print(
      "{:<30} {:>10.1f} {:>10}   a thread per (A, F) pair, all at once, buffers of the engine's "
      "slot layout, 1 micro-batch in flight\n",
      "memcpy (parallel, slots)", r.memcpy_parallel_us, "");
  if (r.bare)
    fmt::print(
        "{:<30} {:>10.1f} {:>10.1f}   same processes and writes + notifications, {} "
        "micro-batches in flight, no engine\n",
        "bare transport round trip", r.bare->p50, r.bare->p99, c.job.micro_batches);
  if (r.raw_pair_us)
    fmt::print(
        "{:<30} {:>10.1f} {:>10}   each plugin's memcpy_async to and from its pinned memory, "
        "one after another, no transport\n",
        "raw pair (device copies)", *r.raw_pair_us, "");
  fmt::print("{:<30} {:>10.2f}x  (the issue's target: 1.5x)\n", "round trip / memcpy (serial)",
             rt.p50 / r.memcpy_us);
  if (r.raw_pair_us)
    fmt::print("{:<30} {:>10.2f}x  (target: 1.5x)\n", "round trip / raw pair",
               rt.p50 / *r.raw_pair_us);
  fmt::print("{:<30} {:>10.2f}x\n", "round trip / memcpy (parallel)",
             rt.p50 / r.memcpy_parallel_us);
  if (r.bare)
    fmt::print("{:<30} {:>10.2f}x\n", "round trip / bare transport", rt.p50 / r.bare->p50);
  auto moved = [](const afd::DataCounters& m) {
    return fmt::format("{} B from/into the application's buffers, {} B the slots, {} B staged",
                       m.caller_bytes, m.slot_bytes, m.staged_bytes);
  };
  fmt::print("{:<30} {}\n", "moved (engine's slots)", moved(r.slots_moved));
  if (r.caller_round_trip) {
    fmt::print(
        "{:<30} {:>10.1f} {:>10.1f}   the application's own buffers in place of the "
        "slots, the same job once more\n",
        "round trip (caller buffers)", r.caller_round_trip->p50, r.caller_round_trip->p99);
    fmt::print("{:<30} {:>10.3f}x  (target: within 3%)\n", "caller buffers / slots",
               r.caller_round_trip->p50 / rt.p50);
    fmt::print("{:<30} {}\n", "moved (caller buffers)", moved(r.caller_moved));
  }
  if (r.scraped_round_trip && r.again_round_trip) {
    fmt::print("{:<30} {:>10.1f} {:>10.1f}   ({} scrapes, 10 a second per instance)\n",
               "round trip (scraped)", r.scraped_round_trip->p50, r.scraped_round_trip->p99,
               r.scrapes);
    fmt::print("{:<30} {:>10.1f} {:>10.1f}   not served, the run after the scraped one\n",
               "round trip (again)", r.again_round_trip->p50, r.again_round_trip->p99);
    fmt::print(
        "{:<30} {:>10.3f}x  (target: within 2%; the two unserved runs around it differ "
        "by {:.3f}x)\n",
        "scraped / not served", scraped_over_unserved(r), r.again_round_trip->p50 / rt.p50);
  }

  if (cpus > 0 && cpus < static_cast<unsigned>(2 * instances))
    fmt::print(
        "note: {} CPUs for {} instances (each with a comm thread and a sender per peer): the "
        "copies compete for cores and memory bandwidth, and {} micro-batches in flight per A "
        "queue behind each other, so compare with the parallel memcpy and the bare transport\n",
        cpus, instances, c.job.micro_batches);
  fmt::print("{:<30} {:>10.2f} Gb/s (all A, both directions)\n", "throughput", r.throughput_gbps);
  fmt::print("{:<30} {:>10.1f} MiB ({})\n\n{}", "memory registered",
             static_cast<double>(r.registered) / (1 << 20),
             r.all_instances ? "all instances" : "the instances on this host",
             afd::format_metrics(r.metrics));
}

nlohmann::json to_json(const afd::JobConfig& c, const AfdBenchOptions& o, AfdBenchResults& r) {
  const afd::Percentiles& rt = r.metrics.values["round trip"];
  const unsigned cpus = std::thread::hardware_concurrency();
  nlohmann::json out = {
      {"run", provenance()},
      {"attention", c.job.attention},
      {"ffn", c.job.ffn},
      {"micro_batches", c.job.micro_batches},
      {"gap_us", o.gap_us},
      {"tokens", c.model.tokens},
      {"hidden", c.model.hidden},
      {"transport", to_string(afd::single_host_transport(c))},
      {"cpus", cpus},
      {"cpus_per_instance_pinned", r.cpu_block_size},
      {"bytes_per_round_trip_per_attention", r.bytes_per_round_trip},
      {"memcpy_baseline_us", r.memcpy_us},
      {"memcpy_parallel_baseline_us", r.memcpy_parallel_us},
      {"bare_transport_round_trip_us",
       r.bare ? nlohmann::json{{"p50", r.bare->p50}, {"p99", r.bare->p99}} : nlohmann::json()},
      {"raw_pair_us", r.raw_pair_us ? nlohmann::json(*r.raw_pair_us) : nlohmann::json()},
      {"round_trip_over_raw_pair",
       r.raw_pair_us ? nlohmann::json(rt.p50 / *r.raw_pair_us) : nlohmann::json()},
      {"round_trip_over_memcpy", rt.p50 / r.memcpy_us},
      {"round_trip_over_memcpy_parallel", rt.p50 / r.memcpy_parallel_us},
      {"round_trip_over_bare_transport",
       r.bare ? nlohmann::json(rt.p50 / r.bare->p50) : nlohmann::json()},
      {"throughput_gbps", r.throughput_gbps},
      {"registered_bytes", r.registered},
      {"moved_slots",
       {{"caller_bytes", r.slots_moved.caller_bytes},
        {"slot_bytes", r.slots_moved.slot_bytes},
        {"staged_bytes", r.slots_moved.staged_bytes}}},
      {"caller_buffers", r.caller_round_trip
                             ? nlohmann::json{{"round_trip_p50_us", r.caller_round_trip->p50},
                                              {"round_trip_p99_us", r.caller_round_trip->p99},
                                              {"over_slots", r.caller_round_trip->p50 / rt.p50},
                                              {"caller_bytes", r.caller_moved.caller_bytes},
                                              {"slot_bytes", r.caller_moved.slot_bytes},
                                              {"staged_bytes", r.caller_moved.staged_bytes}}
                             : nlohmann::json()},
      {"scraped", r.scraped_round_trip && r.again_round_trip
                      ? nlohmann::json{{"round_trip_p50_us", r.scraped_round_trip->p50},
                                       {"round_trip_p99_us", r.scraped_round_trip->p99},
                                       {"over_not_served", scraped_over_unserved(r)},
                                       {"again_round_trip_p50_us", r.again_round_trip->p50},
                                       {"again_over_first", r.again_round_trip->p50 / rt.p50},
                                       {"scrapes", r.scrapes}}
                      : nlohmann::json()},
      {"metrics", nlohmann::json::object()}};
  for (const auto& [name, p] : r.metrics.values)
    out["metrics"][name] = {{"p50_us", p.p50},
                            {"p99_us", p.p99},
                            {"mean_us", p.mean},
                            {"max_us", p.max},
                            {"count", p.count}};
  return out;
}

}  // namespace

void report(const afd::JobConfig& c, const AfdBenchOptions& o, AfdBenchResults& results) {
  print_table(c, o, results);
  if (o.json_out) o.json_out->write(to_json(c, o, results));
  if (!o.trace.empty()) fmt::print("trace: {}\n", o.trace);
}

}  // namespace hetmesh::cli
