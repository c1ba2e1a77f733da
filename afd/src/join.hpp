// How an engine joins its job: the transport it reaches its peers over, publishing itself (a new
// epoch, its endpoint and regions) through the store, and connecting to each peer's current
// incarnation with its regions checked against the job's shape.
#pragma once

#include "peer.hpp"

#include <hetmesh/afd/engine.hpp>
#include <hetmesh/core/membership.hpp>
#include <hetmesh/core/rendezvous.hpp>

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace hetmesh::afd {

// The transport's options for an engine on `device`: spec.transport, with the job's timeout
// bounding every send as it bounds every wait (a peer that stops reading fails the send; nothing
// blocks forever), and an "auto" RDMA device resolved to the NIC nearest the device (topology.hpp;
// the first active one where the topology does not say).
TransportOptions transport_options(const EngineSpec& spec, const Device& device);

// This instance's registered regions, by name, as published for peers.
struct PublishedRegions {
  std::map<std::string, std::shared_ptr<Region>> regions;
  std::vector<uint8_t> encode() const;
};
std::map<std::string, std::vector<uint8_t>> decode_regions(const std::vector<uint8_t>& blob,
                                                           const std::string& from);

// The region names and sizes peer (`peer_role`, `rank`) must publish in a job of this shape: a
// peer started from another config is refused at connection time, not by a write out of range
// later.
std::map<std::string, uint64_t> expected_regions(const EngineSpec& spec, Role peer_role, int rank);

// Connects to epoch `epoch` of peer (`peer_role`, `rank`): fetches its endpoint and regions from
// the store, connects (both sides call connect) and imports its regions, checking them against
// expected_regions.
std::shared_ptr<const Link> connect_peer(const EngineSpec& spec, Transport& transport,
                                         Membership& membership, Role peer_role, int rank,
                                         uint64_t epoch);

// Publishes this instance (a new epoch of it) with its endpoint and regions, then connects to
// every rank of `peer_role` at its current epoch, in rank order (a global order, so symmetric
// connects never wait on each other in a cycle). Returns this instance's epoch and its peers.
struct Joined {
  uint64_t epoch = 0;
  std::vector<Peer> peers;
};
Joined join(const EngineSpec& spec, Transport& transport, const PublishedRegions& mine,
            KeyValueStore& store, Role peer_role, int peer_count);

}  // namespace hetmesh::afd
