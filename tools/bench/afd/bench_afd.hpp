// `hetmesh bench afd`, shared by its files: the options, the instance roles (the engine's and the
// bare transport's, each a child process), the memcpy baselines and the report.
//   bench_afd.cc            the command: options, starting the jobs, collecting their results
//   bench_afd_roles.cc      the engine's attention and FFN instances
//   bench_afd_bare.cc       the bare-transport baseline's instances: the same writes, no engine
//   bench_afd_memcpy.cc     the memcpy baselines
//   bench_afd_pair.cc       the raw pair: the device copies alone, when A or F is a device
//   bench_afd_report.cc     the table and the JSON
#pragma once

#include "json_output.hpp"

#include "job_options.hpp"

#include <hetmesh/afd/engine.hpp>
#include <hetmesh/afd/job_config.hpp>
#include <hetmesh/afd/metrics.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace hetmesh::cli {

struct AfdBenchOptions : afd::LaunchOptions {  // role: attention, ffn, bare-attention, bare-ffn
  std::string config;
  int iterations = 200;
  int warmup = 20;
  // The host's own work between a micro-batch's result and its next push (a layer's compute), in
  // microseconds: the engine's threads then find no work for that long, as in a framework's step.
  int gap_us = 0;
  std::string json;
  std::shared_ptr<JsonOutput> json_out;  // the launcher's, opened before the job starts
  std::string trace;                     // Chrome trace of the engine's round trips
  bool bare = true;                      // also run the bare-transport baseline
  // Also run the engine with the application's own buffers (PushOptions, an F's part outputs)
  // in place of its slots: its instances' roles are "caller-attention" and "caller-ffn".
  bool caller_buffers = false;
  // Also run the job serving its metrics on loopback ([metrics] listen) while this process
  // scrapes every instance 10 times a second: its instances' roles are "scraped-attention" and
  // "scraped-ffn", each told the address by --metrics-listen. Then the job once more, not served
  // ("again-"): the two unserved runs around the scraped one bound the drift between runs.
  bool scrape = false;
  std::string metrics_listen;
};

// ---- the instances (child processes), each writing its results under o.out ----

// The rendezvous job id of the instances with this role ("attention", "bare-ffn",
// "caller-attention"...): each run of the job has its own in the one store.
std::string job_id(const std::string& role);

// The engine's: <role><rank>.trace.json and .info.json (registered bytes, measured span, the
// engine's DataCounters) for an A; <role><rank>.info.json (registered bytes, counters) for an F.
// With `caller`, from and into buffers of their own (the application's) instead of the slots.
int run_attention(const afd::JobConfig& c, const AfdBenchOptions& o, bool caller);
int run_ffn(const afd::JobConfig& c, const AfdBenchOptions& o, bool caller);
// The bare transport's: bare-attention<rank>.json (its round trips, us).
int run_bare_attention(const afd::JobConfig& c, const AfdBenchOptions& o);
int run_bare_ffn(const afd::JobConfig& c, const AfdBenchOptions& o);
// Keeps this thread busy for `gap_us` microseconds (the host's work of a layer).
void host_work(int gap_us);

// ---- the memcpy baselines, in this process ----

// p50 of one memcpy of `bytes`, the same two buffers every time (cache-hot).
double memcpy_p50_us(uint64_t bytes, int samples);
// p50 of one A's round trip done as memcpys with the engine's parallelism and slot layout.
double memcpy_parallel_p50_us(const afd::EngineSpec& spec, int samples);
// p50 of the raw pair (bench_afd_pair.cc) for `a2f` bytes out and `f2a` back per F; nullopt when
// both A's and F's memories are host-addressable (no device copy to make).
std::optional<double> raw_pair_p50_us(const afd::JobConfig& c, uint64_t a2f, uint64_t f2a,
                                      int samples);

// ---- the report ----

struct AfdBenchResults {
  afd::Metrics metrics;                   // the engine's round trips
  uint64_t a2f_bytes = 0, f2a_bytes = 0;  // one A to one F, and back, per round trip
  uint64_t bytes_per_round_trip = 0;      // per A: ffn x (a2f + f2a)
  double memcpy_us = 0, memcpy_parallel_us = 0;
  std::optional<afd::Percentiles> bare;  // the bare transport's round trips, unless --no-bare
  std::optional<double> raw_pair_us;     // the device copies alone, when A or F is a device
  // With --caller-buffers: the engine's round trips from and into the application's buffers,
  // and what every instance of each run moved (DataCounters summed).
  std::optional<afd::Percentiles> caller_round_trip;
  afd::DataCounters slots_moved, caller_moved;
  // With --scrape: the engine's round trips while scraped, the scrapes that answered, and the
  // round trips of the unserved run after it.
  std::optional<afd::Percentiles> scraped_round_trip, again_round_trip;
  uint64_t scrapes = 0;
  double throughput_gbps = 0;  // all A, both directions
  uint64_t registered = 0;     // bytes, the instances on this host
  bool all_instances = true;   // every instance of the job ran on this host
  int cpu_block_size = 0;      // CPUs per pinned instance; 0 = not pinned
};

// The table on stdout; with o.json, the same as JSON there (ci/bench.sh, ci/gpu/afd_summary.py).
void report(const afd::JobConfig& c, const AfdBenchOptions& o, AfdBenchResults& results);

}  // namespace hetmesh::cli
