// Names and states of an engine's peers (peer.hpp), and the names engine.hpp gives roles and
// states.
#include "peer.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace hetmesh::afd {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

const char* to_string(Role role) {
  return role == Role::attention ? "attention" : "ffn";
}

const char* to_string(PeerStatus::State state) {
  switch (state) {
    case PeerStatus::State::live:
      return "live";
    case PeerStatus::State::left:
      return "left";
    case PeerStatus::State::lost:
      return "lost";
  }
  return "?";
}

std::string peer_name(Role role, int rank) {
  return fmt::format("{} {}", to_string(role), rank);
}

std::vector<PeerStatus> peer_status(Role role, const std::vector<Peer>& peers) {
  std::vector<PeerStatus> out;
  for (const Peer& peer : peers) {
    auto state = peer.lost   ? PeerStatus::State::lost
                 : peer.left ? PeerStatus::State::left
                             : PeerStatus::State::live;
    out.push_back({role, peer.rank, peer.link->epoch, state, peer.lost_reason});
  }
  return out;
}

void check_shape(const EngineSpec& spec) {
  if (spec.topology == JobTopology::groups && spec.attention % spec.ffn != 0)
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("engine spec: topology groups maps attention / ffn As to each F: {} "
                            "As do not divide among {} Fs",
                            spec.attention, spec.ffn));
  if (spec.topology == JobTopology::map) {
    auto bad = [](const std::string& what) {
      throw Error(HM_ERR_INVALID_ARGUMENT, "engine spec: topology map: " + what);
    };
    if (spec.ffns_of.size() != static_cast<size_t>(spec.attention))
      bad(fmt::format("{} lists of Fs for {} As (one each)", spec.ffns_of.size(), spec.attention));
    for (int a = 0; a < spec.attention; ++a) {
      const std::vector<int>& ffns = spec.ffns_of[static_cast<size_t>(a)];
      if (ffns.empty()) bad(fmt::format("attention {} sends to no F", a));
      for (size_t i = 0; i < ffns.size(); ++i)
        if (ffns[i] < 0 || ffns[i] >= spec.ffn ||
            std::find(ffns.begin(), ffns.begin() + static_cast<long>(i), ffns[i]) !=
                ffns.begin() + static_cast<long>(i))
          bad(fmt::format("attention {} names ffn {} ({}): the Fs are 0..{}, each once", a, ffns[i],
                          ffns[i] < 0 || ffns[i] >= spec.ffn ? "no such F" : "twice",
                          spec.ffn - 1));
    }
    for (int f = 0; f < spec.ffn; ++f)
      if (spec.attention_of(f) == 0) bad(fmt::format("ffn {} serves no A", f));
  }
  if (spec.a2f_tensors() > kMaxA2fTensors)
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("engine spec: {} extra A2F tensors; a push carries at most {}",
                            spec.a2f_extra.size(), kMaxA2fTensors - 2));
  for (const ExtraTensor& t : spec.a2f_extra)
    if (t.row_bytes == 0 || t.name.empty())
      throw Error(HM_ERR_INVALID_ARGUMENT,
                  fmt::format("engine spec: extra A2F tensor '{}' of {} bytes a row (a name and at "
                              "least a byte)",
                              t.name, t.row_bytes));
}

void rethrow_for_peer(const Error& e, Role role, int rank) {
  if (e.status() == kStatusPeerLost)
    throw Error(e.status(), fmt::format("{} lost: {}", peer_name(role, rank), e.what()));
  throw Error(e.status(), fmt::format("writing to {}: {}", peer_name(role, rank), e.what()));
}

}  // namespace hetmesh::afd
