// The baselines of the transports' own tools, run as child processes on this host: ucx_perftest
// over shared memory for ipc, perftest's ib_write_bw and ib_write_lat on the RDMA device for verbs.
#include "bench_transport.hpp"

#include <hetmesh/transport/rdma_info.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include <unistd.h>

namespace hetmesh::cli::transport_bench {
namespace {

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

}  // namespace

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

// fi_pingpong (libfabric-bin) on the same provider, reliable datagrams: the ceiling for the fabric
// transport. It reports one-way latency (usec/xfer: half a ping-pong) and the ping-pong's
// throughput (MB/sec, 10^6 bytes, one message in flight each way).
void measure_fi_pingpong(Row& row, const std::string& provider, int iterations) {
  std::string path = find_on_path("fi_pingpong");
  if (path.empty()) return;
  auto port = static_cast<uint16_t>(23000 + (getpid() % 20000));
  std::vector<std::string> args = {
      path, "-e", "rdm", "-I", std::to_string(iterations), "-S", std::to_string(row.size)};
  if (provider != "auto") args.insert(args.end(), {"-p", provider});
  std::vector<std::string> server = args, client = args;
  server.insert(server.end(), {"-B", std::to_string(port)});
  client.insert(client.end(), {"-P", std::to_string(port), "127.0.0.1"});
  try {
    ChildProcess serving(server);
    auto deadline = Clock::now() + std::chrono::seconds(30);
    while (!tcp_listening(port) && Clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    ProcessResult result = run_process(client, std::chrono::seconds(300));
    serving.wait(std::chrono::seconds(30));
    if (result.exit_code != 0) {
      fmt::print(stderr, "hetmesh bench: fi_pingpong failed ({}): {}\n", result.describe(),
                 result.err);
      return;
    }
    // bytes #sent #ack total time MB/sec usec/xfer Mxfers/sec: the line after the header.
    std::istringstream lines(result.out);
    std::string line;
    while (std::getline(lines, line)) {
      std::istringstream fields(line);
      std::vector<std::string> f;
      for (std::string word; fields >> word;)
        f.push_back(word);
      if (f.size() < 8 || f[0] == "bytes") continue;
      row.tool_gbps = std::stod(f[5]) * 1e-3;
      row.tool_lat_us = std::stod(f[6]);
    }
  } catch (const std::exception&) {
    // no baseline: its columns stay empty
  }
}

}  // namespace hetmesh::cli::transport_bench
