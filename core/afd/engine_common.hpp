// Pieces both engine roles use: host-side slot memory, publishing descriptors through the
// rendezvous store, connecting to every peer, and the comm thread.
#pragma once

#include "wire.hpp"

#include <hetmesh/afd.hpp>
#include <hetmesh/rendezvous.hpp>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

namespace hetmesh::afd {

const char* role_name(Role role);
std::string peer_name(Role role, int rank);  // "attention 1", "ffn 0"

// Host memory for headers and flags: pinned on the device when it has pinned memory (stream
// memory operations need that), plain host memory otherwise.
class HostSlots {
 public:
  HostSlots(const Device& device, uint64_t bytes);
  uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  bool pinned() const { return static_cast<bool>(pinned_); }

 private:
  Buffer pinned_;
  std::vector<uint8_t> plain_;
  uint8_t* data_;
  uint64_t size_;
};

// This instance's registered regions, by name, as published for peers.
struct PublishedRegions {
  std::map<std::string, std::shared_ptr<Region>> regions;
  std::vector<uint8_t> encode() const;
};
std::map<std::string, std::vector<uint8_t>> decode_regions(const std::vector<uint8_t>& blob,
                                                           const std::string& from);

struct Peer {
  int rank = 0;
  std::shared_ptr<Connection> connection;
  std::map<std::string, std::shared_ptr<RemoteRegion>> regions;
  bool left = false;
};

// Publishes this instance's endpoint and regions, then connects to every rank of `peer_role` in
// rank order (a global order, so symmetric connects never wait on each other in a cycle).
std::vector<Peer> join(const EngineSpec& spec, Transport& transport, const PublishedRegions& mine,
                       KeyValueStore& store, Role peer_role, int peer_count);

// A thread that runs `step` until stopped: the engine's comm loop. Pinned to spec.comm_cpus[0]
// if given.
class CommThread {
 public:
  CommThread(const std::vector<int>& cpus, std::function<void()> step);
  ~CommThread();
  void stop();

 private:
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

// Rethrows a failed write to `peer` with the peer's name: "ffn 1 lost: ..." for a lost peer.
[[noreturn]] void rethrow_for_peer(const Error& e, Role role, int rank);

// Checks a notification's slot index against `limit`; throws a protocol error otherwise.
void check_slot(uint32_t slot, uint32_t limit, const std::string& from);

}  // namespace hetmesh::afd
