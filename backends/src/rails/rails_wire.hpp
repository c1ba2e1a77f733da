// What a rails transport puts in its descriptors: one of each rail's, in rail order, behind a
// magic and a count. A peer's descriptor is checked for all of it (magic, count, every length
// within the bytes there are) before a rail's part is handed to that rail's transport, which
// checks its own.
#pragma once

#include <hetmesh/core/error.hpp>

#include <fmt/format.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace hetmesh::detail {

constexpr char kRailsMagic[8] = {'h', 'm', 'r', 'a', 'i', 'l', 's', '1'};
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

}  // namespace hetmesh::detail
