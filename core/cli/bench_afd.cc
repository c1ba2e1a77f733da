// `hetmesh bench afd`: the AFD round trip in StepMesh's shape by default (2A2F, 128 tokens,
// hidden 7168, fp8 A2F = 896 KiB per A, bf16 F2A = 1.75 MiB per A, 3 micro-batches), with no
// compute, so it measures the engine and the transport. The same bytes moved by memcpy in the
// same run are the baseline.
#include "commands.hpp"

#include <hetmesh/afd.hpp>
#include <hetmesh/afd_job.hpp>
#include <hetmesh/afd_metrics.hpp>
#include <hetmesh/config.hpp>
#include <hetmesh/rendezvous.hpp>
#include <hetmesh/subprocess.hpp>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>

namespace hetmesh::cli {
namespace {

namespace fs = std::filesystem;
using afd::now_ns;

struct AfdBenchOptions {
  std::string config;
  int iterations = 200;
  int warmup = 20;
  std::string json;
  std::string role;  // internal
  int rank = 0;
  std::string store, out;
};

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

Device device_for(const JobConfig& c, const std::string& selector) {
  return afd::load_plugins(c).device(selector);
}

uint64_t total(const std::vector<std::pair<std::string, uint64_t>>& regions) {
  uint64_t sum = 0;
  for (const auto& [name, bytes] : regions)
    sum += bytes;
  return sum;
}

int run_attention(const JobConfig& c, const AfdBenchOptions& o) {
  Device device = device_for(c, c.devices.attention.at(static_cast<size_t>(o.rank)));
  auto store = connect_tcp_store(o.store, c.job.timeout);
  afd::AttentionEngine engine(afd::engine_spec(c, afd::Role::attention, o.rank), device, *store);
  const int M = c.job.micro_batches;
  std::vector<afd::AttentionEngine::Handle> handles(static_cast<size_t>(M));
  afd::AttentionTrace trace{o.rank, {}};
  int64_t measured_start = 0, measured_end = 0;
  for (int it = 0; it < o.warmup + o.iterations; ++it) {
    if (it == o.warmup) measured_start = now_ns();
    for (int mb = 0; mb < M; ++mb) {
      if (it > 0) {
        auto trip = engine.wait(handles[static_cast<size_t>(mb)], c.job.timeout);
        if (it > o.warmup) trace.trips.push_back(trip);
      }
      handles[static_cast<size_t>(mb)] =
          engine.push_pull(mb, static_cast<uint32_t>(c.model.tokens), {}, now_ns());
    }
  }
  for (int mb = 0; mb < M; ++mb)
    trace.trips.push_back(engine.wait(handles[static_cast<size_t>(mb)], c.job.timeout));
  measured_end = now_ns();
  std::ofstream(fs::path(o.out) / fmt::format("attention{}.trace.json", o.rank))
      << afd::trace_to_json(trace);
  std::ofstream(fs::path(o.out) / fmt::format("attention{}.info.json", o.rank)) << nlohmann::json{
      {"registered", total(engine.registered())},
      {"span_ns", measured_end - measured_start}}.dump();
  return 0;
}

int run_ffn(const JobConfig& c, const AfdBenchOptions& o) {
  Device device = device_for(c, c.devices.ffn.at(static_cast<size_t>(o.rank)));
  auto store = connect_tcp_store(o.store, c.job.timeout);
  afd::FfnEngine engine(afd::engine_spec(c, afd::Role::ffn, o.rank), device, *store);
  std::ofstream(fs::path(o.out) / fmt::format("ffn{}.info.json", o.rank))
      << nlohmann::json{{"registered", total(engine.registered())}}.dump();
  while (auto batch = engine.get_batch(c.job.timeout))
    engine.respond(*batch, nullptr, now_ns());
  return 0;
}

double memcpy_p50_us(uint64_t bytes, int samples) {
  std::vector<uint8_t> a(bytes, 1), b(bytes, 2);
  std::vector<double> us;
  for (int i = 0; i < samples + 5; ++i) {
    int64_t t0 = now_ns();
    std::memcpy(b.data(), a.data(), bytes);
    int64_t t1 = now_ns();
    if (i >= 5) us.push_back(static_cast<double>(t1 - t0) / 1e3);
    a[static_cast<size_t>(i) % bytes] ^= b[bytes / 2];
  }
  return afd::percentiles(us).p50;
}

int run_bench(const JobConfig& c, const AfdBenchOptions& o) {
  fs::path dir = fs::temp_directory_path() / fmt::format("hetmesh-bench-afd-{}", getpid());
  fs::create_directories(dir);
  fs::path config_file = dir / "job.toml";
  std::ofstream(config_file) << to_toml(c);
  TcpStoreServer store(c.rendezvous.address);
  std::vector<std::unique_ptr<ChildProcess>> children;
  auto spawn = [&](const char* role, int rank) {
    children.push_back(std::make_unique<ChildProcess>(std::vector<std::string>{
        self_executable(), "bench", "afd", "--config", config_file.string(), "--role", role,
        "--rank", std::to_string(rank), "--store", store.address(), "--out", dir.string(),
        "--iterations", std::to_string(o.iterations), "--warmup", std::to_string(o.warmup)}));
  };
  for (int f = 0; f < c.job.ffn; ++f)
    spawn("ffn", f);
  for (int a = 0; a < c.job.attention; ++a)
    spawn("attention", a);
  auto limit = std::chrono::duration_cast<std::chrono::milliseconds>(c.job.timeout * 10);
  for (auto& child : children) {
    ProcessResult r = child->wait(limit);
    if (r.exit_code != 0)
      throw Error(HM_ERR_INTERNAL, fmt::format("a benchmark process failed ({})", r.describe()));
  }

  std::vector<afd::AttentionTrace> traces;
  double throughput_gbps = 0;
  uint64_t registered = 0;
  const uint64_t a2f = uint64_t(c.model.tokens) * c.model.hidden * dtype_bytes(c.model.a2f_dtype);
  const uint64_t routing = uint64_t(c.model.tokens) * c.model.top_k * 8;
  const uint64_t f2a = uint64_t(c.model.tokens) * c.model.hidden * dtype_bytes(c.model.f2a_dtype);
  const uint64_t per_round_trip = uint64_t(c.job.ffn) * (a2f + routing + f2a);
  for (int a = 0; a < c.job.attention; ++a) {
    std::ifstream in(dir / fmt::format("attention{}.trace.json", a));
    traces.push_back(afd::trace_from_json({std::istreambuf_iterator<char>(in), {}}));
    auto info = nlohmann::json::parse(std::ifstream(dir / fmt::format("attention{}.info.json", a)));
    registered += info["registered"].get<uint64_t>();
    double span = info["span_ns"].get<double>();
    throughput_gbps += 8.0 * static_cast<double>(per_round_trip) *
                       static_cast<double>(traces.back().trips.size()) / span;
  }
  for (int f = 0; f < c.job.ffn; ++f)
    registered +=
        nlohmann::json::parse(std::ifstream(dir / fmt::format("ffn{}.info.json", f)))["registered"]
            .get<uint64_t>();
  fs::remove_all(dir);

  afd::Metrics m = afd::compute_metrics(traces, true, c.tracing.straggler_factor);
  double baseline_us = c.job.ffn * (memcpy_p50_us(a2f + routing, 200) + memcpy_p50_us(f2a, 200));
  const afd::Percentiles& rt = m.values["round trip"];
  fmt::print(
      "hetmesh bench afd: {}A{}F, {} tokens x hidden {}, A2F {} ({} KiB per A per F), "
      "F2A {} ({} KiB per A per F), {} micro-batches, transport {}, A on {}, F on {}\n",
      c.job.attention, c.job.ffn, c.model.tokens, c.model.hidden, to_string(c.model.a2f_dtype),
      (a2f + routing) / 1024, to_string(c.model.f2a_dtype), f2a / 1024, c.job.micro_batches,
      to_string(afd::single_host_transport(c)), c.devices.attention[0], c.devices.ffn[0]);
  fmt::print("{:<24} {:>10} {:>10}\n", "(us)", "p50", "p99");
  for (auto [label, name] : {std::pair{"A2F", "A2F network*"}, std::pair{"F2A", "F2A network*"},
                             std::pair{"round trip", "round trip"},
                             std::pair{"net cost (skew-free)", "net cost (skew-free)"}})
    fmt::print("{:<24} {:>10.1f} {:>10.1f}\n", label, m.values[name].p50, m.values[name].p99);
  fmt::print(
      "{:<24} {:>10.1f}   ({} bytes per A per round trip: memcpy p50 of the same "
      "buffers, same run)\n",
      "memcpy baseline", baseline_us, per_round_trip);
  fmt::print("{:<24} {:>10.2f}x\n", "round trip / memcpy", rt.p50 / baseline_us);
  fmt::print("{:<24} {:>10.2f} Gb/s (all A, both directions)\n", "throughput", throughput_gbps);
  fmt::print("{:<24} {:>10.1f} MiB (all instances)\n\n{}", "memory registered",
             static_cast<double>(registered) / (1 << 20), afd::format_metrics(m));
  if (!o.json.empty()) {
    nlohmann::json out = {{"attention", c.job.attention},
                          {"ffn", c.job.ffn},
                          {"tokens", c.model.tokens},
                          {"hidden", c.model.hidden},
                          {"bytes_per_round_trip_per_attention", per_round_trip},
                          {"memcpy_baseline_us", baseline_us},
                          {"round_trip_over_memcpy", rt.p50 / baseline_us},
                          {"throughput_gbps", throughput_gbps},
                          {"registered_bytes", registered},
                          {"metrics", nlohmann::json::object()}};
    for (const auto& [name, p] : m.values)
      out["metrics"][name] = {{"p50_us", p.p50},
                              {"p99_us", p.p99},
                              {"mean_us", p.mean},
                              {"max_us", p.max},
                              {"count", p.count}};
    std::ofstream(o.json) << out.dump(2) << "\n";
    fmt::print("json: {}\n", o.json);
  }
  return 0;
}

}  // namespace

void add_bench_afd_command(CLI::App& bench) {
  auto o = std::make_shared<AfdBenchOptions>();
  CLI::App* cmd = bench.add_subcommand("afd", "AFD round trips, StepMesh's shape by default");
  cmd->add_option("--config", o->config, "job config (TOML); default: StepMesh's 2A2F shape");
  cmd->add_option("--iterations", o->iterations, "measured round trips per micro-batch")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000000));
  cmd->add_option("--warmup", o->warmup, "unmeasured round trips first")->capture_default_str();
  cmd->add_option("--json", o->json, "also write the results here");
  cmd->add_option("--role", o->role, "internal")->group("");
  cmd->add_option("--rank", o->rank, "internal")->group("");
  cmd->add_option("--store", o->store, "internal")->group("");
  cmd->add_option("--out", o->out, "internal")->group("");
  cmd->callback([o] {
    JobConfig c = o->config.empty() ? stepmesh_shape() : load_config(o->config);
    int rc = o->role == "attention" ? run_attention(c, *o)
             : o->role == "ffn"     ? run_ffn(c, *o)
                                    : run_bench(c, *o);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace hetmesh::cli
