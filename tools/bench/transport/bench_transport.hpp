// `hetmesh bench transport`: latency (p50, p99) and bandwidth of one transport between two
// processes, per message size, with baselines measured in the same run (memcpy, and one
// memcpy_async of the source memory into pinned host memory through its plugin, always; more for
// some transports) and the ratios. A second copy of this program is the peer. Its files:
//   bench_transport_command.cc    the command: options, pairing the ends, measuring each size
//   bench_transport_ends.cc       the measuring end and how it meets its peer (one host: a child;
//                                 two hosts: a store at the --listen end)
//   bench_transport_peer.cc       the peer: echoes and counts writes; a child (--peer) or the
//                                 --listen end on another host
//   bench_transport_measure.cc    the transport's latency and bandwidth
//   bench_transport_baselines.cc  memcpy and one DMA, in this process
//   bench_transport_tools.cc      the tools' baselines: ucx_perftest (ipc), ib_write_bw/lat
//   (verbs),
//                                 fi_pingpong (fabric)
//   bench_transport_report.cc     the table and the JSON
#pragma once

#include "json_output.hpp"

#include <hetmesh/core/device.hpp>
#include <hetmesh/core/rendezvous.hpp>
#include <hetmesh/core/subprocess.hpp>
#include <hetmesh/transport/transport.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace hetmesh::cli::transport_bench {

using Clock = std::chrono::steady_clock;
constexpr std::chrono::seconds kWait{60};
// A notification's value: bit 30 and the size (below 1 GiB) for "echo this write back", else bit
// 29 and a count for "just count it". Below 2^31, as rails require (and as the fabric transport
// carries in a write's data).
constexpr uint32_t kLatencyTag = 0x40000000u;
constexpr uint32_t kBandwidthTag = 0x20000000u;
constexpr uint32_t kCountMask = kBandwidthTag - 1;

struct BenchOptions {
  std::string transport = "tcp";
  std::string memory = "cpu";
  std::string peer_memory;  // defaults to memory
  std::vector<std::string> sizes = {"8", "4K", "64K", "1M", "2M"};
  int iterations = 300;
  int window = 8;
  int notify_every = 1;  // bandwidth: every n-th write carries a notification (and the last)
  std::string json;
  std::shared_ptr<JsonOutput> json_out;  // opened before the measuring starts
  bool busy_poll = false;                // verbs: the completion poller never sleeps
  // ipc: the staging ring's geometry (TransportOptions)
  uint32_t staging_slots = TransportOptions{}.staging_slots;
  uint64_t staging_slot_kib = TransportOptions{}.staging_slot_bytes >> 10;
  std::string rdma_device;         // verbs: the RDMA device ("" = the first active one)
  std::string provider = "auto";   // fabric: the libfabric provider (TransportOptions)
  std::vector<std::string> rails;  // tcp, verbs, fabric: the NICs to stripe over (TransportOptions)
  // Plugin files to load besides those found (--plugin: an out-of-tree plugin), at both ends.
  std::vector<std::string> plugins;
  // The one plugin the peer loads (its file, as HETMESH_PLUGINS names one), "" = all of them.
  std::string peer_plugin;
  // Across hosts: this end serves at HOST:PORT (as ib_write_bw's server does), or connects to one.
  std::string listen, connect;
  bool peer = false;
};

// The plugins found, and those named with --plugin; a named one that is refused is an error
// naming why.
PluginRegistry load_plugins(const BenchOptions& o);
// "64K" for 65536: sizes as --sizes takes them.
std::string human(uint64_t bytes);
// A device selector from --memory: "cuda:1" as given, a bare plugin name means its device 0.
std::string device_selector(const std::string& memory);
void send_text(Connection& c, const std::string& text);

// ---- the two ends (bench_transport_ends.cc) ----

// One process's end: a device buffer registered with the transport.
struct End {
  Device device;
  Buffer memory;
  std::unique_ptr<Transport> transport;
  std::shared_ptr<Region> region;
  End(const BenchOptions& o, const std::string& selector, uint64_t size,
      const std::string& listen_host = "127.0.0.1");
};

// The measuring end, connected to its peer.
struct Pair {
  std::unique_ptr<End> end;
  std::shared_ptr<Connection> connection;
  std::shared_ptr<RemoteRegion> target;
  std::unique_ptr<ChildProcess> child;   // the peer, on this host
  std::unique_ptr<KeyValueStore> store;  // where the two ends met, across hosts
};
// One host: the peer is a child process.
Pair pair_with_child(const BenchOptions& o, uint64_t max_size, const std::string& peer_memory);
// Across hosts (--connect): the two ends meet in the --listen end's store.
Pair pair_across_hosts(const BenchOptions& o, uint64_t max_size);

// "HOST" of "HOST:PORT" (an IPv6 host keeps its brackets, as a transport's listen_host wants).
std::string host_of(const std::string& host_port);
// Puts an end's endpoint and region descriptors in the store, under bench/<side>/.
void publish(KeyValueStore& store, const std::string& side, const End& end);

// ---- the peer (bench_transport_peer.cc); each returns the process's exit status ----

// As a child of the measuring end (--peer): descriptors over its stdin and stdout.
int run_peer(const BenchOptions& o, uint64_t region_size);
// As the serving end across hosts (--listen): waits for one measuring end, serves it, and exits.
int run_listening(const BenchOptions& o, uint64_t region_size);

// ---- one size's figures ----

struct Row {
  uint64_t size;
  double latency_p50_us, latency_p99_us, bandwidth_gbps;
  double memcpy_p50_us, memcpy_gbps;
  double dma_p50_us = 0, dma_gbps = 0;  // one memcpy_async by the source's plugin, and its sync
  // The transport's own baseline tools, 0 where none ran: bandwidth (ucx_perftest ucp_put_bw,
  // ib_write_bw) and typical one-way latency (ucx_perftest ucp_am_lat, ib_write_lat).
  double tool_gbps = 0;
  double tool_lat_us = 0;
  int count = 0;  // writes in the bandwidth stream
  // The samples behind the latencies (us), for the JSON's CDFs (python3 -m hetmesh.plot).
  std::vector<double> latency_us, memcpy_us, dma_us;
};

// The transport's (bench_transport_measure.cc).
void measure_latency(Row& row, End& end, Connection& connection, const RemoteRegion& target,
                     int iterations, std::vector<TransportEvent>& events);
void measure_bandwidth(Row& row, End& end, Connection& connection, const RemoteRegion& target,
                       const BenchOptions& o, std::vector<TransportEvent>& events);

// The baselines in this process (bench_transport_baselines.cc).
void measure_memcpy(Row& row, int iterations);
void measure_one_dma(Row& row, const Device& device, const Buffer& source, int iterations);

// The tools' baselines (bench_transport_tools.cc), left at 0 where a tool is missing or fails.
// The first executable `program` on PATH, "" where there is none.
std::string find_on_path(const char* program);
void measure_ucx(Row& row, const std::string& ucx_perftest, int iterations);
void measure_perftest(Row& row, int iterations, int window, const std::string& device);
void measure_fi_pingpong(Row& row, const std::string& provider, int iterations);

// The table on stdout and, with --json, the same rows as JSON (bench_transport_report.cc).
void report(const BenchOptions& o, const std::string& peer_memory, const std::vector<Row>& rows);

}  // namespace hetmesh::cli::transport_bench
