// What an instance saw of its peers, as JSON (the demo collects it from every process) and as the
// summary's lines (afd/metrics.hpp, InstanceHistory).
#include <hetmesh/afd/metrics.hpp>
#include <hetmesh/core/error.hpp>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>

namespace hetmesh::afd {

namespace {

Role role_from(const std::string& text) {
  if (text == "attention") return Role::attention;
  if (text == "ffn") return Role::ffn;
  throw Error(HM_ERR_INVALID_ARGUMENT, fmt::format("malformed peer history: role '{}'", text));
}

}  // namespace

std::string history_to_json(const InstanceHistory& h) {
  nlohmann::json changes = nlohmann::json::array();
  for (const PeerChange& c : h.history.changes)
    changes.push_back({{"at_ns", c.at_ns},
                       {"role", to_string(c.role)},
                       {"rank", c.rank},
                       {"epoch", c.epoch},
                       {"lost", c.state == PeerStatus::State::lost},
                       {"reason", c.reason}});
  return nlohmann::json{{"role", to_string(h.role)},
                        {"rank", h.rank},
                        {"stale_events", h.history.stale_events},
                        {"changes", changes}}
      .dump();
}

InstanceHistory history_from_json(const std::string& text) {
  try {
    auto j = nlohmann::json::parse(text);
    InstanceHistory h;
    h.role = role_from(j.at("role"));
    h.rank = j.at("rank");
    h.history.stale_events = j.at("stale_events");
    for (const auto& c : j.at("changes"))
      h.history.changes.push_back(
          {c.at("at_ns"), role_from(c.at("role")), c.at("rank"), c.at("epoch"),
           c.at("lost").get<bool>() ? PeerStatus::State::lost : PeerStatus::State::live,
           c.at("reason")});
    return h;
  } catch (const nlohmann::json::exception& e) {
    throw Error(HM_ERR_INVALID_ARGUMENT, fmt::format("malformed peer history: {}", e.what()));
  }
}

std::vector<std::string> describe_histories(const std::vector<InstanceHistory>& histories,
                                            int64_t origin_ns) {
  std::vector<std::pair<int64_t, std::string>> lines;  // (when, text)
  if (origin_ns == 0)
    for (const InstanceHistory& h : histories)
      for (const PeerChange& c : h.history.changes)
        if (origin_ns == 0 || c.at_ns < origin_ns) origin_ns = c.at_ns;
  for (const InstanceHistory& h : histories)
    for (const PeerChange& c : h.history.changes)
      lines.emplace_back(
          c.at_ns, fmt::format("{} {} at {:+.1f} ms: {} (epoch {})", to_string(h.role), h.rank,
                               static_cast<double>(c.at_ns - origin_ns) / 1e6,
                               c.state == PeerStatus::State::lost
                                   ? c.reason
                                   : fmt::format("{} {} joined", to_string(c.role), c.rank),
                               c.epoch));
  std::stable_sort(lines.begin(), lines.end(),
                   [](const auto& x, const auto& y) { return x.first < y.first; });
  std::vector<std::string> out;
  for (auto& line : lines)
    out.push_back(std::move(line.second));
  for (const InstanceHistory& h : histories)
    if (h.history.stale_events > 0)
      out.push_back(fmt::format("{} {}: {} event(s) of superseded incarnations dropped",
                                to_string(h.role), h.rank, h.history.stale_events));
  return out;
}

}  // namespace hetmesh::afd
