// The measuring end and how it meets its peer: a child process on this host, whose descriptors
// come over its stdin and stdout, or the --listen end on another host, whose store (authenticated
// by the job's secret) carries both ends' endpoint and region descriptors.
#include "bench_transport.hpp"

#include <hetmesh/core/hex.hpp>
#include <hetmesh/core/socket.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstring>

#include <sys/socket.h>

namespace hetmesh::cli::transport_bench {
namespace {

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

}  // namespace

// A device selector from --memory: "cuda:1" as given, a bare plugin name means its device 0.
std::string device_selector(const std::string& memory) {
  return memory.find(':') == std::string::npos ? memory + ":0" : memory;
}

End::End(const BenchOptions& o, const std::string& selector, uint64_t size,
         const std::string& listen_host)
    : device(load_plugins(o).device(selector)), memory(device.allocate(size)) {
  TransportOptions options;
  options.kind = parse_transport_kind(o.transport);
  options.listen_host = listen_host;
  options.rdma_device = o.rdma_device;
  options.fabric_provider = o.provider;
  options.rails = o.rails;
  options.busy_poll = o.busy_poll;
  options.staging_slots = o.staging_slots;
  options.staging_slot_bytes = o.staging_slot_kib << 10;
  transport = Transport::create(options);
  region = transport->register_memory(device, memory.data(), size);
}

PluginRegistry load_plugins(const BenchOptions& o) {
  PluginLoadOptions load;
  load.explicit_paths = o.plugins;
  PluginRegistry registry = PluginRegistry::load(load);
  for (const auto& refused : registry.refused())
    for (const auto& file : o.plugins)
      if (refused.path == file)
        throw Error(HM_ERR_INVALID_ARGUMENT,
                    fmt::format("--plugin {}: refused: {}", file, refused.reason));
  return registry;
}

void send_text(Connection& c, const std::string& text) {
  c.send_control({reinterpret_cast<const uint8_t*>(text.data()), text.size()});
}

// One host: the peer is a child process.
Pair pair_with_child(const BenchOptions& o, uint64_t max_size, const std::string& peer_memory) {
  Pair p;
  p.end = std::make_unique<End>(o, device_selector(o.memory), max_size);
  std::vector<std::string> peer_args = {self_executable(), "bench",        "transport", "--peer",
                                        "--transport",     o.transport,    "--memory",  peer_memory,
                                        "--sizes",         human(max_size)};
  if (o.busy_poll) peer_args.push_back("--busy-poll");
  for (const auto& file : o.plugins)
    peer_args.insert(peer_args.end(), {"--plugin", file});
  if (!o.peer_plugin.empty()) {
    auto plugin = load_plugins(o).find(o.peer_plugin);
    if (!plugin)
      throw Error(HM_ERR_INVALID_ARGUMENT,
                  fmt::format("--peer-plugin {}: no such plugin here (hetmesh info lists them)",
                              o.peer_plugin));
    peer_args.insert(peer_args.end(), {"--peer-plugin", plugin->path()});
  }
  if (!o.rdma_device.empty()) peer_args.insert(peer_args.end(), {"--rdma-device", o.rdma_device});
  peer_args.insert(peer_args.end(), {"--provider", o.provider});
  if (!o.rails.empty())
    peer_args.insert(peer_args.end(), {"--rails", fmt::format("{}", fmt::join(o.rails, ","))});
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

// "HOST" of "HOST:PORT" (an IPv6 host keeps its brackets, as a transport's listen_host wants).
std::string host_of(const std::string& host_port) {
  return host_port.substr(0, host_port.rfind(':'));
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

}  // namespace hetmesh::cli::transport_bench
