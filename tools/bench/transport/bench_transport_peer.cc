// The peer of the measuring end: echoes its latency writes and counts its bandwidth writes, as a
// child process on the same host (--peer) or as the --listen end on another host.
#include "bench_transport.hpp"

#include <hetmesh/core/hex.hpp>
#include <hetmesh/core/job_secret.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>

namespace hetmesh::cli::transport_bench {
namespace {

constexpr std::chrono::minutes kListenWait{10};

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
        if ((e.value & kCountMask) != (counted & kCountMask))
          fmt::print(stderr, "bench peer: bandwidth write {} notified as number {}\n",
                     e.value & kCountMask, counted & kCountMask);
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

}  // namespace

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

}  // namespace hetmesh::cli::transport_bench
