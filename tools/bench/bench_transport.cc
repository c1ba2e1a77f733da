// `hetmesh bench transport`: latency (p50, p99) and bandwidth of one transport between two
// processes, per message size, with baselines measured in the same run (memcpy, and one
// memcpy_async of the source memory into pinned host memory through its plugin, always; more for
// some transports) and the ratios. A second copy of this program is the peer.
#include "commands.hpp"
#include "json_output.hpp"
#include "provenance.hpp"

#include <hetmesh/core/hex.hpp>
#include <hetmesh/core/rendezvous.hpp>
#include <hetmesh/core/socket.hpp>
#include <hetmesh/core/subprocess.hpp>
#include <hetmesh/transport/rdma_info.hpp>
#include <hetmesh/transport/transport.hpp>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <thread>

#include <sys/socket.h>
#include <unistd.h>

namespace hetmesh::cli {
namespace {

using Clock = std::chrono::steady_clock;
constexpr std::chrono::seconds kWait{60};
constexpr uint32_t kLatencyTag = 0x80000000u;    // echo this write back
constexpr uint32_t kBandwidthTag = 0x40000000u;  // just count it

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
  std::string rdma_device;  // verbs: the RDMA device ("" = the first active one)
  // The one plugin the peer loads (its file, as HETMESH_PLUGINS names one), "" = all of them.
  std::string peer_plugin;
  // Across hosts: this end serves at HOST:PORT (as ib_write_bw's server does), or connects to one.
  std::string listen, connect;
  bool peer = false;
};

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

std::string human(uint64_t bytes) {
  if (bytes >= (1 << 20) && bytes % (1 << 20) == 0) return fmt::format("{}M", bytes >> 20);
  if (bytes >= 1024 && bytes % 1024 == 0) return fmt::format("{}K", bytes >> 10);
  return fmt::format("{}", bytes);
}

double percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  size_t index = static_cast<size_t>(p * static_cast<double>(values.size() - 1) + 0.5);
  return values[index];
}

// A device selector from --memory: "cuda:1" as given, a bare plugin name means its device 0.
std::string device_selector(const std::string& memory) {
  return memory.find(':') == std::string::npos ? memory + ":0" : memory;
}

// One process's end: a device buffer registered with the transport.
struct End {
  Device device;
  Buffer memory;
  std::unique_ptr<Transport> transport;
  std::shared_ptr<Region> region;
  End(const BenchOptions& o, const std::string& selector, uint64_t size,
      const std::string& listen_host = "127.0.0.1")
      : device(PluginRegistry::load().device(selector)), memory(device.allocate(size)) {
    TransportOptions options;
    options.kind = parse_transport_kind(o.transport);
    options.listen_host = listen_host;
    options.rdma_device = o.rdma_device;
    options.busy_poll = o.busy_poll;
    options.staging_slots = o.staging_slots;
    options.staging_slot_bytes = o.staging_slot_kib << 10;
    transport = Transport::create(options);
    region = transport->register_memory(device, memory.data(), size);
  }
};

void send_text(Connection& c, const std::string& text) {
  c.send_control({reinterpret_cast<const uint8_t*>(text.data()), text.size()});
}

// Waits for events until `done` says so, handing it every event of each poll (a write_done left
// unseen would shrink the bandwidth window); throws on peer loss, failed writes or timeout.
template <typename Done>
void pump(Transport& transport, std::vector<TransportEvent>& events, Done done) {
  std::optional<Clock::time_point> deadline;  // read the clock only once a poll comes back empty
  for (;;) {
    events.clear();
    transport.poll(events, std::chrono::milliseconds(50));
    bool finished = false;
    for (const auto& e : events) {
      if (e.type == TransportEvent::Type::peer_lost)
        throw Error(kStatusPeerLost, "benchmark peer lost: " + e.message);
      if (e.type == TransportEvent::Type::write_done && e.status != HM_OK)
        throw Error(e.status, "benchmark write failed: " + e.message);
      finished = done(e) || finished;
    }
    if (finished) return;
    if (!events.empty()) continue;
    if (!deadline) deadline = Clock::now() + kWait;
    if (Clock::now() > *deadline) throw Error(HM_ERR_TIMEOUT, "benchmark peer stopped answering");
  }
}

// The measured end's peer: echoes latency writes, counts bandwidth writes, until told "exit" or
// the measured end is lost.
int serve_as_peer(End& end, Connection& connection_, const RemoteRegion& target_) {
  Connection* connection = &connection_;
  const RemoteRegion* target = &target_;
  uint64_t counted = 0;
  // "count N": answer once N bandwidth writes were notified (or after kWait with what arrived).
  // Control messages and notifications may travel on different channels (verbs: a socket and the
  // queue pair), so the request can overtake the last notifications.
  uint64_t awaited = 0;  // 0: no count asked for
  Clock::time_point awaited_since;
  std::vector<TransportEvent> events;
  for (;;) {
    events.clear();
    end.transport->poll(events, std::chrono::milliseconds(awaited > 0 ? 10 : 1000));
    for (const auto& e : events) {
      if (e.type == TransportEvent::Type::peer_lost) return 0;
      if (e.type == TransportEvent::Type::notification && (e.value & kLatencyTag)) {
        uint64_t size = e.value & ~kLatencyTag;
        connection->write(*end.region, 0, *target, 0, size, e.value, 0);
      } else if (e.type == TransportEvent::Type::notification && (e.value & kBandwidthTag)) {
        if ((e.value & ~kBandwidthTag) != counted)
          fmt::print(stderr, "bench peer: bandwidth write {} notified as number {}\n",
                     e.value & ~kBandwidthTag, counted);
        ++counted;
      } else if (e.type == TransportEvent::Type::control) {
        std::string text(e.payload.begin(), e.payload.end());
        if (text == "exit") return 0;
        if (text.rfind("count ", 0) == 0) {
          awaited = std::max<uint64_t>(std::stoull(text.substr(6)), 1);
          awaited_since = Clock::now();
        }
      }
    }
    if (awaited > 0 && (counted >= awaited || Clock::now() - awaited_since > kWait)) {
      if (counted < awaited)
        fmt::print(stderr, "bench peer: {} of {} bandwidth writes notified after {} s\n", counted,
                   awaited, kWait.count());
      send_text(*connection, fmt::format("{}", counted));
      counted = 0;
      awaited = 0;
    }
  }
}

// The peer as a child of the measured end (one host): descriptors over its stdin and stdout.
int run_peer(const BenchOptions& o, uint64_t region_size) {
  // Before anything loads the plugins: this process has only that one.
  if (!o.peer_plugin.empty()) setenv("HETMESH_PLUGINS", o.peer_plugin.c_str(), 1);
  End end(o, device_selector(o.memory), region_size);
  std::cout << "ENDPOINT " << to_hex(end.transport->endpoint()) << "\nREGION "
            << to_hex(end.region->describe()) << std::endl;
  std::string endpoint, region;
  if (!std::getline(std::cin, endpoint) || !std::getline(std::cin, region)) return 2;
  auto connection =
      end.transport->connect(from_hex(endpoint.substr(9), "the endpoint line"), kWait);
  auto target = connection->import_region(from_hex(region.substr(7), "the region line"));
  return serve_as_peer(end, *connection, *target);
}

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
};

std::string find_on_path(const char* program) {
  const char* path = std::getenv("PATH");
  std::string all = path ? path : "/usr/bin:/bin";
  size_t start = 0;
  while (start <= all.size()) {
    size_t end = all.find(':', start);
    if (end == std::string::npos) end = all.size();
    std::string candidate = all.substr(start, end - start) + "/" + program;
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
    start = end + 1;
  }
  return {};
}

// The RDMA device named (or the first active one) and its IPv4-mapped GID index, as the verbs
// transport picks them.
std::pair<std::string, int> rdma_device(const std::string& named) {
  for (const auto& d : list_rdma_devices())
    if (d.error.empty() && d.port_state == "ACTIVE" && (named.empty() || d.name == named))
      return {d.name, std::max(d.gid_index, 0)};
  return {"", 0};
}

// Whether something listens on TCP `port` (any address), from /proc/net/tcp and tcp6.
bool tcp_listening(uint16_t port) {
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state;
      fields >> slot >> local >> remote >> state;
      size_t colon = local.rfind(':');
      if (state == "0A" && colon != std::string::npos &&
          std::stoul(local.substr(colon + 1), nullptr, 16) == port)
        return true;
    }
  }
  return false;
}

// Runs a perftest server and client pair on the same RDMA device and returns the client's output.
// The client starts once the server listens (program starts are slow under emulation), and is
// retried once if it still fails while the server waits.
std::string run_perftest(const char* tool, const std::vector<std::string>& extra,
                         const std::string& named_device) {
  std::string path = find_on_path(tool);
  auto [device, gid] = rdma_device(named_device);
  if (path.empty() || device.empty()) return {};
  auto port = static_cast<uint16_t>(21000 + (getpid() % 20000));
  std::vector<std::string> args = {
      path, "-d", device, "-x", std::to_string(gid), "-F", "-p", std::to_string(port)};
  args.insert(args.end(), extra.begin(), extra.end());
  try {
    ChildProcess server(args);
    auto deadline = Clock::now() + std::chrono::seconds(30);
    while (!tcp_listening(port) && Clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    args.push_back("127.0.0.1");
    ProcessResult client;
    for (int attempt = 0; attempt < 2; ++attempt) {
      client = run_process(args, std::chrono::seconds(300));
      if (client.exit_code == 0 || !tcp_listening(port)) break;
      std::this_thread::sleep_for(std::chrono::seconds(1));
    }
    server.wait(std::chrono::seconds(30));
    if (client.exit_code != 0)
      fmt::print(stderr, "hetmesh bench: {} failed ({}): {}\n", tool, client.describe(),
                 client.err);
    return client.exit_code == 0 ? client.out : std::string();
  } catch (const Error&) {
    return {};
  }
}

// The first line of perftest output whose first field is `size`, split into numbers.
std::vector<double> perftest_row(const std::string& output, uint64_t size) {
  std::istringstream lines(output);
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream fields(line);
    std::vector<double> numbers;
    double value;
    while (fields >> value)
      numbers.push_back(value);
    if (numbers.size() >= 5 && numbers[0] == static_cast<double>(size)) return numbers;
  }
  return {};
}

// ib_write_bw and ib_write_lat on the same RDMA device: the ceiling for the verbs transport.
// ib_write_bw keeps `window` writes in flight (-t), as the transport's stream does.
void measure_perftest(Row& row, int iterations, int window, const std::string& device) {
  std::string size = std::to_string(row.size), n = std::to_string(iterations);
  // #bytes #iterations BW-peak[MB/sec] BW-average[MB/sec] MsgRate[Mpps]
  auto bw = perftest_row(
      run_perftest("ib_write_bw", {"-s", size, "-n", n, "-t", std::to_string(window)}, device),
      row.size);
  if (!bw.empty()) row.tool_gbps = bw[3] * 1.048576e-3;  // MiB/s to GB/s
  // #bytes #iterations t_min t_max t_typical t_avg t_stdev 99% 99.9% (usec, one way)
  auto lat = perftest_row(run_perftest("ib_write_lat", {"-s", size, "-n", n}, device), row.size);
  if (!lat.empty()) row.tool_lat_us = lat[4];
}

// One ucx_perftest run over shared memory (UCX_TLS=sm,self), the baseline a same-node transport
// should match: its "Final:" line (iterations, typical latency, average latency, overall latency,
// average MB/s, overall MB/s, ...), empty when ucx_perftest is missing or fails. UCX reports a
// latency test's one-way latency (half its ping-pong).
std::vector<double> run_ucx_perftest(const std::string& ucx_perftest, const char* test,
                                     uint64_t size, int iterations) {
  setenv("UCX_TLS", "sm,self", 1);
  std::string port = std::to_string(20000 + (getpid() % 20000));
  std::vector<std::string> args = {
      ucx_perftest, "-t", test, "-s", std::to_string(size), "-n", std::to_string(iterations),
      "-p",         port};
  try {
    ChildProcess server(args);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // let it listen
    args.insert(args.begin() + 1, "localhost");
    ProcessResult client = run_process(args, std::chrono::seconds(60));
    server.wait(std::chrono::seconds(10));
    size_t final_line = client.out.find("Final:");
    if (client.exit_code != 0 || final_line == std::string::npos) return {};
    std::istringstream fields(client.out.substr(final_line + 6));
    std::vector<double> numbers(6);
    for (double& n : numbers)
      if (!(fields >> n)) return {};
    return numbers;
  } catch (const Error&) {
    return {};
  }
}

// UCX's put bandwidth (ucp_put_bw: puts without notification) and active-message latency
// (ucp_am_lat: a message the peer's progress hands to a callback, as a notification reaches
// poll()) for the row's size.
void measure_ucx(Row& row, const std::string& ucx_perftest, int iterations) {
  if (row.size >= 4096) {
    auto bw = run_ucx_perftest(ucx_perftest, "ucp_put_bw", row.size, iterations);
    if (!bw.empty()) row.tool_gbps = bw[5] * 1.048576e-3;  // MB/s (2^20 bytes) to GB/s
  }
  auto lat = run_ucx_perftest(ucx_perftest, "ucp_am_lat", row.size, std::max(iterations, 10000));
  if (!lat.empty()) row.tool_lat_us = lat[1];
}

// Hot memcpy between two host buffers: the ceiling for a same-node transport.
void measure_memcpy(Row& row, int iterations) {
  std::vector<uint8_t> a(row.size, 1), b(row.size, 2);
  std::vector<double> us;
  for (int i = 0; i < iterations + 10; ++i) {
    auto t0 = Clock::now();
    std::memcpy(b.data(), a.data(), row.size);
    auto t1 = Clock::now();
    if (i >= 10) us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    a[i % row.size] = static_cast<uint8_t>(b[(i * 7) % row.size] + 1);  // keep the copy live
  }
  row.memcpy_p50_us = percentile(us, 0.5);
  row.memcpy_gbps = static_cast<double>(row.size) / (row.memcpy_p50_us * 1e3);
}

// One DMA: a single memcpy_async of the same bytes by the source's plugin, from its memory into
// pinned host memory (the plugin's own; plain host memory where it has none), then the stream's
// sync. The least one write of that memory to a host peer can cost, through the ABI alone.
void measure_one_dma(Row& row, const Device& device, const Buffer& source, int iterations) {
  HostBuffer host(device, row.size);
  Stream stream = device.create_stream();
  std::vector<double> us;
  for (int i = 0; i < iterations + 10; ++i) {
    auto t0 = Clock::now();
    stream.copy(host.data(), source.data(), row.size);
    stream.synchronize(kWait);
    auto t1 = Clock::now();
    if (i >= 10) us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  row.dma_p50_us = percentile(us, 0.5);
  row.dma_gbps = static_cast<double>(row.size) / (row.dma_p50_us * 1e3);
}

// Latency: a write with notification, echoed back by the peer; half the round trip.
void measure_latency(Row& row, End& end, Connection& connection, const RemoteRegion& target,
                     int iterations, std::vector<TransportEvent>& events) {
  std::vector<double> one_way_us;
  uint32_t tag = kLatencyTag | static_cast<uint32_t>(row.size);
  for (int i = 0; i < iterations + 10; ++i) {
    auto t0 = Clock::now();
    connection.write(*end.region, 0, target, 0, row.size, tag, 0);
    pump(*end.transport, events, [&](const TransportEvent& e) {
      return e.type == TransportEvent::Type::notification && e.value == tag;
    });
    auto t1 = Clock::now();
    if (i >= 10)
      one_way_us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / 2);
  }
  row.latency_p50_us = percentile(one_way_us, 0.5);
  row.latency_p99_us = percentile(one_way_us, 0.99);
}

// Bandwidth: a stream of writes, at most `window` unfinished, every `notify_every`-th (and the
// last) with a notification, then the peer's count of the notified ones.
void measure_bandwidth(Row& row, End& end, Connection& connection, const RemoteRegion& target,
                       const BenchOptions& o, std::vector<TransportEvent>& events) {
  const uint64_t size = row.size;
  int count = static_cast<int>(std::clamp<uint64_t>((256ull << 20) / size, 64, 4 * o.iterations));
  int in_flight = 0;
  uint32_t notified = 0;
  auto t0 = Clock::now();
  for (int i = 0; i < count; ++i) {
    while (in_flight >= o.window)
      pump(*end.transport, events, [&](const TransportEvent& e) {
        if (e.type == TransportEvent::Type::write_done) --in_flight;
        return in_flight < o.window;
      });
    std::optional<uint32_t> notify;
    if ((i + 1) % o.notify_every == 0 || i + 1 == count) notify = kBandwidthTag | notified++;
    connection.write(*end.region, 0, target, 0, size, notify, 0);
    ++in_flight;
  }
  send_text(connection, fmt::format("count {}", notified));
  std::string counted;
  pump(*end.transport, events, [&](const TransportEvent& e) {
    if (e.type == TransportEvent::Type::control) counted.assign(e.payload.begin(), e.payload.end());
    return !counted.empty();
  });
  auto t1 = Clock::now();
  if (counted != std::to_string(notified))
    throw Error(kStatusProtocolError,
                fmt::format("peer counted {} notified writes of {} bytes, {} were sent", counted,
                            size, notified));
  row.bandwidth_gbps =
      static_cast<double>(size) * count / std::chrono::duration<double, std::nano>(t1 - t0).count();
  row.count = count;
}

// The table on stdout and, with --json, the same rows as JSON.
void report(const BenchOptions& o, const std::string& peer_memory, const std::vector<Row>& rows) {
  fmt::print("hetmesh bench transport: {} {}, {} -> {} memory, {} iterations, window {}{}{}\n",
             o.transport,
             o.connect.empty() ? std::string("between two processes")
                               : fmt::format("to the end at {} on another host", o.connect),
             o.memory, peer_memory, o.iterations, o.window,
             o.notify_every == 1 ? std::string()
                                 : fmt::format(", a notification every {} writes", o.notify_every),
             o.transport != "verbs" ? ""
             : o.busy_poll          ? " (ib_write_bw -t too), busy poller"
                                    : " (ib_write_bw -t too), adaptive poller");
  // The tools: ucx_perftest's ucp_put_bw and ucp_am_lat, or ib_write_bw and ib_write_lat (tcp
  // has none: its columns stay empty).
  const char* tool = o.transport == "verbs" ? "ib_write" : o.transport == "ipc" ? "ucx" : "tool";
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
                           {"bandwidth_ratio_to_one_dma", r.bandwidth_gbps / r.dma_gbps}});
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

// The measured end, connected to its peer.
struct Pair {
  std::unique_ptr<End> end;
  std::shared_ptr<Connection> connection;
  std::shared_ptr<RemoteRegion> target;
  std::unique_ptr<ChildProcess> child;   // the peer, on this host
  std::unique_ptr<KeyValueStore> store;  // where the two ends met, across hosts
};

// One host: the peer is a child process.
Pair pair_with_child(const BenchOptions& o, uint64_t max_size, const std::string& peer_memory) {
  Pair p;
  p.end = std::make_unique<End>(o, device_selector(o.memory), max_size);
  std::vector<std::string> peer_args = {self_executable(), "bench",        "transport", "--peer",
                                        "--transport",     o.transport,    "--memory",  peer_memory,
                                        "--sizes",         human(max_size)};
  if (o.busy_poll) peer_args.push_back("--busy-poll");
  if (!o.peer_plugin.empty()) {
    auto plugin = PluginRegistry::load().find(o.peer_plugin);
    if (!plugin)
      throw Error(HM_ERR_INVALID_ARGUMENT,
                  fmt::format("--peer-plugin {}: no such plugin here (hetmesh info lists them)",
                              o.peer_plugin));
    peer_args.insert(peer_args.end(), {"--peer-plugin", plugin->path()});
  }
  if (!o.rdma_device.empty()) peer_args.insert(peer_args.end(), {"--rdma-device", o.rdma_device});
  peer_args.insert(peer_args.end(), {"--staging-slots", std::to_string(o.staging_slots),
                                     "--staging-slot-kib", std::to_string(o.staging_slot_kib)});
  p.child = std::make_unique<ChildProcess>(peer_args);
  auto peer_endpoint = from_hex(p.child->read_line(kWait).substr(9), "the peer's endpoint line");
  auto peer_region = from_hex(p.child->read_line(kWait).substr(7), "the peer's region line");
  p.child->write("ENDPOINT " + to_hex(p.end->transport->endpoint()) + "\nREGION " +
                 to_hex(p.end->region->describe()) + "\n");
  p.connection = p.end->transport->connect(peer_endpoint, kWait);
  p.target = p.connection->import_region(peer_region);
  return p;
}

// ---- two hosts: the listening end hosts a store (authenticated by the job's secret) that carries
// both ends' endpoint and region descriptors ----

constexpr std::chrono::minutes kListenWait{10};

// "HOST" of "HOST:PORT" (an IPv6 host keeps its brackets, as a transport's listen_host wants).
std::string host_of(const std::string& host_port) {
  return host_port.substr(0, host_port.rfind(':'));
}

// The address of this host's interface that reaches `host_port`: the route a UDP socket takes
// (nothing is sent).
std::string local_address_towards(const std::string& host_port) {
  net::Address to = net::resolve(host_port, /*passive=*/false, "--connect").front();
  net::Fd fd(::socket(to.family(), SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!fd || ::connect(fd.get(), to.get(), to.length) != 0)
    throw Error(kStatusPeerLost,
                fmt::format("--connect {}: no route: {}", host_port, std::strerror(errno)));
  return host_of(net::to_string(net::local_address(fd.get())));
}

void publish(KeyValueStore& store, const std::string& side, const End& end) {
  store.set("bench/" + side + "/endpoint", end.transport->endpoint());
  store.set("bench/" + side + "/region", end.region->describe());
}

// The measuring end, across hosts (--connect).
Pair pair_across_hosts(const BenchOptions& o, uint64_t max_size) {
  Pair p;
  p.store = connect_tcp_store(o.connect, kWait);  // the secret: HETMESH_JOB_SECRET_FILE
  p.end = std::make_unique<End>(o, device_selector(o.memory), max_size,
                                local_address_towards(o.connect));
  publish(*p.store, "client", *p.end);
  auto peer_endpoint = p.store->get("bench/server/endpoint", kWait);
  p.connection = p.end->transport->connect(peer_endpoint, kWait);
  p.target = p.connection->import_region(p.store->get("bench/server/region", kWait));
  if (p.target->size() < max_size)
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("the --listen end at {} serves {} bytes (the largest of its --sizes), "
                            "and this end's --sizes go up to {}: start it with --sizes that "
                            "reach {}",
                            o.connect, p.target->size(), max_size, max_size));
  return p;
}

// The serving end, across hosts (--listen): waits for one measuring end, serves it, and exits.
int run_listening(const BenchOptions& o, uint64_t region_size) {
  const std::string host = host_of(o.listen);
  if (host == "0.0.0.0" || host == "[::]")
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("--listen {}: name the address the other end reaches this host at "
                            "(its transport listens there and tells the other end so)",
                            o.listen));
  TcpStoreServer server(o.listen);  // refuses beyond loopback without the job's secret
  auto store = connect_tcp_store(server.address(), kWait);
  End end(o, device_selector(o.memory), region_size, host);
  publish(*store, "server", end);
  fmt::print(
      "hetmesh bench transport: {} transport, {} memory, serving at {}; on the other host: "
      "hetmesh bench transport --connect {} --transport {} (with the same {})\n",
      o.transport, end.device.selector(), server.address(), server.address(), o.transport,
      JobSecret::kFileVariable);
  std::fflush(stdout);
  auto peer_endpoint = store->get("bench/client/endpoint", kListenWait);
  auto connection = end.transport->connect(peer_endpoint, kWait);
  auto target = connection->import_region(store->get("bench/client/region", kWait));
  return serve_as_peer(end, *connection, *target);
}

void run_bench(const BenchOptions& o) {
  std::vector<uint64_t> sizes;
  for (const auto& s : o.sizes)
    sizes.push_back(parse_size(s));
  uint64_t max_size = *std::max_element(sizes.begin(), sizes.end());
  if (max_size >= kBandwidthTag) throw Error(HM_ERR_INVALID_ARGUMENT, "sizes must be below 1 GiB");
  const bool same_host = o.connect.empty();
  std::string peer_memory = o.peer_memory.empty() ? o.memory : o.peer_memory;
  if (!same_host) peer_memory = "the other host's";
  Pair p = same_host ? pair_with_child(o, max_size, peer_memory) : pair_across_hosts(o, max_size);

  // Same-node transports are also compared with UCX over shared memory, when it is installed;
  // the tools' baselines need both ends on this host.
  std::string ucx_perftest =
      same_host && o.transport == "ipc" ? find_on_path("ucx_perftest") : std::string();
  const bool perftest = same_host && o.transport == "verbs";
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

void add_bench_transport_command(CLI::App& bench) {
  auto o = std::make_shared<BenchOptions>();
  CLI::App* cmd = bench.add_subcommand("transport", "Latency and bandwidth of one transport");
  cmd->add_option("--transport", o->transport, "ipc, tcp or verbs")->capture_default_str();
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
                "verbs: the completion pollers of both ends spin instead of sleeping");
  cmd->add_option("--staging-slots", o->staging_slots,
                  "ipc: slots of each side's staging ring (between two plugins' device memories)")
      ->capture_default_str()
      ->check(CLI::Range(2, 64));
  cmd->add_option("--staging-slot-kib", o->staging_slot_kib, "ipc: bytes of a staging slot, KiB")
      ->capture_default_str()
      ->check(CLI::Range(4, 64 << 10));
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
