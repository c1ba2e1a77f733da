// A peer of an engine as the engine reaches it: its name, its current incarnation's link, how it
// stands (left, lost), and the engine's first failure, which every call reports from then on.
#pragma once

#include <hetmesh/afd/engine.hpp>
#include <hetmesh/core/error.hpp>
#include <hetmesh/transport/transport.hpp>

#include <fmt/format.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace hetmesh::afd {

std::string peer_name(Role role, int rank);  // "attention 1", "ffn 0"

// One incarnation of a peer as this engine reaches it: its epoch, the connection to it and its
// regions imported on that connection. Immutable once made; replaced whole when the peer is.
struct Link {
  uint64_t epoch = 0;
  std::shared_ptr<Connection> connection;
  std::map<std::string, std::shared_ptr<RemoteRegion>> regions;
  const RemoteRegion& region(const std::string& name) const { return *regions.at(name); }
};

// A peer rank of an engine. Only the comm thread changes it, under the engine's mutex: the comm
// thread reads it freely, every other thread under that mutex (a sender keeps its own reference to
// the link it writes on, so a replacement never pulls a connection from under a write).
struct Peer {
  int rank = 0;
  std::shared_ptr<const Link> link;
  bool left = false;        // said ControlWord::leave: done, its going is no failure
  bool lost = false;        // gone without leaving (dead, hung, or replaced), until a replacement
  bool quit = false;        // lost because it said ControlWord::quit: it failed on its own
  std::string lost_reason;  // "ffn 1 lost: ...", "ffn 1 hung: ...", while lost
};

// What status() reports of `peers` (of `role`). Caller holds the engine's mutex.
std::vector<PeerStatus> peer_status(Role role, const std::vector<Peer>& peers);

// Throws Error(INVALID_ARGUMENT) for JobTopology::groups with an attention count that is not a
// multiple of ffn, a map that is not one (an A sending to no F or to one that does not exist, an
// F serving no A), and extra A2F tensors past kMaxA2fTensors or without a name or bytes.
void check_shape(const EngineSpec& spec);

// `make()`, one of an engine's allocations at its start, with an error that says whose and for
// what ("ffn 0: its A2F row spaces: cpu:0: cannot allocate ...").
template <typename Make>
auto engine_allocation(Role role, int rank, const char* what, Make make) -> decltype(make()) {
  try {
    return make();
  } catch (const Error& e) {
    throw Error(e.status(), fmt::format("{}: its {}: {}", peer_name(role, rank), what, e.what()));
  }
}

// Rethrows a failed write to `peer` with the peer's name: "ffn 1 lost: ..." for a lost peer.
[[noreturn]] void rethrow_for_peer(const Error& e, Role role, int rank);

// The first error an engine cannot go on after: every call reports it from then on. Under the
// engine's mutex.
class FirstFailure {
 public:
  // Keeps the first error only; returns whether this one was it.
  bool set(hm_status status, const std::string& reason) {
    if (has()) return false;
    status_ = status == HM_OK ? HM_ERR_INTERNAL : status;
    reason_ = reason;
    return true;
  }
  bool has() const { return status_ != HM_OK; }
  const std::string& reason() const { return reason_; }
  void throw_if_set() const {
    if (has()) throw Error(status_, reason_);
  }

 private:
  hm_status status_ = HM_OK;
  std::string reason_;
};

}  // namespace hetmesh::afd
