// `hetmesh bench transport`, the command: its options, pairing the measuring end with its peer,
// and each size's measurements in turn (bench_transport.hpp lists the other files).
#include "bench_transport.hpp"
#include "commands.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdlib>

namespace hetmesh::cli::transport_bench {
namespace {

// A --sizes entry: bytes, or with a K or M suffix.
uint64_t parse_size(const std::string& text) {
  char* end = nullptr;
  double value = std::strtod(text.c_str(), &end);
  std::string unit = end;
  uint64_t scale = unit.empty() || unit == "B"    ? 1
                   : unit == "K" || unit == "KiB" ? 1024
                   : unit == "M" || unit == "MiB" ? 1 << 20
                                                  : 0;
  if (end == text.c_str() || scale == 0 || value <= 0)
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("size '{}' is not a number with an optional K or M suffix", text));
  return static_cast<uint64_t>(value * static_cast<double>(scale));
}

// Pairs the measuring end with its peer, measures each size in turn, and reports.
void run_bench(const BenchOptions& o) {
  std::vector<uint64_t> sizes;
  for (const auto& s : o.sizes)
    sizes.push_back(parse_size(s));
  uint64_t max_size = *std::max_element(sizes.begin(), sizes.end());
  if (max_size >= kLatencyTag) throw Error(HM_ERR_INVALID_ARGUMENT, "sizes must be below 1 GiB");
  const bool same_host = o.connect.empty();
  std::string peer_memory = o.peer_memory.empty() ? o.memory : o.peer_memory;
  if (!same_host) peer_memory = "the other host's";
  Pair p = same_host ? pair_with_child(o, max_size, peer_memory) : pair_across_hosts(o, max_size);

  // Same-node transports are also compared with UCX over shared memory, when it is installed;
  // the tools' baselines need both ends on this host.
  std::string ucx_perftest =
      same_host && o.transport == "ipc" ? find_on_path("ucx_perftest") : std::string();
  const bool perftest = same_host && o.transport == "verbs";
  const bool pingpong =
      same_host && o.transport == "fabric" && !find_on_path("fi_pingpong").empty();
  // fi_pingpong on the provider the transport opened ("auto" resolved: libfabric's first may be
  // one that hetmesh's "auto" passes over).
  const std::string provider =
      pingpong ? nlohmann::json::parse(p.end->transport->endpoint()).value("provider", o.provider)
               : o.provider;
  std::vector<Row> rows;
  std::vector<TransportEvent> events;
  for (uint64_t size : sizes) {
    Row row{size, 0, 0, 0, 0, 0};
    measure_latency(row, *p.end, *p.connection, *p.target, o.iterations, events);
    measure_bandwidth(row, *p.end, *p.connection, *p.target, o, events);
    measure_memcpy(row, o.iterations);
    measure_one_dma(row, p.end->device, p.end->memory, o.iterations);
    if (!ucx_perftest.empty()) measure_ucx(row, ucx_perftest, std::max(row.count, 200));
    // perftest right after our stream of the same size, so that load on a shared host drifts as
    // little as possible between the two; our completion pollers sleep meanwhile.
    if (perftest && !o.busy_poll)
      measure_perftest(row, std::max(row.count, 200), o.window, o.rdma_device);
    if (pingpong) measure_fi_pingpong(row, provider, o.iterations);
    rows.push_back(row);
  }
  send_text(*p.connection, "exit");
  if (p.child) p.child->wait(std::chrono::seconds(10));
  // Spinning pollers would take the CPUs perftest needs: with --busy-poll, perftest runs once our
  // transport and its threads are gone.
  if (perftest && o.busy_poll) {
    p.target.reset();
    p.connection.reset();
    p.end.reset();
    for (Row& row : rows)
      measure_perftest(row, std::max(row.count, 200), o.window, o.rdma_device);
  }
  report(o, peer_memory, rows);
}

}  // namespace

std::string human(uint64_t bytes) {
  if (bytes >= (1 << 20) && bytes % (1 << 20) == 0) return fmt::format("{}M", bytes >> 20);
  if (bytes >= 1024 && bytes % 1024 == 0) return fmt::format("{}K", bytes >> 10);
  return fmt::format("{}", bytes);
}

}  // namespace hetmesh::cli::transport_bench

namespace hetmesh::cli {

void add_bench_transport_command(CLI::App& bench) {
  using namespace transport_bench;
  auto o = std::make_shared<BenchOptions>();
  CLI::App* cmd = bench.add_subcommand("transport", "Latency and bandwidth of one transport");
  cmd->add_option("--transport", o->transport, "ipc, tcp, verbs or fabric")->capture_default_str();
  cmd->add_option("--provider", o->provider,
                  "fabric: the libfabric provider (tcp, shm, verbs;ofi_rxm, efa, auto)")
      ->capture_default_str();
  cmd->add_option("--rails", o->rails,
                  "tcp, verbs, fabric: stripe over these NICs (local addresses, RDMA devices, or "
                  "for fabric either: an address or a provider's domain), e.g. rxe0,rxe1")
      ->delimiter(',');
  cmd->add_option(
         "--memory", o->memory,
         "device whose memory is used (cpu, asic_stub:1, cuda:0; a plugin name means its device 0)")
      ->capture_default_str();
  cmd->add_option("--peer-memory", o->peer_memory, "the peer's device (default: --memory)");
  cmd->add_option("--sizes", o->sizes, "message sizes (e.g. 8 4K 1M)")->capture_default_str();
  cmd->add_option("--iterations", o->iterations, "latency samples per size")
      ->capture_default_str()
      ->check(CLI::Range(10, 1000000));
  cmd->add_option("--window", o->window, "writes in flight for bandwidth")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--notify-every", o->notify_every,
                  "bandwidth: a notification on every n-th write (and the last), as a stream "
                  "that signals one write in n (ib_write_bw --cq-mod); 1 = every write")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--json", o->json, "also write the results here");
  cmd->add_flag("--busy-poll", o->busy_poll,
                "verbs, fabric: the completion pollers of both ends spin instead of sleeping");
  cmd->add_option("--staging-slots", o->staging_slots,
                  "ipc: slots of each side's staging ring (between two plugins' device memories)")
      ->capture_default_str()
      ->check(CLI::Range(2, 64));
  cmd->add_option("--staging-slot-kib", o->staging_slot_kib, "ipc: bytes of a staging slot, KiB")
      ->capture_default_str()
      ->check(CLI::Range(4, 64 << 10));
  cmd->add_option("--plugin", o->plugins,
                  "also load this plugin file, at both ends (repeatable): an out-of-tree plugin, "
                  "then named by --memory")
      ->allow_extra_args(false);
  cmd->add_option("--peer-plugin", o->peer_plugin,
                  "the only plugin the peer loads (an F with only its device's plugin): over ipc, "
                  "its writes into memory of a plugin it lacks go through its staging ring");
  cmd->add_option("--rdma-device", o->rdma_device,
                  "verbs: the RDMA device of this end (default: the first active one)");
  auto* listen =
      cmd->add_option("--listen", o->listen,
                      "serve one measuring end from another host at HOST:PORT (this host's "
                      "address there), as ib_write_bw's server does; needs the job's secret "
                      "beyond loopback (HETMESH_JOB_SECRET_FILE)");
  cmd->add_option("--connect", o->connect,
                  "measure against a --listen end at HOST:PORT on another host")
      ->excludes(listen);
  cmd->add_flag("--peer", o->peer, "internal: run as the benchmark's peer")->group("");
  cmd->callback([o] {
    uint64_t size = 0;
    for (const auto& s : o->sizes)
      size = std::max(size, parse_size(s));
    if (o->peer) std::exit(run_peer(*o, size));
    if (!o->json.empty()) o->json_out = std::make_shared<JsonOutput>(o->json);
    if (!o->listen.empty()) std::exit(run_listening(*o, size));
    run_bench(*o);
  });
}

}  // namespace hetmesh::cli
