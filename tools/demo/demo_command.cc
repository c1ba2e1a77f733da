// `hetmesh demo`: the main job. Runs a tiny MoE transformer with attention (A) and FFN (F)
// instances as separate processes connected by the AFD engine, checks the final hidden states
// against a single-process reference, and prints the latency breakdown and the trace file.
//
//   hetmesh demo                      1A1F on cpu:0 over ipc, 3 micro-batches
//   hetmesh demo --config FILE.toml   any M x N job from examples/configs/
//   hetmesh demo --config FILE.toml --instances ffn --store HOST:PORT
//                                     this host's share of a job on several hosts
//                                     (docs/launching.md)
//   hetmesh demo --replace ffn:1      kills ffn 1 halfway and starts a replacement, which
//                                     rejoins the running job (docs/failures.md)
#include "demo_command.hpp"

#include "job_options.hpp"

#include "attention_staging.hpp"
#include "expert_runner.hpp"
#include "model.hpp"

#include <hetmesh/demo_experts.h>
#include <hetmesh/afd/engine.hpp>
#include <hetmesh/afd/instance.hpp>
#include <hetmesh/afd/job.hpp>
#include <hetmesh/afd/job_config.hpp>
#include <hetmesh/afd/launched.hpp>
#include <hetmesh/afd/launcher.hpp>
#include <hetmesh/afd/metrics.hpp>
#include <hetmesh/core/job_secret.hpp>
#include <hetmesh/core/log.hpp>
#include <hetmesh/core/membership.hpp>
#include <hetmesh/core/rendezvous.hpp>
#include <hetmesh/core/subprocess.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <new>
#include <optional>
#include <thread>

namespace hetmesh::demo {
namespace {

namespace fs = std::filesystem;
using afd::JobConfig;

// Final results must match the reference exactly (both apply the same quantization in the same
// order); the tolerance only absorbs a compiler contracting a multiply-add differently. A vendor's
// kernel library is held to the same (hetmesh/demo_experts.h).
constexpr double kTolerance = HM_DEMO_TOLERANCE;

struct DemoOptions : afd::LaunchOptions {  // role: "attention" or "ffn" in an instance
  std::string config;
  std::string replace;  // "ROLE:RANK": killed halfway and replaced
};

// The instance --replace names, checked against the job: it must run here, and so must
// attention 0, whose progress times the kill.
std::pair<std::string, int> replaced_instance(const std::string& text, const JobConfig& c,
                                              const afd::LocalInstances& local) {
  afd::LocalInstances one;
  try {
    one = afd::parse_instances({text}, c);
  } catch (const Error& e) {  // its words, under this option's name
    std::string why = e.what();
    const std::string prefix = "--instances " + text + ": ";
    if (why.rfind(prefix, 0) == 0) why.erase(0, prefix.size());
    throw Error(e.status(), fmt::format("--replace {}: {}", text, why));
  }
  if (one.attention.size() + one.ffn.size() != 1)
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("--replace {}: name one instance, as attention:N or ffn:N", text));
  auto runs_here = [](const std::vector<int>& ranks, int rank) {
    return std::find(ranks.begin(), ranks.end(), rank) != ranks.end();
  };
  std::pair<std::string, int> who{"ffn", one.ffn.empty() ? 0 : one.ffn[0]};
  if (!one.attention.empty()) who = {"attention", one.attention[0]};
  if (!runs_here(who.first == "ffn" ? local.ffn : local.attention, who.second) ||
      !runs_here(local.attention, 0))
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("--replace {}: it and attention 0 (whose progress times the kill) must "
                            "both run on this host",
                            text));
  if (c.job.layers < 2)
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("--replace {}: the job has {} layer; halfway needs at least 2", text,
                            c.job.layers));
  return who;
}

ModelShape model_shape(const JobConfig& c) {
  ModelShape s;
  s.layers = c.job.layers;
  s.tokens = static_cast<uint32_t>(c.model.tokens);
  s.hidden = static_cast<uint32_t>(c.model.hidden);
  s.experts = c.model.experts;
  s.top_k = static_cast<uint32_t>(c.model.top_k);
  s.ffn_dim = 2 * s.hidden;
  s.a2f = c.model.a2f_dtype;
  s.f2a = c.model.f2a_dtype;
  return s;
}

// ---- the attention process ----

// With --replace, every A waits halfway, after pushing that layer, until the replacement of the
// instance the launcher kills there has joined (its epoch is 2), so that the kill falls mid-run
// however fast the job is. The replacement itself (of an A) does not wait.
void wait_for_replacement(KeyValueStore& store, const std::string& text, const JobConfig& c,
                          const std::string& self_role, int self_rank) {
  afd::LocalInstances one = afd::parse_instances({text}, c);
  const std::string role = one.attention.empty() ? "ffn" : "attention";
  const int rank = one.attention.empty() ? one.ffn.at(0) : one.attention.at(0);
  Membership membership(store, afd::EngineSpec{}.job, self_role, self_rank);
  const auto deadline = std::chrono::steady_clock::now() + c.job.join_timeout;
  while (membership.current_epoch(role, rank, c.job.join_timeout) < 2) {
    if (std::chrono::steady_clock::now() > deadline)
      throw Error(HM_ERR_TIMEOUT, fmt::format("--replace {}: no replacement joined within {} ms",
                                              text, c.job.join_timeout.count()));
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

int run_attention(const JobConfig& c, const DemoOptions& o) {
  auto instance = afd::open_instance(c, afd::Role::attention, o.rank, o.instance_options());
  const Device& device = instance->device();
  KeyValueStore& store = instance->store();
  TinyMoe model(model_shape(c));
  const ModelShape& shape = model.shape();
  const int M = c.job.micro_batches, F = c.job.ffn;
  afd::AttentionEngine& engine = instance->attention();
  // Attention runs on the host. On a device whose memory the host cannot touch (a GPU), its
  // outputs go up through pinned staging and a stream copy, push_pull starts when the copy's event
  // completes, and F's partials come back down the same way.
  AttentionStaging staging(device, engine, shape, M, F);

  const size_t n = size_t{shape.tokens} * shape.hidden;
  std::vector<std::vector<float>> x(static_cast<size_t>(M)), h;
  try {
    h.assign(static_cast<size_t>(M), std::vector<float>(n));
  } catch (const std::bad_alloc&) {
    throw Error(HM_ERR_OUT_OF_MEMORY,
                fmt::format("attention {}: the residuals of its {} micro-batches ({}): out of "
                            "memory",
                            o.rank, M, afd::format_bytes(double(M) * double(n) * sizeof(float))));
  }
  for (int mb = 0; mb < M; ++mb)
    x[static_cast<size_t>(mb)] = model.input(o.rank, mb);
  std::vector<afd::AttentionEngine::Handle> handles(static_cast<size_t>(M));
  std::vector<uint64_t> layer_of(static_cast<size_t>(M));
  afd::AttentionTrace trace{o.rank, {}};

  // An F lost mid-run costs the micro-batches it owed: each is pushed again, from the tokens and
  // routing still in its slot, once the F's replacement is in (docs/failures.md).
  int retried = 0;
  auto await_replacement = [&](const Error& e) {
    if (e.status() != kStatusPeerLost) throw e;
    ++retried;
    if (!engine.wait_for_peers(c.job.join_timeout))
      throw Error(HM_ERR_TIMEOUT, fmt::format("{}; no replacement joined within {} ms", e.what(),
                                              c.job.join_timeout.count()));
  };
  auto push = [&](int mb, afd::ReadySignal ready, int64_t start) {
    for (;;) {
      try {
        handles[static_cast<size_t>(mb)] =
            engine.push_pull(mb, shape.tokens, {ready, layer_of[static_cast<size_t>(mb)], start});
        return;
      } catch (const Error& e) {
        await_replacement(e);
      }
    }
  };
  auto finish = [&](int mb) {  // wait for mb's results and add them to its residual
    for (;;) {
      try {
        trace.trips.push_back(engine.wait(handles[static_cast<size_t>(mb)], c.job.timeout));
        break;
      } catch (const Error& e) {
        await_replacement(e);
        push(mb, staging.uploaded(), afd::now_ns());
      }
    }
    model.combine(h[static_cast<size_t>(mb)].data(), staging.results(mb, c.job.timeout),
                  x[static_cast<size_t>(mb)].data());
  };
  for (int layer = 0; layer < shape.layers; ++layer) {
    for (int mb = 0; mb < M; ++mb) {  // micro-batches pipelined: mb+1 computes while mb flies
      if (layer > 0) finish(mb);
      int64_t start = afd::now_ns();
      model.attention(layer, x[static_cast<size_t>(mb)].data(), h[static_cast<size_t>(mb)].data(),
                      staging.tokens(mb), staging.routing(mb));
      layer_of[static_cast<size_t>(mb)] = static_cast<uint64_t>(layer);  // the F's tag
      push(mb, staging.upload(mb), start);
    }
    const bool halfway = !o.replace.empty() && layer + 1 == shape.layers / 2 && engine.epoch() == 1;
    // Every A reaches halfway before attention 0's progress line sets off the kill: one still
    // joining would find the F it connects to dead.
    if (halfway)
      barrier(store, "demo-halfway", c.job.attention, c.job.join_timeout, afd::EngineSpec{}.job);
    if (o.rank == 0) std::printf("progress %d %d\n", layer + 1, shape.layers), std::fflush(stdout);
    if (halfway) wait_for_replacement(store, o.replace, c, "attention", o.rank);
  }
  for (int mb = 0; mb < M; ++mb)
    finish(mb);
  engine.finish();  // done: each F ends once every A has said so

  std::ofstream result(fs::path(o.out) / fmt::format("attention{}.bin", o.rank), std::ios::binary);
  for (const auto& v : x)
    result.write(reinterpret_cast<const char*>(v.data()),
                 static_cast<std::streamsize>(v.size() * sizeof(float)));
  std::ofstream(fs::path(o.out) / fmt::format("attention{}.trace.json", o.rank))
      << afd::trace_to_json(trace);
  std::ofstream(fs::path(o.out) / fmt::format("attention{}.retried", o.rank)) << retried;
  std::ofstream(fs::path(o.out) / fmt::format("attention{}.peers.json", o.rank))
      << afd::history_to_json({afd::Role::attention, o.rank, engine.peer_history()});
  std::ofstream(fs::path(o.out) / fmt::format("attention{}.registered", o.rank)) << [&] {
    uint64_t total = 0;
    for (auto& [name, bytes] : engine.registered())
      total += bytes;
    return total;
  }();
  return 0;
}

// ---- the FFN process ----

int run_ffn(const JobConfig& c, const DemoOptions& o) {
  auto instance = afd::open_instance(c, afd::Role::ffn, o.rank, o.instance_options());
  TinyMoe model(model_shape(c));
  auto runner = ExpertRunner::create(instance->device(), model, o.rank, c.job.ffn);
  std::ofstream(fs::path(o.out) / fmt::format("ffn{}.route", o.rank))
      << instance->device().selector() << ": experts run " << runner->route;
  afd::FfnEngine& engine = instance->ffn();
  Stream stream = instance->device().create_stream();
  while (auto batch = engine.get_batch(c.job.timeout)) {
    int64_t start = afd::now_ns();
    for (const auto& part : batch->parts)
      runner->run(static_cast<int>(part.tag), part, stream);  // the tag is the layer
    engine.respond(*batch, &stream, start);  // once the experts queued on `stream` are done
  }
  std::ofstream(fs::path(o.out) / fmt::format("ffn{}.peers.json", o.rank))
      << afd::history_to_json({afd::Role::ffn, o.rank, engine.peer_history()});
  return 0;
}

// ---- the parent: start everything, verify, report ----

std::vector<float> read_floats(const fs::path& path, size_t count) {
  std::vector<float> v;
  try {
    v.resize(count);
  } catch (const std::bad_alloc&) {
    throw Error(HM_ERR_OUT_OF_MEMORY,
                fmt::format("reading {} ({}): out of memory", path.string(),
                            afd::format_bytes(double(count) * sizeof(float))));
  }
  std::ifstream in(path, std::ios::binary);
  in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(count * sizeof(float)));
  if (!in)
    throw Error(HM_ERR_INVALID_ARGUMENT, fmt::format("{} is missing or short", path.string()));
  return v;
}

// Runs this host's instances (each in its place: CPUs, NIC), shows attention 0's progress if it
// runs here, kills and replaces `replace` (if any) once attention 0 is halfway, and waits for them
// all; says why the job failed, if it did, or that it was interrupted.
bool run_instances(afd::Launcher& launcher, const JobConfig& c,
                   const std::optional<std::pair<std::string, int>>& replace) {
  afd::Launcher::Run run;
  if (replace) run.args = {"--replace", fmt::format("{}:{}", replace->first, replace->second)};
  bool replaced = false;
  run.on_attention_line = [&](afd::LocalJob& job, int a, const std::string& line) {
    int done = 0, total = 0;
    if (a != 0 || std::sscanf(line.c_str(), "progress %d %d", &done, &total) != 2) return;
    if (total >= 8) fmt::print("  layer {}/{}\n", done, total);
    if (replace && !replaced && done == total / 2) {
      replaced = true;
      fmt::print("  killing {}:{} (SIGKILL) at layer {}/{} and starting its replacement\n",
                 replace->first, replace->second, done, total);
      job.replace(replace->first, replace->second);
    }
  };
  // A healthy job ends well within this; a failing one ends at its first failure, and an instance
  // that stays stopped (SIGSTOP) beyond the timeout is killed as failed.
  run.limit = c.job.join_timeout * 2 + std::chrono::duration_cast<std::chrono::milliseconds>(
                                           c.job.timeout * (c.job.layers + 1));
  run.stopped_limit = c.job.timeout + std::chrono::milliseconds(500);
  const afd::Launcher::Outcome outcome = launcher.run(run);
  if (int signal = outcome.interrupted; signal != 0) {
    fmt::print(stderr, "hetmesh demo: interrupted by {}: stopped the instances\n",
               signal == SIGINT ? "SIGINT" : "SIGTERM");
    return false;
  }
  for (const std::string& line : outcome.explanation)
    fmt::print(stderr, "hetmesh demo: {}\n", line);
  return outcome.failures.empty();
}

// Compares the final hidden states of this host's attention instances with the single-process
// reference, and says whether they match.
bool compare(const JobConfig& c, const afd::LocalInstances& local, const fs::path& dir) {
  TinyMoe model(model_shape(c));
  const size_t n = size_t{model.shape().tokens} * model.shape().hidden;
  double worst = 0;
  std::string where;
  for (int a : local.attention) {
    auto got = read_floats(dir / fmt::format("attention{}.bin", a), n * c.job.micro_batches);
    for (int mb = 0; mb < c.job.micro_batches; ++mb) {
      auto want = model.reference(a, mb, c.job.ffn);
      for (size_t i = 0; i < n; ++i) {
        double d = std::fabs(double(got[mb * n + i]) - want[i]);
        if (!(d <= worst)) {  // also catches NaN
          worst = std::isnan(d) ? INFINITY : d;
          where = fmt::format("attention {} micro-batch {} token {} element {}: got {} want {}", a,
                              mb, i / model.shape().hidden, i % model.shape().hidden,
                              got[mb * n + i], want[i]);
        }
      }
    }
  }
  if (!(worst <= kTolerance)) {
    fmt::print(stderr,
               "hetmesh demo: MISMATCH against the single-process reference: max |diff| "
               "{:.3g} > tolerance {:.1g} at {}\n",
               worst, kTolerance, where);
    return false;
  }
  fmt::print(
      "verified: final hidden states of {} attention x {} micro-batches match the "
      "single-process reference (max |diff| {:.3g}, tolerance {:.1g})\n",
      local.attention.size(), c.job.micro_batches, worst, kTolerance);
  return true;
}

// compare(), whose running out of memory says it was verifying (the job itself ran).
bool verify(const JobConfig& c, const afd::LocalInstances& local, const fs::path& dir) {
  try {
    return compare(c, local, dir);
  } catch (const Error& e) {
    if (e.status() != HM_ERR_OUT_OF_MEMORY) throw;
    throw Error(
        e.status(),
        fmt::format("verifying the result against the single-process reference: {}", e.what()));
  }
}

// The latency breakdown of this host's attention instances, and their Chrome trace.
void report(const JobConfig& c, const afd::LocalInstances& local, const fs::path& dir) {
  std::vector<afd::AttentionTrace> traces;
  for (int a : local.attention) {
    std::ifstream in(dir / fmt::format("attention{}.trace.json", a));
    traces.push_back(afd::trace_from_json({std::istreambuf_iterator<char>(in), {}}));
  }
  // What each instance saw of its peers: who was lost and who joined, if anyone.
  std::vector<afd::InstanceHistory> histories;
  auto read_history = [&](const std::string& name) {
    std::ifstream in(dir / name);
    if (in) histories.push_back(afd::history_from_json({std::istreambuf_iterator<char>(in), {}}));
  };
  for (int a : local.attention)
    read_history(fmt::format("attention{}.peers.json", a));
  for (int f : local.ffn)
    read_history(fmt::format("ffn{}.peers.json", f));
  // One-way times subtract an A's clock from an F's: meaningful only when they share a host.
  afd::Metrics metrics = afd::compute_metrics(traces, /*same_host_clock=*/local.everything(c),
                                              c.tracing.straggler_factor);
  int64_t origin = 0;
  for (const auto& trace : traces)
    for (const auto& trip : trace.trips)
      if (origin == 0 || (trip.attention_start != 0 && trip.attention_start < origin))
        origin = trip.attention_start;
  metrics.peer_changes = afd::describe_histories(histories, origin);
  auto row = [&](const char* label, const char* name) {
    const afd::Percentiles& p = metrics.values[name];
    fmt::print("  {:<12} p50 {:>9.1f} us   p99 {:>9.1f} us\n", label, p.p50, p.p99);
  };
  for (int f : local.ffn) {
    std::ifstream in(dir / fmt::format("ffn{}.route", f));
    std::string route((std::istreambuf_iterator<char>(in)), {});
    if (!route.empty()) fmt::print("ffn {} on {}\n", f, route);
  }
  fmt::print("\nlatency ({} round trips):\n", metrics.values["round trip"].count);
  row("A2F", "A2F network*");
  row("F2A", "F2A network*");
  row("round trip", "round trip");
  fmt::print("\n{}", afd::format_metrics(metrics));
  if (c.tracing.enabled && !c.tracing.chrome_trace.empty()) {
    afd::write_chrome_trace(c.tracing.chrome_trace, traces, histories);
    fmt::print("\ntrace: {} (open in https://ui.perfetto.dev or chrome://tracing)\n",
               fs::absolute(c.tracing.chrome_trace).string());
  }
}

// What the demo's launcher is told of its job: each instance holds the demo model's weights (an F
// also a copy of its experts') besides the engine's slots.
afd::LaunchRequest launch_request(const JobConfig& c, const DemoOptions& o) {
  const ModelShape shape = model_shape(c);
  afd::LaunchRequest request;
  request.command = {"demo"};
  request.config_name = o.config.empty() ? "the default job" : o.config;
  request.extra_bytes = [shape, ffn = c.job.ffn](afd::Role role, int rank) {
    return model_bytes(shape) + (role == afd::Role::ffn ? expert_copy_bytes(shape, rank, ffn) : 0);
  };
  request.memory_advice = fmt::format(
      "the demo model's weights alone are {} per instance; make [model] hidden, "
      "experts or [job] layers smaller, or start fewer instances here (--instances)",
      afd::format_bytes(model_bytes(shape)));
  return request;
}

// "cuda:0, rocm:0": the devices a role's instances use, each once, in order.
std::string distinct(const std::vector<std::string>& devices) {
  std::vector<std::string> seen;
  for (const auto& d : devices)
    if (std::find(seen.begin(), seen.end(), d) == seen.end()) seen.push_back(d);
  return fmt::format("{}", fmt::join(seen, ", "));
}

int run_job(const JobConfig& c, const DemoOptions& o) {
  afd::Launcher launcher(c, o, launch_request(c, o), "demo");
  const afd::LocalInstances& local = launcher.local();
  const fs::path& dir = launcher.folder();
  fmt::print(
      "hetmesh demo ({}): {} attention x {} ffn, {} layers, {} micro-batches of {} tokens, "
      "hidden {}, A on {}, F on {}, transport {}\n",
      HETMESH_VERSION, c.job.attention, c.job.ffn, c.job.layers, c.job.micro_batches,
      c.model.tokens, c.model.hidden, distinct(c.devices.attention), distinct(c.devices.ffn),
      to_string(afd::single_host_transport(c)));
  if (auto share = launcher.share(); !share.empty()) fmt::print("{}\n", share);
  if (auto advice = afd::shared_device_advice(c)) fmt::print("{}\n", *advice);
  std::fflush(stdout);  // an invocation on another host needs the store's address now

  std::optional<std::pair<std::string, int>> replace;
  if (!o.replace.empty()) replace = replaced_instance(o.replace, c, local);
  if (auto placed = launcher.places().describe(local); !placed.empty())
    fmt::print("placed: {}\n", placed);
  if (!run_instances(launcher, c, replace)) return launcher.exit_status(1);
  if (local.attention.empty())
    fmt::print("ffn instance(s) {} done; the host of the attention instances verifies the result\n",
               fmt::join(local.ffn, ","));
  else if (verify(c, local, dir))
    report(c, local, dir);
  else
    return 1;
  if (replace) {
    std::vector<std::string> retried;
    for (int a : local.attention) {
      int n = 0;
      std::ifstream(dir / fmt::format("attention{}.retried", a)) >> n;
      retried.push_back(fmt::format("attention {}: {}", a, n));
    }
    fmt::print(
        "\nrecovery: {}:{} was killed and replaced mid-run; the others went on. Micro-batches "
        "pushed again after a lost ffn: {}\n",
        replace->first, replace->second, fmt::join(retried, ", "));
  }
  return launcher.exit_status(0);
}

// The instance `o` names (o.role "attention" or "ffn", o.rank) of the demo's job, in this
// process: run_instance's exit status.
int run_demo_instance(const JobConfig& config, const DemoOptions& o) {
  const afd::InstanceIdentity self{o.store, afd::EngineSpec{}.job, o.role, o.rank,
                                   config.job.timeout};
  return afd::run_instance(
      self, [&] { return o.role == "attention" ? run_attention(config, o) : run_ffn(config, o); });
}

// The demo's job from `file` ("": the default job): its experts are chosen by the routing, and
// its tokens alone fill its pushes.
JobConfig demo_job(const std::string& file) {
  JobConfig config = file.empty() ? JobConfig{} : afd::load_config(file);
  if (config.model.top_k == 0 || !config.model.a2f_tensors.empty())
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("{}: the demo's MoE routes each token to top_k experts and sends "
                            "nothing else: [model] top_k must be at least 1 and "
                            "[model.a2f_tensors] empty (bench afd moves any shape)",
                            file));
  return config;
}

// ---- hetmesh run: one instance, placed by the launcher that started this process ----

struct RunOptions {
  std::string config;
  std::string store;
  bool device_per_local_rank = false;
};

// The store rank 0 hosts at `address` for the job's processes: with the job's secret (the
// config's [rendezvous] secret_file or HETMESH_JOB_SECRET_FILE), which every process must read;
// without one only on loopback (TcpStoreServer refuses beyond it, naming the address).
std::unique_ptr<TcpStoreServer> host_store(const JobConfig& c, const std::string& address) {
  std::optional<JobSecret> secret = c.rendezvous.secret_file.empty()
                                        ? JobSecret::from_environment()
                                        : JobSecret::read_file(c.rendezvous.secret_file);
  return std::make_unique<TcpStoreServer>(address, secret);
}

int run_launched(const RunOptions& o) {
  JobConfig config = demo_job(o.config);
  std::optional<afd::LaunchedProcess> launched = afd::launched_process();
  if (!launched)
    throw Error(HM_ERR_INVALID_ARGUMENT,
                "hetmesh run: no launcher's variables here (RANK, OMPI_COMM_WORLD_RANK, "
                "SLURM_PROCID, LWS_WORKER_INDEX or JOB_COMPLETION_INDEX): start it with "
                "torchrun, mpirun, srun or Kubernetes (docs/launching.md), or run the whole job "
                "with hetmesh demo");
  auto [role, rank] = afd::instance_of(*launched, config);
  DemoOptions d;
  d.role = afd::to_string(role);
  d.rank = rank;
  d.store = o.store.empty() ? launched->store : o.store;
  d.metrics_index = launched->local_rank;  // [metrics] listen: a port per process of its host
  if (d.store.empty())
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("hetmesh run: {} gives no store address: set MASTER_ADDR and "
                            "MASTER_PORT (rank 0 hosts the store there), or name one with --store",
                            launched->launcher));
  if (o.device_per_local_rank) {
    const auto& devices =
        role == afd::Role::attention ? config.devices.attention : config.devices.ffn;
    d.device = afd::device_at_local_rank(devices.at(static_cast<size_t>(rank)), *launched);
  }
  set_log_identity(fmt::format("{}:{}", d.role, rank));
  const bool etcd = d.store.starts_with("http://") || d.store.starts_with("https://");
  std::unique_ptr<TcpStoreServer> hosted;
  if (launched->rank == 0 && !etcd) hosted = host_store(config, d.store);
  const fs::path out = fs::temp_directory_path() / fmt::format("hetmesh-run-{}", ::getpid());
  fs::create_directories(out);
  d.out = out.string();
  int rc = run_demo_instance(config, d);
  // Every process says it is done, so rank 0's store stays until the last has used it; a job whose
  // failure was published ends the wait at once. An attention verifies its results after this,
  // which needs no store: the others do not wait out its verification (slow under a sanitizer).
  const int processes = config.job.attention + config.job.ffn;
  try {
    auto store = connect_store(d.store, config.job.join_timeout);
    barrier(*store, "hetmesh-run-end", processes, config.job.join_timeout, afd::EngineSpec{}.job);
    if (!hosted) {
      store->add("hetmesh-run-left", 1);  // this process is done with the store
    } else {
      const auto until = std::chrono::steady_clock::now() + config.job.join_timeout;
      while (store->add("hetmesh-run-left", 0) < processes - 1 &&
             std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  } catch (const Error& e) {
    if (rc == 0) {  // else the instance's own error was said
      std::error_code ignored;
      fs::remove_all(out, ignored);
      throw;
    }
  }
  if (rc == 0 && role == afd::Role::attention &&
      !verify(config, afd::LocalInstances{{rank}, {}}, out))
    rc = 1;
  fs::remove_all(out);
  return rc;
}

}  // namespace

void add_demo_command(CLI::App& app) {
  auto o = std::make_shared<DemoOptions>();
  CLI::App* demo = app.add_subcommand("demo",
                                      "Run the AFD demo: a tiny MoE transformer with "
                                      "attention and FFN in separate processes");
  demo->add_option("--config", o->config, "job config (TOML); default: 1A1F on cpu:0 over ipc");
  demo->add_option("--replace", o->replace,
                   "kill this instance (ffn:N or attention:N) halfway and start a replacement, "
                   "which rejoins the running job; the result is still verified");
  cli::add_job_launch_options(*demo, *o);
  demo->callback([o] {
    JobConfig config = demo_job(o->config);
    int rc;
    if (!o->role.empty()) set_log_identity(fmt::format("{}:{}", o->role, o->rank));  // a child
    if (o->role == "attention" || o->role == "ffn") {
      rc = run_demo_instance(config, *o);
    } else {
      rc = run_job(config, *o);
    }
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

void add_run_command(CLI::App& app) {
  auto o = std::make_shared<RunOptions>();
  CLI::App* run = app.add_subcommand(
      "run",
      "Run one instance of the demo's job in this process, where the launcher that started it "
      "(torchrun, mpirun, srun, Kubernetes) places it: ranks 0..A-1 attention, then ffn");
  run->add_option("--config", o->config, "job config (TOML); default: 1A1F on cpu:0 over ipc");
  run->add_option("--store", o->store,
                  "where the job's store is, HOST:PORT, hosted there by rank 0 (or etcd's URL); "
                  "default: MASTER_ADDR:MASTER_PORT (under torchrun, the port after it)");
  run->add_flag("--device-per-local-rank", o->device_per_local_rank,
                "each process takes the device of its config's plugin at its local rank "
                "(cuda:LOCAL_RANK)");
  run->callback([o] {
    int rc = run_launched(*o);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace hetmesh::demo
