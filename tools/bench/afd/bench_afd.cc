// `hetmesh bench afd`: the AFD round trip in StepMesh's shape by default (2A2F, 128 tokens,
// hidden 7168, fp8 A2F = 896 KiB per A, bf16 F2A = 1.75 MiB per A, 3 micro-batches), with no
// compute, so it measures the engine and the transport. Three baselines move the same bytes in the
// same run:
//   - memcpy, serial and hot: one thread copies one A's round-trip bytes one buffer after another,
//     the same small buffers every time (cache-hot): the strictest, and the target;
//   - memcpy, parallel over the slots: one thread per (A, F) pair copies A's tokens into F's slot
//     and F's outputs back, every pair at once, through buffers laid out and sized like the
//     engine's slots (so the same cache footprint), one round trip per A at a time: the same bytes
//     with the same parallelism as the engine;
//   - the bare transport: the same processes, the same one-sided writes with notifications (A2F
//     to every F, each F answering at once), the same micro-batches in flight, and no engine.
// This file is the command: its options, the jobs it starts on this host, and their results.
#include "bench_afd.hpp"

#include "commands.hpp"

#include <hetmesh/afd/job.hpp>
#include <hetmesh/afd/launcher.hpp>
#include <hetmesh/core/error.hpp>
#include <hetmesh/core/log.hpp>
#include <hetmesh/core/metrics_server.hpp>
#include <hetmesh/core/socket.hpp>
#include <hetmesh/core/thread.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

namespace hetmesh::cli {
namespace {

namespace fs = std::filesystem;
using afd::Dtype;
using afd::JobConfig;

JobConfig stepmesh_shape() {
  JobConfig c;
  c.job.attention = 2;
  c.job.ffn = 2;
  c.job.micro_batches = 3;
  c.model.tokens = 128;
  c.model.hidden = 7168;
  c.model.experts = 8;
  c.model.top_k = 8;
  c.model.a2f_dtype = Dtype::fp8;
  c.model.f2a_dtype = Dtype::bf16;
  c.devices.attention.assign(2, "cpu:0");
  c.devices.ffn.assign(2, "cpu:0");
  return c;
}

// The role without its job's prefix ("bare-", "caller-").
std::string base_role(const std::string& role) {
  const size_t dash = role.find('-');
  return dash == std::string::npos ? role : role.substr(dash + 1);
}

afd::DataCounters counters_from(const nlohmann::json& moved) {
  return {moved["caller_bytes"].get<uint64_t>(), moved["slot_bytes"].get<uint64_t>(),
          moved["staged_bytes"].get<uint64_t>(), moved["caller_buffers"].get<uint64_t>()};
}

void add(afd::DataCounters& sum, const afd::DataCounters& more) {
  sum.caller_bytes += more.caller_bytes;
  sum.slot_bytes += more.slot_bytes;
  sum.staged_bytes += more.staged_bytes;
  sum.caller_buffers += more.caller_buffers;
}

// Runs this host's instances of one job (the engine's, or with prefix "bare-" the bare
// transport's) to completion; throws saying why the job failed. Returns false when it was
// interrupted (SIGINT, SIGTERM).
bool run_instances(afd::Launcher& launcher, const JobConfig& c, const AfdBenchOptions& o,
                   const std::string& prefix, const std::vector<std::string>& more_args = {}) {
  afd::Launcher::Run run;
  run.job = job_id(prefix + "attention");
  run.role_prefix = prefix;
  run.args = {"--iterations", std::to_string(o.iterations), "--warmup", std::to_string(o.warmup),
              "--gap-us",     std::to_string(o.gap_us)};
  run.args.insert(run.args.end(), more_args.begin(), more_args.end());
  run.limit = c.job.join_timeout +
              std::chrono::duration_cast<std::chrono::milliseconds>(c.job.timeout * 10);
  run.stopped_limit = c.job.timeout + std::chrono::milliseconds(500);
  const afd::Launcher::Outcome outcome = launcher.run(run);
  if (outcome.interrupted != 0) return false;
  if (!outcome.failures.empty())
    throw Error(HM_ERR_INTERNAL,
                fmt::format("bench afd: {}", fmt::join(outcome.explanation, "; ")));
  return true;
}

// A base port from which `count` ports are free on loopback now, below Linux's ephemeral ports
// (32768-60999 by default): no other socket's bind-to-0 or connect takes one meanwhile.
int free_ports(int count) {
  for (int attempt = 0; attempt < 100; ++attempt) {
    const int base = 10000 + static_cast<int>(std::random_device{}() % (22768 - count));
    try {
      for (int port = base; port < base + count; ++port)
        net::listen_on(net::resolve(fmt::format("127.0.0.1:{}", port), true, "a port")[0],
                       "a port");
      return base;
    } catch (const Error&) {
    }
  }
  throw Error(HM_ERR_BACKEND, "bench afd --scrape: no free ports for the metrics");
}

// The job run once more with its metrics served on loopback, scraped here 10 times a second
// (Prometheus' default is once in 15 s) until it ends. Returns the scrapes answered, or nullopt
// when the run was interrupted.
std::optional<uint64_t> run_scraped(afd::Launcher& launcher, const JobConfig& c,
                                    const AfdBenchOptions& o) {
  const int instances = c.job.attention + c.job.ffn;
  const int base = free_ports(instances);
  std::vector<std::string> addresses;
  for (int a : launcher.local().attention)
    addresses.push_back(fmt::format("127.0.0.1:{}", base + a));
  for (int f : launcher.local().ffn)
    addresses.push_back(fmt::format("127.0.0.1:{}", base + c.job.attention + f));
  std::atomic<bool> done{false};
  std::atomic<uint64_t> answered{0};
  std::thread scraper = start_thread("hm-scraper", [&] {
    while (!done.load()) {
      for (const std::string& address : addresses) {
        try {
          metrics::scrape(address, "", std::chrono::milliseconds(1000));
          answered.fetch_add(1);
        } catch (const std::exception&) {  // not serving yet, or done (or out of memory here)
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  bool finished = false;
  try {
    finished = run_instances(launcher, c, o, "scraped-",
                             {"--metrics-listen", fmt::format("127.0.0.1:{}", base)});
  } catch (...) {
    done = true;
    scraper.join();
    throw;
  }
  done = true;
  scraper.join();
  return finished ? std::optional<uint64_t>(answered.load()) : std::nullopt;
}

nlohmann::json read_json(const fs::path& path) {
  return nlohmann::json::parse(std::ifstream(path));
}

// The round trips of this host's attention instances in the run whose roles carry `prefix`.
afd::Percentiles round_trip_of(const afd::Launcher& launcher, const JobConfig& c,
                               const std::string& prefix, bool all_instances) {
  std::vector<afd::AttentionTrace> traces;
  for (int a : launcher.local().attention) {
    std::ifstream in(launcher.folder() / fmt::format("{}attention{}.trace.json", prefix, a));
    traces.push_back(afd::trace_from_json({std::istreambuf_iterator<char>(in), {}}));
  }
  return afd::compute_metrics(traces, all_instances, c.tracing.straggler_factor)
      .values["round trip"];
}

// What the instances left in the job's folder: the engine's round trips (also written as a Chrome
// trace with --trace), throughput, registered memory and the bare transport's round trips; then the
// memcpy baselines, measured here.
AfdBenchResults collect(const afd::Launcher& launcher, const JobConfig& c,
                        const AfdBenchOptions& o) {
  AfdBenchResults r;
  const afd::EngineSpec spec = afd::engine_spec(c, afd::Role::attention, 0);
  r.a2f_bytes = uint64_t{spec.tokens} * spec.a2f_bytes_per_token();  // tokens and routing
  r.f2a_bytes = spec.f2a_slot_bytes();
  r.bytes_per_round_trip = uint64_t(c.job.ffn) * (r.a2f_bytes + r.f2a_bytes);
  r.all_instances = launcher.everything();
  for (const auto* role : {&launcher.places().attention, &launcher.places().ffn})
    for (const afd::InstancePlace& place : *role)
      r.cpu_block_size = std::max(r.cpu_block_size, static_cast<int>(place.cpus.size()));

  std::vector<afd::AttentionTrace> traces;
  std::vector<double> bare;
  for (int a : launcher.local().attention) {
    std::ifstream in(launcher.folder() / fmt::format("attention{}.trace.json", a));
    traces.push_back(afd::trace_from_json({std::istreambuf_iterator<char>(in), {}}));
    auto info = read_json(launcher.folder() / fmt::format("attention{}.info.json", a));
    r.registered += info["registered"].get<uint64_t>();
    double span = info["span_ns"].get<double>();
    r.throughput_gbps += 8.0 * static_cast<double>(r.bytes_per_round_trip) *
                         static_cast<double>(traces.back().trips.size()) / span;
    if (o.bare) {
      auto trips = read_json(launcher.folder() / fmt::format("bare-attention{}.json", a))
                       .get<std::vector<double>>();
      bare.insert(bare.end(), trips.begin(), trips.end());
    }
  }
  for (int f : launcher.local().ffn) {
    auto info = read_json(launcher.folder() / fmt::format("ffn{}.info.json", f));
    r.registered += info["registered"].get<uint64_t>();
    add(r.slots_moved, counters_from(info["moved"]));
  }
  for (int a : launcher.local().attention)
    add(r.slots_moved, counters_from(read_json(launcher.folder() /
                                               fmt::format("attention{}.info.json", a))["moved"]));
  if (o.caller_buffers) {
    for (int a : launcher.local().attention)
      add(r.caller_moved,
          counters_from(read_json(launcher.folder() /
                                  fmt::format("caller-attention{}.info.json", a))["moved"]));
    for (int f : launcher.local().ffn)
      add(r.caller_moved,
          counters_from(
              read_json(launcher.folder() / fmt::format("caller-ffn{}.info.json", f))["moved"]));
    r.caller_round_trip = round_trip_of(launcher, c, "caller-", r.all_instances);
  }
  if (o.scrape) {
    r.scraped_round_trip = round_trip_of(launcher, c, "scraped-", r.all_instances);
    r.again_round_trip = round_trip_of(launcher, c, "again-", r.all_instances);
  }

  // One-way times subtract an A's clock from an F's: meaningful only when they share a host.
  r.metrics = afd::compute_metrics(traces, r.all_instances, c.tracing.straggler_factor);
  if (!o.trace.empty()) afd::write_chrome_trace(o.trace, traces);
  r.memcpy_us = c.job.ffn * (memcpy_p50_us(r.a2f_bytes, 200) + memcpy_p50_us(r.f2a_bytes, 200));
  r.memcpy_parallel_us = memcpy_parallel_p50_us(spec, 200);
  r.raw_pair_us = raw_pair_p50_us(c, r.a2f_bytes, r.f2a_bytes, 200);
  if (o.bare) r.bare = afd::percentiles(bare);
  return r;
}

int run_bench(const JobConfig& c, const AfdBenchOptions& o) {
  // The engine's slots must fit in this machine's memory; the bare baseline runs after the
  // engine, with the same slots.
  afd::LaunchRequest request;
  request.command = {"bench", "afd"};
  request.config_name = o.config.empty() ? "the default job (StepMesh's shape)" : o.config;
  request.memory_advice =
      "make [model] tokens or hidden, or [job] micro_batches smaller, or start fewer instances "
      "here (--instances)";
  afd::Launcher launcher(c, o, request, "bench-afd");
  if (auto advice = afd::shared_device_advice(c)) fmt::print("{}\n", *advice);
  if (auto share = launcher.share(); !share.empty()) {
    fmt::print("{}\n", share);
    std::fflush(stdout);  // an invocation on another host needs the store's address now
  }
  if (!run_instances(launcher, c, o, "") || (o.bare && !run_instances(launcher, c, o, "bare-")) ||
      (o.caller_buffers && !run_instances(launcher, c, o, "caller-")))
    return launcher.exit_status(0);
  std::optional<uint64_t> scrapes;
  if (o.scrape &&
      (!(scrapes = run_scraped(launcher, c, o)) || !run_instances(launcher, c, o, "again-")))
    return launcher.exit_status(0);
  if (launcher.local().attention.empty()) {
    fmt::print("ffn instance(s) {} done; the host of the attention instances reports\n",
               fmt::join(launcher.local().ffn, ","));
    return 0;
  }
  AfdBenchResults results = collect(launcher, c, o);
  results.scrapes = scrapes.value_or(0);
  report(c, o, results);
  return launcher.exit_status(0);
}

int run_role(const JobConfig& c, const AfdBenchOptions& o) {
  if (o.role.empty()) return run_bench(c, o);
  set_log_identity(fmt::format("{}:{}", o.role, o.rank));  // a child
  const afd::InstanceIdentity self{o.store, job_id(o.role), base_role(o.role), o.rank,
                                   c.job.timeout};
  return afd::run_instance(self, [&] {
    if (o.role == "bare-attention") return run_bare_attention(c, o);
    if (o.role == "bare-ffn") return run_bare_ffn(c, o);
    const bool caller = o.role.rfind("caller-", 0) == 0;
    JobConfig scraped = c;
    if (!o.metrics_listen.empty()) scraped.metrics.listen = o.metrics_listen;
    if (self.role == "attention") return run_attention(scraped, o, caller);
    if (self.role == "ffn") return run_ffn(scraped, o, caller);
    throw Error(HM_ERR_INVALID_ARGUMENT, fmt::format("--role {}: unknown", o.role));
  });
}

}  // namespace

std::string job_id(const std::string& role) {
  if (role.rfind("bare-", 0) == 0) return "bare";
  if (role.rfind("caller-", 0) == 0) return "caller";
  if (role.rfind("scraped-", 0) == 0) return "scraped";
  if (role.rfind("again-", 0) == 0) return "again";
  return afd::EngineSpec{}.job;
}

void add_bench_afd_command(CLI::App& bench) {
  auto o = std::make_shared<AfdBenchOptions>();
  CLI::App* cmd = bench.add_subcommand("afd", "AFD round trips, StepMesh's shape by default");
  cmd->add_option("--config", o->config, "job config (TOML); default: StepMesh's 2A2F shape");
  cmd->add_option("--iterations", o->iterations, "measured round trips per micro-batch")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000000));
  cmd->add_option("--warmup", o->warmup, "unmeasured round trips first")->capture_default_str();
  cmd->add_option("--gap-us", o->gap_us,
                  "the host's own work between a micro-batch's result and its next push (a "
                  "layer's compute), in us; the bare baseline pauses alike")
      ->capture_default_str()
      ->check(CLI::Range(0, 1000000));
  cmd->add_option("--json", o->json, "also write the results here");
  cmd->add_option("--trace", o->trace,
                  "write the engine's round trips here as a Chrome trace (Perfetto)");
  cmd->add_flag("!--no-bare", o->bare,
                "skip the bare-transport baseline (it runs the job a second time)");
  cmd->add_flag("--caller-buffers", o->caller_buffers,
                "also run the engine from and into buffers of the instances' own (the "
                "application's) instead of its slots, and compare (the job runs once more)");
  cmd->add_flag("--scrape", o->scrape,
                "also run the job serving its metrics on loopback while this process scrapes "
                "every instance 10 times a second, and compare (the job runs once more)");
  cmd->add_option("--metrics-listen", o->metrics_listen, "internal")->group("");
  add_job_launch_options(*cmd, *o);
  cmd->callback([o] {
    JobConfig c = o->config.empty() ? stepmesh_shape() : afd::load_config(o->config);
    if (o->role.empty() && !o->json.empty()) o->json_out = std::make_shared<JsonOutput>(o->json);
    if (int rc = run_role(c, *o); rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace hetmesh::cli
