// Signs of life between an engine and its peers (Heartbeat, peer_group.hpp).
#include "peer_group.hpp"

#include "wire.hpp"

#include <fmt/format.h>

namespace hetmesh::afd {

Heartbeat::Heartbeat(const EngineSpec& spec, Role peer_role, size_t peers)
    : timeout_(spec.heartbeat),
      grace_(spec.join_deadline()),
      peer_role_(peer_role),
      last_heard_(peers, Clock::now()),
      heard_once_(peers, false),
      last_sent_(Clock::now() - spec.heartbeat) {}

void Heartbeat::restart(int peer) {
  last_heard_.at(static_cast<size_t>(peer)) = Clock::now();
  heard_once_[static_cast<size_t>(peer)] = false;
}

void Heartbeat::heard(int peer) {
  last_heard_.at(static_cast<size_t>(peer)) = Clock::now();
  heard_once_[static_cast<size_t>(peer)] = true;
}

std::optional<Heartbeat::Silent> Heartbeat::tick(const std::vector<Peer>& peers) {
  const Clock::time_point now = Clock::now();
  if (now - last_sent_ >= timeout_ / 4) {
    last_sent_ = now;
    for (const Peer& peer : peers) {
      if (peer.left || peer.lost || !peer.link->connection->alive()) continue;
      try {  // a busy connection is skipped: its data is on its way, a beat would only queue
        peer.link->connection->try_send_control(encode(ControlWord::heartbeat));
      } catch (const Error&) {  // the connection broke: its peer_lost event follows
      }
    }
  }
  for (const Peer& peer : peers) {
    if (peer.left || peer.lost || !peer.link->connection->alive()) continue;
    const size_t r = static_cast<size_t>(peer.rank);
    auto silent = now - last_heard_[r];
    if (silent <= (heard_once_[r] ? timeout_ : timeout_ + grace_)) continue;
    return Silent{peer.rank,
                  fmt::format("{} hung: nothing heard from it for {} ms (heartbeat_ms {})",
                              peer_name(peer_role_, peer.rank),
                              std::chrono::duration_cast<std::chrono::milliseconds>(silent).count(),
                              timeout_.count())};
  }
  return std::nullopt;
}

}  // namespace hetmesh::afd
