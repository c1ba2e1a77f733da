// Joining a job (join.hpp): the engine's transport options, its published regions, and the
// connections to every peer's current incarnation.
#include "join.hpp"

#include "wire.hpp"

#include <hetmesh/core/hex.hpp>
#include <hetmesh/core/log.hpp>
#include <hetmesh/core/topology.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <optional>

namespace hetmesh::afd {

std::vector<uint8_t> PublishedRegions::encode() const {
  nlohmann::json document = nlohmann::json::object();
  for (const auto& [name, region] : regions)
    document[name] = to_hex(region->describe());
  std::string text = document.dump();
  return {text.begin(), text.end()};
}

std::map<std::string, std::vector<uint8_t>> decode_regions(const std::vector<uint8_t>& blob,
                                                           const std::string& from) {
  auto document = nlohmann::json::parse(blob.begin(), blob.end(), nullptr, false);
  if (document.is_discarded() || !document.is_object())
    throw Error(kStatusProtocolError, fmt::format("{} published malformed regions", from));
  std::map<std::string, std::vector<uint8_t>> out;
  for (const auto& [name, value] : document.items()) {
    if (!value.is_string())
      throw Error(kStatusProtocolError,
                  fmt::format("{} published a malformed region '{}'", from, name));
    out[name] = from_hex(value.get<std::string>(), from + " region " + name, kStatusProtocolError);
  }
  return out;
}

std::map<std::string, uint64_t> expected_regions(const EngineSpec& spec, Role peer_role, int rank) {
  const uint64_t header = sizeof(WireHeader);
  const uint64_t slots = uint64_t(spec.attention) * spec.micro_batches;  // an F's headers, per A
  const uint64_t results = uint64_t(spec.micro_batches) * spec.ffn;      // an A's, per F
  if (peer_role == Role::ffn)  // F `rank`'s row spaces of every micro-batch
    return {{"a2f_payload", spec.a2f_block_bytes(spec.ffn_rows(rank)) * spec.micro_batches},
            {"a2f_headers", header * slots}};
  return {{"f2a_payload", spec.f2a_slot_bytes() * results}, {"f2a_headers", header * results}};
}

std::shared_ptr<const Link> connect_peer(const EngineSpec& spec, Transport& transport,
                                         Membership& membership, Role peer_role, int rank,
                                         uint64_t epoch) {
  const auto expected = expected_regions(spec, peer_role, rank);
  const std::string name = peer_name(peer_role, rank);
  const std::string self = peer_name(spec.role, spec.rank);
  auto endpoint =
      membership.fetch(to_string(peer_role), rank, epoch, "endpoint", spec.join_deadline());
  auto regions = decode_regions(
      membership.fetch(to_string(peer_role), rank, epoch, "regions", spec.join_deadline()), name);
  for (const auto& [region, bytes] : expected)
    if (!regions.contains(region))
      throw Error(kStatusProtocolError, fmt::format("{}: {} (epoch {}) published no region '{}'",
                                                    self, name, epoch, region));
  auto link = std::make_shared<Link>();
  link->epoch = epoch;
  link->connection = transport.connect(endpoint, spec.join_deadline());
  for (const auto& [region, descriptor] : regions) {
    auto size = expected.find(region);
    if (size == expected.end()) continue;  // not one this engine writes to
    auto imported = link->connection->import_region(descriptor);
    if (imported->size() != size->second)
      throw Error(kStatusProtocolError,
                  fmt::format("{}: {} (epoch {}) published region '{}' of {} bytes, but this "
                              "job's shape needs {} (were both started from the same config?)",
                              self, name, epoch, region, imported->size(), size->second));
    link->regions[region] = std::move(imported);
  }
  log(LogLevel::debug, "{}: connected to {} (epoch {}) over {}", self, name, epoch,
      to_string(transport.kind()));
  return link;
}

Joined join(const EngineSpec& spec, Transport& transport, const PublishedRegions& mine,
            KeyValueStore& store, Role peer_role, int peer_count) {
  Membership membership(store, spec.job, to_string(spec.role), spec.rank);
  Joined joined;
  joined.epoch = membership.join({{"endpoint", transport.endpoint()}, {"regions", mine.encode()}});
  for (int rank = 0; rank < peer_count; ++rank) {
    Peer peer;
    peer.rank = rank;
    uint64_t epoch = membership.current_epoch(to_string(peer_role), rank, spec.join_deadline());
    while (!peer.link) {
      try {
        peer.link = connect_peer(spec, transport, membership, peer_role, rank, epoch);
      } catch (const Error& e) {
        // A peer that failed after publishing its endpoint refuses the connection: its own report
        // says why, better than the refusal.
        std::optional<std::string> failure;
        try {
          failure = job_failure(store, spec.job);
        } catch (const Error&) {
        }
        if (failure)
          throw Error(kStatusJobFailed, fmt::format("job '{}' failed: {}", spec.job, *failure));
        if (e.status() == kStatusProtocolError) throw;
        // It died while this instance was joining, and a replacement took its place: that one.
        uint64_t newest = epoch;
        try {
          newest =
              membership.current_epoch(to_string(peer_role), rank, std::chrono::milliseconds(0));
        } catch (const Error&) {
        }
        if (newest > epoch) {
          log(LogLevel::info,
              "{}: {} (epoch {}) is gone ({}); connecting to its replacement (epoch {})",
              peer_name(spec.role, spec.rank), peer_name(peer_role, rank), epoch, e.what(), newest);
          epoch = newest;
          continue;
        }
        throw Error(e.status(), fmt::format("{}: connecting to {} (epoch {}): {}",
                                            peer_name(spec.role, spec.rank),
                                            peer_name(peer_role, rank), epoch, e.what()));
      }
    }
    joined.peers.push_back(std::move(peer));
  }
  return joined;
}

TransportOptions transport_options(const EngineSpec& spec, const Device& device) {
  TransportOptions options = spec.transport;
  options.io_timeout = spec.io_timeout.value_or(spec.timeout);
  if (options.rdma_device == "auto") {
    const std::string pci = device.properties().pci_bus_id;
    std::optional<std::string> nic;
    if (!pci.empty()) nic = Topology::of_this_machine().nearest_nic(pci);
    options.rdma_device = nic.value_or("");
    log(LogLevel::info, "{}: RDMA device auto: {}", device.selector(),
        nic ? fmt::format("{}, the nearest to {}", *nic, pci)
            : std::string("the first active one (the topology names no NIC near the device)"));
  }
  if (options.rails == std::vector<std::string>{"auto"}) {
    // Every RDMA NIC on the device's NUMA node; one such NIC is that NIC alone, none the first.
    const std::string pci = device.properties().pci_bus_id;
    const Topology& topology = Topology::of_this_machine();
    std::optional<Topology::Place> place;
    if (!pci.empty()) place = topology.place(pci);
    options.rails.clear();
    for (const auto& nic : topology.rdma_nics())
      if (place && place->numa_node >= 0 && nic.numa_node == place->numa_node)
        options.rails.push_back(nic.name);
    if (options.rails.size() == 1) options.rdma_device = options.rails.front();
    log(LogLevel::info, "{}: nics auto: {}", device.selector(),
        options.rails.empty()
            ? std::string("no RDMA NIC known on the device's NUMA node: one rail, the first "
                          "active NIC")
            : fmt::format("{} on NUMA node {}", fmt::join(options.rails, ", "), place->numa_node));
    if (options.rails.size() < 2) options.rails.clear();
  }
  return options;
}

}  // namespace hetmesh::afd
