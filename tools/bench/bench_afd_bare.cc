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
#include "commands.hpp"

#include <hetmesh/afd/engine.hpp>
#include <hetmesh/afd/job.hpp>
#include <hetmesh/afd/job_config.hpp>
#include <hetmesh/afd/launch.hpp>
#include <hetmesh/afd/metrics.hpp>
#include <hetmesh/core/rendezvous.hpp>
#include <hetmesh/core/subprocess.hpp>
#include <hetmesh/transport/transport.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <sched.h>

#include <algorithm>
#include <barrier>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <thread>

namespace hetmesh::cli {
namespace {

namespace fs = std::filesystem;
using afd::Dtype;
using afd::JobConfig;
using afd::now_ns;

struct AfdBenchOptions {
  std::string config;
  int iterations = 200;
  int warmup = 20;
  std::string json;
  std::string trace;                   // Chrome trace of the engine's round trips
  std::string pin = "auto";            // auto, on, off: a block of CPUs per instance
  bool bare = true;                    // also run the bare-transport baseline
  std::vector<std::string> instances;  // the instances started here; none = all
  std::string role;                    // internal: attention, ffn, bare-attention, bare-ffn
  int rank = 0;
  std::string store, out;
  int cpu_block = 0;  // internal: this instance's CPUs are [block * size, +size); size 0: unpinned
  int cpu_block_size = 0;
};

// CPUs per instance when the instances are pinned, or 0: with --pin auto, only where every
// instance gets at least 4 (its comm thread, a sender per peer and the caller), and a job's
// [affinity] section does not say otherwise.
int cpu_block_size(const JobConfig& c, const std::string& pin) {
  int instances = c.job.attention + c.job.ffn;
  int cpus = static_cast<int>(std::thread::hardware_concurrency());
  int size = instances > 0 ? cpus / instances : 0;
  if (pin == "off" || size < 1) return 0;
  if (pin == "auto" && (size < 4 || !c.affinity.comm_cpus.empty())) return 0;
  return size;
}

// Pins this process (every thread it starts from now on) to its block of CPUs, and gives the
// engine's comm thread and senders one CPU each of that block.
afd::EngineSpec pinned(afd::EngineSpec spec, const AfdBenchOptions& o) {
  if (o.cpu_block_size <= 0) return spec;
  cpu_set_t set;
  CPU_ZERO(&set);
  spec.comm_cpus.clear();
  for (int i = 0; i < o.cpu_block_size; ++i) {
    CPU_SET(o.cpu_block * o.cpu_block_size + i, &set);
    spec.comm_cpus.push_back(o.cpu_block * o.cpu_block_size + i);
  }
  if (sched_setaffinity(0, sizeof set, &set) != 0)
    throw Error(HM_ERR_INTERNAL, fmt::format("cannot pin to CPUs {}-{}: {}", spec.comm_cpus.front(),
                                             spec.comm_cpus.back(), std::strerror(errno)));
  return spec;
}

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
  afd::AttentionEngine engine(pinned(afd::engine_spec(c, afd::Role::attention, o.rank), o), device,
                              *store);
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
  afd::FfnEngine engine(pinned(afd::engine_spec(c, afd::Role::ffn, o.rank), o), device, *store);
  std::ofstream(fs::path(o.out) / fmt::format("ffn{}.info.json", o.rank))
      << nlohmann::json{{"registered", total(engine.registered())}}.dump();
  while (auto batch = engine.get_batch(c.job.timeout))
    engine.respond(*batch, nullptr, now_ns());
  return 0;
}

// ---- the bare-transport baseline: the same writes, no engine ----

// One instance of the bare job: its transport, its two buffers (A: send [mb], receive [mb][f];
// F: receive [a][mb], send [a][mb], in the engine's slot sizes) and a connection to every peer.
struct BareInstance {
  afd::EngineSpec spec;
  Device device;
  std::unique_ptr<Transport> transport;
  Buffer send, receive;
  std::shared_ptr<Region> send_region, receive_region;
  std::vector<std::shared_ptr<Connection>> peers;
  std::vector<std::shared_ptr<RemoteRegion>> remote;  // each peer's receive buffer
  std::map<ConnectionId, int> rank_of;
  std::set<int> finished;  // peers that said they are done: their leaving is no loss
  std::vector<TransportEvent> events;

  BareInstance(const JobConfig& c, afd::Role role, int rank, const AfdBenchOptions& o)
      : spec(pinned(afd::engine_spec(c, role, rank), o)),
        device(device_for(c, role == afd::Role::attention
                                 ? c.devices.attention.at(static_cast<size_t>(rank))
                                 : c.devices.ffn.at(static_cast<size_t>(rank)))) {
    const uint64_t A = static_cast<uint64_t>(spec.attention), F = static_cast<uint64_t>(spec.ffn),
                   M = static_cast<uint64_t>(spec.micro_batches);
    bool attention = role == afd::Role::attention;
    send = device.allocate(attention ? M * spec.a2f_slot_bytes() : A * M * spec.f2a_slot_bytes());
    receive =
        device.allocate(attention ? M * F * spec.f2a_slot_bytes() : A * M * spec.a2f_slot_bytes());
    transport = Transport::create(spec.transport);
    send_region = transport->register_memory(device, send.data(), send.size());
    receive_region = transport->register_memory(device, receive.data(), receive.size());
    auto store = connect_tcp_store(o.store, c.job.timeout);
    Rendezvous rendezvous(*store, "bare", attention ? "attention" : "ffn", rank);
    rendezvous.publish("endpoint", transport->endpoint());
    rendezvous.publish("receive", receive_region->describe());
    const char* peer_role = attention ? "ffn" : "attention";
    int peer_count = attention ? spec.ffn : spec.attention;
    for (int r = 0; r < peer_count; ++r) {  // in rank order, as the engine connects
      peers.push_back(transport->connect(rendezvous.fetch(peer_role, r, "endpoint", c.job.timeout),
                                         c.job.timeout));
      remote.push_back(
          peers.back()->import_region(rendezvous.fetch(peer_role, r, "receive", c.job.timeout)));
      rank_of[peers.back()->id()] = r;
    }
  }

  // Polls once; calls on_notification(peer rank, value) for each notification, on_control(peer
  // rank) for each control message; throws on a lost peer or a failed write.
  template <typename Notified, typename Control>
  void poll(Notified on_notification, Control on_control) {
    events.clear();
    transport->poll(events, std::chrono::milliseconds(2));
    for (const auto& e : events) {
      switch (e.type) {
        case TransportEvent::Type::notification:
          on_notification(rank_of.at(e.connection), e.value);
          break;
        case TransportEvent::Type::control:
          on_control(rank_of.at(e.connection));
          break;
        case TransportEvent::Type::write_done:
          if (e.status != HM_OK)
            throw Error(e.status, "bare baseline: a write failed: " + e.message);
          break;
        case TransportEvent::Type::peer_lost:
          if (!finished.contains(rank_of.at(e.connection)))
            throw Error(kStatusPeerLost, "bare baseline: a peer was lost: " + e.message);
          break;
      }
    }
  }
};

// A: each micro-batch's tokens and routing to every F in one notified write, as soon as its
// previous round trip is back; the round trip runs from the first write to the last F's
// notification.
int run_bare_attention(const JobConfig& c, const AfdBenchOptions& o) {
  BareInstance me(c, afd::Role::attention, o.rank, o);
  const int M = me.spec.micro_batches, F = me.spec.ffn;
  const uint64_t a2f = me.spec.a2f_slot_bytes();
  std::vector<int> arrived(static_cast<size_t>(M), 0);
  std::vector<int64_t> posted(static_cast<size_t>(M)), completed(static_cast<size_t>(M));
  std::vector<double> round_trips;
  auto deadline = [&] { return now_ns() + std::chrono::nanoseconds(c.job.timeout).count(); };
  auto await = [&](int mb) {
    for (int64_t until = deadline(); arrived[static_cast<size_t>(mb)] < F;) {
      me.poll(
          [&](int, uint32_t value) {
            auto slot = static_cast<size_t>(value) / static_cast<size_t>(F);
            if (slot >= arrived.size()) throw Error(kStatusProtocolError, "bare: bad slot");
            if (++arrived[slot] == F) completed[slot] = now_ns();
          },
          [](int) {});
      if (now_ns() > until) throw Error(HM_ERR_TIMEOUT, "bare baseline: an F stopped answering");
    }
  };
  for (int it = 0; it < o.warmup + o.iterations; ++it) {
    for (int mb = 0; mb < M; ++mb) {
      auto m = static_cast<size_t>(mb);
      if (it > 0) {
        await(mb);
        if (it > o.warmup)
          round_trips.push_back(static_cast<double>(completed[m] - posted[m]) / 1e3);
        arrived[m] = 0;
      }
      posted[m] = now_ns();
      for (int f = 0; f < F; ++f) {
        auto slot = static_cast<uint64_t>(o.rank * M + mb);  // F's slot for (this A, mb)
        me.peers[static_cast<size_t>(f)]->write(*me.send_region, m * a2f,
                                                *me.remote[static_cast<size_t>(f)], slot * a2f, a2f,
                                                static_cast<uint32_t>(slot), 0);
      }
    }
  }
  for (int mb = 0; mb < M; ++mb) {
    await(mb);
    round_trips.push_back(
        static_cast<double>(completed[static_cast<size_t>(mb)] - posted[static_cast<size_t>(mb)]) /
        1e3);
  }
  static const char kDone[] = "done";
  for (auto& peer : me.peers)
    peer->send_control({reinterpret_cast<const uint8_t*>(kDone), sizeof kDone - 1});
  std::ofstream(fs::path(o.out) / fmt::format("bare-attention{}.json", o.rank))
      << nlohmann::json(round_trips).dump();
  return 0;
}

// F: answers each A's micro-batch as soon as its notification arrives, with one notified write of
// its outputs into A's slot; leaves when every A is done.
int run_bare_ffn(const JobConfig& c, const AfdBenchOptions& o) {
  BareInstance me(c, afd::Role::ffn, o.rank, o);
  const int M = me.spec.micro_batches, F = me.spec.ffn, A = me.spec.attention;
  const uint64_t f2a = me.spec.f2a_slot_bytes();
  int done = 0;
  int64_t quiet_since = now_ns();
  while (done < A) {
    bool any = false;
    me.poll(
        [&](int a, uint32_t value) {
          any = true;
          int mb = static_cast<int>(value) % M;
          if (static_cast<int>(value) / M != a) throw Error(kStatusProtocolError, "bare: bad slot");
          auto from = static_cast<uint64_t>(a * M + mb);     // this F's send slot for (a, mb)
          auto to = static_cast<uint64_t>(mb * F + o.rank);  // A's receive slot for (mb, this F)
          me.peers[static_cast<size_t>(a)]->write(*me.send_region, from * f2a,
                                                  *me.remote[static_cast<size_t>(a)], to * f2a, f2a,
                                                  static_cast<uint32_t>(to), 0);
        },
        [&](int a) {
          if (me.finished.insert(a).second) ++done;
        });
    if (any) quiet_since = now_ns();
    if (now_ns() - quiet_since > std::chrono::nanoseconds(c.job.timeout).count())
      throw Error(HM_ERR_TIMEOUT, "bare baseline: the attention instances stopped sending");
  }
  return 0;
}

// ---- the memcpy baselines ----

// The same bytes as one A's round trip with the engine's parallelism and footprint: a thread per
// (A, F) pair copies A's tokens and routing for micro-batch mb into F's slot for (A, mb), then F's
// outputs for (A, mb) into A's slot for (mb, F); every pair at once; buffers laid out as the
// engine's slots, cycling over the micro-batches. One round trip per A at a time. Returns the p50
// over As and iterations of the time until an A's last pair is done.
double memcpy_parallel_p50_us(const afd::EngineSpec& spec, int samples) {
  const int A = spec.attention, F = spec.ffn, M = spec.micro_batches;
  const uint64_t a2f = spec.a2f_slot_bytes(), f2a = spec.f2a_slot_bytes();
  auto buffers = [](int count, uint64_t bytes, uint8_t fill) {
    std::vector<std::vector<uint8_t>> v;
    for (int i = 0; i < count; ++i)
      v.emplace_back(bytes, static_cast<uint8_t>(fill + i));
    return v;
  };
  auto a_send = buffers(A, M * a2f, 1), a_receive = buffers(A, uint64_t(M) * F * f2a, 2);
  auto f_receive = buffers(F, uint64_t(A) * M * a2f, 3),
       f_send = buffers(F, uint64_t(A) * M * f2a, 4);
  const int warmup = 5, total = warmup + samples;
  std::vector<int64_t> end(static_cast<size_t>(A * F));
  std::vector<double> us;
  int64_t start = 0;
  int phase = 0;
  auto on_phase = [&]() noexcept {
    if (phase % 2 == 0) {
      start = now_ns();
    } else if (phase / 2 >= warmup) {
      for (int a = 0; a < A; ++a) {
        int64_t last = 0;
        for (int f = 0; f < F; ++f)
          last = std::max(last, end[static_cast<size_t>(a * F + f)]);
        us.push_back(static_cast<double>(last - start) / 1e3);
      }
    }
    ++phase;
  };
  std::barrier sync(A * F, on_phase);
  std::vector<std::thread> threads;
  for (int a = 0; a < A; ++a)
    for (int f = 0; f < F; ++f)
      threads.emplace_back([&, a, f] {
        auto ua = static_cast<size_t>(a), uf = static_cast<size_t>(f);
        for (int it = 0; it < total; ++it) {
          const uint64_t mb = static_cast<uint64_t>(it % M);
          sync.arrive_and_wait();
          std::memcpy(f_receive[uf].data() + (ua * M + mb) * a2f, a_send[ua].data() + mb * a2f,
                      a2f);
          std::memcpy(a_receive[ua].data() + (mb * F + uf) * f2a,
                      f_send[uf].data() + (ua * M + mb) * f2a, f2a);
          end[ua * F + uf] = now_ns();
          sync.arrive_and_wait();
        }
      });
  for (auto& t : threads)
    t.join();
  return afd::percentiles(us).p50;
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
  std::ofstream(config_file) << afd::to_toml(c);
  const afd::LocalInstances local = afd::parse_instances(o.instances, c);
  afd::JobStore store(c, o.store);
  const int block_size = cpu_block_size(c, o.pin);
  if (!local.everything(c)) {
    fmt::print(
        "here: attention {}, ffn {}; rendezvous store {} ({})\n",
        local.attention.empty() ? "none" : fmt::format("{}", fmt::join(local.attention, ",")),
        local.ffn.empty() ? "none" : fmt::format("{}", fmt::join(local.ffn, ",")), store.address(),
        store.hosted() ? "hosted here" : "joined");
    std::fflush(stdout);  // an invocation on another host needs the store's address now
  }
  // Runs every instance of one job (the engine's, or the bare transport's) to completion.
  auto run_job = [&](const std::string& prefix) {
    afd::LocalJob job({"bench", "afd", "--config", config_file.string()}, store.address(),
                      dir.string());
    int block = 0;  // instances on this host, in order: attention first, as in CPU numbering
    auto start = [&](const std::string& role, int rank) {
      job.start(
          prefix + role, rank,
          {"--iterations", std::to_string(o.iterations), "--warmup", std::to_string(o.warmup),
           "--cpu-block", std::to_string(block++), "--cpu-block-size", std::to_string(block_size)});
    };
    for (int a : local.attention)
      start("attention", a);
    for (int f : local.ffn)
      start("ffn", f);
    std::vector<afd::InstanceFailure> failures =
        job.wait(std::chrono::duration_cast<std::chrono::milliseconds>(c.job.timeout * 10));
    std::vector<std::string> failed;
    for (const afd::InstanceFailure& failure : failures)
      failed.push_back(failure.describe());
    if (!failed.empty())
      throw Error(HM_ERR_INTERNAL, fmt::format("bench afd: {}", fmt::join(failed, "; ")));
  };
  run_job("");
  if (o.bare) run_job("bare-");
  if (local.attention.empty()) {
    fmt::print("ffn instance(s) {} done; the host of the attention instances reports\n",
               fmt::join(local.ffn, ","));
    fs::remove_all(dir);
    return 0;
  }

  std::vector<afd::AttentionTrace> traces;
  double throughput_gbps = 0;
  uint64_t registered = 0;
  const afd::EngineSpec spec = afd::engine_spec(c, afd::Role::attention, 0);
  const uint64_t a2f = spec.a2f_slot_bytes();  // tokens and routing
  const uint64_t f2a = spec.f2a_slot_bytes();
  const uint64_t per_round_trip = uint64_t(c.job.ffn) * (a2f + f2a);
  std::vector<double> bare;
  for (int a : local.attention) {
    std::ifstream in(dir / fmt::format("attention{}.trace.json", a));
    traces.push_back(afd::trace_from_json({std::istreambuf_iterator<char>(in), {}}));
    auto info = nlohmann::json::parse(std::ifstream(dir / fmt::format("attention{}.info.json", a)));
    registered += info["registered"].get<uint64_t>();
    double span = info["span_ns"].get<double>();
    throughput_gbps += 8.0 * static_cast<double>(per_round_trip) *
                       static_cast<double>(traces.back().trips.size()) / span;
    if (o.bare) {
      auto trips =
          nlohmann::json::parse(std::ifstream(dir / fmt::format("bare-attention{}.json", a)))
              .get<std::vector<double>>();
      bare.insert(bare.end(), trips.begin(), trips.end());
    }
  }
  for (int f : local.ffn)
    registered +=
        nlohmann::json::parse(std::ifstream(dir / fmt::format("ffn{}.info.json", f)))["registered"]
            .get<uint64_t>();
  fs::remove_all(dir);

  // One-way times subtract an A's clock from an F's: meaningful only when they share a host.
  afd::Metrics m = afd::compute_metrics(traces, local.everything(c), c.tracing.straggler_factor);
  if (!o.trace.empty()) afd::write_chrome_trace(o.trace, traces);
  const double memcpy_us = c.job.ffn * (memcpy_p50_us(a2f, 200) + memcpy_p50_us(f2a, 200));
  const double parallel_us = memcpy_parallel_p50_us(spec, 200);
  const afd::Percentiles bare_rt = afd::percentiles(bare);
  const afd::Percentiles& rt = m.values["round trip"];
  const unsigned cpus = std::thread::hardware_concurrency();
  const int instances = c.job.attention + c.job.ffn;

  fmt::print(
      "hetmesh bench afd: {}A{}F, {} tokens x hidden {}, A2F {} ({} KiB per A per F), "
      "F2A {} ({} KiB per A per F), {} micro-batches, transport {}, A on {}, F on {}\n",
      c.job.attention, c.job.ffn, c.model.tokens, c.model.hidden, to_string(c.model.a2f_dtype),
      a2f / 1024, to_string(c.model.f2a_dtype), f2a / 1024, c.job.micro_batches,
      to_string(afd::single_host_transport(c)), c.devices.attention[0], c.devices.ffn[0]);
  fmt::print("instances: {}\n",
             block_size > 0
                 ? fmt::format("each pinned to {} CPUs of {} (attention 0 on CPUs 0-{}, ...)",
                               block_size, cpus, block_size - 1)
                 : fmt::format("not pinned ({} CPUs)", cpus));
  fmt::print("{:<30} {:>10} {:>10}\n", "(us)", "p50", "p99");
  for (auto [label, name] : {std::pair{"A2F", "A2F network*"}, std::pair{"F2A", "F2A network*"},
                             std::pair{"round trip", "round trip"},
                             std::pair{"net cost (skew-free)", "net cost (skew-free)"}})
    fmt::print("{:<30} {:>10.1f} {:>10.1f}\n", label, m.values[name].p50, m.values[name].p99);
  fmt::print("baselines, the same {} bytes per A per round trip, same run:\n", per_round_trip);
  fmt::print("{:<30} {:>10.1f} {:>10}   one thread, one buffer after another, cache-hot\n",
             "memcpy (serial, hot)", memcpy_us, "");
  fmt::print(
      "{:<30} {:>10.1f} {:>10}   a thread per (A, F) pair, all at once, buffers of the engine's "
      "slot layout, 1 micro-batch in flight\n",
      "memcpy (parallel, slots)", parallel_us, "");
  if (o.bare)
    fmt::print(
        "{:<30} {:>10.1f} {:>10.1f}   same processes and writes + notifications, {} "
        "micro-batches in flight, no engine\n",
        "bare transport round trip", bare_rt.p50, bare_rt.p99, c.job.micro_batches);
  fmt::print("{:<30} {:>10.2f}x  (the issue's target: 1.5x)\n", "round trip / memcpy (serial)",
             rt.p50 / memcpy_us);
  fmt::print("{:<30} {:>10.2f}x\n", "round trip / memcpy (parallel)", rt.p50 / parallel_us);
  if (o.bare)
    fmt::print("{:<30} {:>10.2f}x\n", "round trip / bare transport", rt.p50 / bare_rt.p50);
  if (cpus > 0 && cpus < static_cast<unsigned>(2 * instances))
    fmt::print(
        "note: {} CPUs for {} instances (each with a comm thread and a sender per peer): the "
        "copies compete for cores and memory bandwidth, and {} micro-batches in flight per A "
        "queue behind each other, so compare with the parallel memcpy and the bare transport\n",
        cpus, instances, c.job.micro_batches);
  fmt::print("{:<30} {:>10.2f} Gb/s (all A, both directions)\n", "throughput", throughput_gbps);
  fmt::print("{:<30} {:>10.1f} MiB ({})\n\n{}", "memory registered",
             static_cast<double>(registered) / (1 << 20),
             local.everything(c) ? "all instances" : "the instances on this host",
             afd::format_metrics(m));
  if (!o.json.empty()) {
    nlohmann::json out = {
        {"attention", c.job.attention},
        {"ffn", c.job.ffn},
        {"micro_batches", c.job.micro_batches},
        {"tokens", c.model.tokens},
        {"hidden", c.model.hidden},
        {"transport", to_string(afd::single_host_transport(c))},
        {"cpus", cpus},
        {"cpus_per_instance_pinned", block_size},
        {"bytes_per_round_trip_per_attention", per_round_trip},
        {"memcpy_baseline_us", memcpy_us},
        {"memcpy_parallel_baseline_us", parallel_us},
        {"bare_transport_round_trip_us",
         o.bare ? nlohmann::json{{"p50", bare_rt.p50}, {"p99", bare_rt.p99}} : nlohmann::json()},
        {"round_trip_over_memcpy", rt.p50 / memcpy_us},
        {"round_trip_over_memcpy_parallel", rt.p50 / parallel_us},
        {"round_trip_over_bare_transport",
         o.bare ? nlohmann::json(rt.p50 / bare_rt.p50) : nlohmann::json()},
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
  if (!o.trace.empty()) fmt::print("trace: {}\n", o.trace);
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
  cmd->add_option("--trace", o->trace,
                  "write the engine's round trips here as a Chrome trace (Perfetto)");
  cmd->add_option("--pin", o->pin,
                  "pin each instance (engine and bare transport) to a block of CPUs: auto (when "
                  "each gets 4 or more), on, off")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "on", "off"}));
  cmd->add_flag("!--no-bare", o->bare,
                "skip the bare-transport baseline (it runs the job a second time)");
  cmd->add_option("--instances", o->instances,
                  "start only these instances here: attention, ffn, attention:0,1, ffn:2-3 "
                  "(default: all); for jobs on several hosts, see docs/launching.md");
  cmd->add_option("--store", o->store,
                  "join the rendezvous store at HOST:PORT instead of hosting it");
  cmd->add_option("--role", o->role, "internal")->group("");
  cmd->add_option("--cpu-block", o->cpu_block, "internal")->group("");
  cmd->add_option("--cpu-block-size", o->cpu_block_size, "internal")->group("");
  cmd->add_option("--rank", o->rank, "internal")->group("");
  cmd->add_option("--out", o->out, "internal")->group("");
  cmd->callback([o] {
    JobConfig c = o->config.empty() ? stepmesh_shape() : afd::load_config(o->config);
    int rc = o->role == "attention"        ? run_attention(c, *o)
             : o->role == "ffn"            ? run_ffn(c, *o)
             : o->role == "bare-attention" ? run_bare_attention(c, *o)
             : o->role == "bare-ffn"       ? run_bare_ffn(c, *o)
                                           : run_bench(c, *o);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace hetmesh::cli
