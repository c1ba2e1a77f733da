// What a rails transport puts in its descriptors: one of each rail's, in rail order, behind a
// magic and a count. A peer's descriptor is checked for all of it (magic, count, every length
// within the bytes there are) before a rail's part is handed to that rail's transport, which
// checks its own. And the control messages it sends on its rails: a kind, then its counts.
#pragma once

#include <hetmesh/core/error.hpp>

#include <fmt/format.h>

#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace hetmesh::detail {

// "2": every piece acknowledged, control messages framed (a peer of "1" is refused at connect).
constexpr char kRailsMagic[8] = {'h', 'm', 'r', 'a', 'i', 'l', 's', '2'};
constexpr uint32_t kMaxRails = 16;
constexpr uint32_t kMaxRailPart = 64 * 1024;  // far above any transport's descriptor

inline std::vector<uint8_t> pack_rails(const std::vector<std::vector<uint8_t>>& parts) {
  std::vector<uint8_t> out(kRailsMagic, kRailsMagic + sizeof kRailsMagic);
  auto put32 = [&](uint32_t v) {
    uint8_t b[4];
    std::memcpy(b, &v, 4);
    out.insert(out.end(), b, b + 4);
  };
  put32(static_cast<uint32_t>(parts.size()));
  for (const auto& part : parts) {
    put32(static_cast<uint32_t>(part.size()));
    out.insert(out.end(), part.begin(), part.end());
  }
  return out;
}

// `what` names the descriptor in errors ("endpoint", "region").
inline std::vector<std::vector<uint8_t>> unpack_rails(const std::vector<uint8_t>& bytes,
                                                      const char* what) {
  auto malformed = [&](const std::string& why) {
    return Error(HM_ERR_INVALID_ARGUMENT,
                 fmt::format("rails: the peer's {} descriptor is malformed: {}", what, why));
  };
  if (bytes.size() < sizeof kRailsMagic + 4 ||
      std::memcmp(bytes.data(), kRailsMagic, sizeof kRailsMagic) != 0)
    throw malformed("it is not a rails transport's (does the peer name as many nics?)");
  size_t at = sizeof kRailsMagic;
  auto get32 = [&] {
    if (bytes.size() - at < 4) throw malformed("it ends early");
    uint32_t v;
    std::memcpy(&v, bytes.data() + at, 4);
    at += 4;
    return v;
  };
  const uint32_t count = get32();
  if (count < 2 || count > kMaxRails)
    throw malformed(fmt::format("{} rails (2 to {} make sense)", count, kMaxRails));
  std::vector<std::vector<uint8_t>> parts;
  for (uint32_t i = 0; i < count; ++i) {
    const uint32_t length = get32();
    if (length > kMaxRailPart || length > bytes.size() - at)
      throw malformed(fmt::format("rail {}'s part of {} bytes overruns it", i, length));
    parts.emplace_back(bytes.begin() + static_cast<std::ptrdiff_t>(at),
                       bytes.begin() + static_cast<std::ptrdiff_t>(at + length));
    at += length;
  }
  if (at != bytes.size())
    throw malformed(fmt::format("{} bytes after its last rail", bytes.size() - at));
  return parts;
}

// A control message of the rails layer: its first byte says which, 8-byte counts follow.
enum class RailsMessage : uint8_t {
  user = 1,         // number, then the user's control message
  acknowledge = 2,  // notifications landed on this rail's connection, user controls passed up
  lead = 3,         // move number: the sender's user notifications and controls come on this rail
  lead_ack = 4,     // to lead: its move number, user notifications and controls passed up so far
};
constexpr size_t kRailsHeader = 1 + 8;  // a user control message's kind and number

inline std::vector<uint8_t> rails_message(RailsMessage kind, std::initializer_list<uint64_t> counts,
                                          std::span<const uint8_t> tail = {}) {
  std::vector<uint8_t> out{static_cast<uint8_t>(kind)};
  for (uint64_t c : counts) {
    uint8_t b[8];
    std::memcpy(b, &c, 8);
    out.insert(out.end(), b, b + 8);
  }
  out.insert(out.end(), tail.begin(), tail.end());
  return out;
}

// A message's kind and counts (at most three), checked: nullopt for an unknown kind, or a size its
// counts do not make (a user message: at least its header).
inline std::optional<RailsMessage> parse_rails_message(std::span<const uint8_t> m,
                                                       uint64_t (&counts)[3]) {
  if (m.empty()) return std::nullopt;
  const auto kind = static_cast<RailsMessage>(m[0]);
  size_t n = 0;
  switch (kind) {
    case RailsMessage::user:
    case RailsMessage::lead:
      n = 1;
      break;
    case RailsMessage::acknowledge:
      n = 2;
      break;
    case RailsMessage::lead_ack:
      n = 3;
      break;
    default:
      return std::nullopt;
  }
  if (m.size() < 1 + 8 * n || (kind != RailsMessage::user && m.size() != 1 + 8 * n))
    return std::nullopt;
  for (size_t i = 0; i < n; ++i)
    std::memcpy(&counts[i], m.data() + 1 + 8 * i, 8);
  return kind;
}

}  // namespace hetmesh::detail
