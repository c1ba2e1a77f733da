// Endpoint and region descriptors are small JSON documents: legible in logs and rendezvous dumps,
// and validated field by field when a peer's arrives (every one is hostile input).
#pragma once

#include <hetmesh/core/error.hpp>
#include <hetmesh/transport/transport.hpp>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace hetmesh::detail {

inline std::vector<uint8_t> to_bytes(const nlohmann::json& document) {
  std::string text = document.dump();
  return {text.begin(), text.end()};
}

// Parses a descriptor and checks it is for `transport`; throws Error(INVALID_ARGUMENT) naming
// `what` otherwise.
nlohmann::json parse_descriptor(const std::vector<uint8_t>& bytes, const char* transport,
                                const char* what);

// Reads a required field of type T; throws naming the field. An integer field must hold an
// integer that fits T exactly: a peer's -1, 2^32 + 5 or 1.5 is refused, never wrapped or cut.
template <typename T>
T field(const nlohmann::json& document, const char* name, const char* what) {
  auto it = document.find(name);
  if (it == document.end())
    throw Error(HM_ERR_INVALID_ARGUMENT, fmt::format("{} lacks '{}'", what, name));
  auto malformed = [&] {
    return Error(HM_ERR_INVALID_ARGUMENT, fmt::format("{} has a malformed '{}'", what, name));
  };
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    if (!it->is_number_integer()) throw malformed();
    if (it->is_number_unsigned()) {
      auto value = it->template get<uint64_t>();
      if (value > static_cast<uint64_t>(std::numeric_limits<T>::max())) throw malformed();
      return static_cast<T>(value);
    }
    auto value = it->template get<int64_t>();
    if (!std::in_range<T>(value)) throw malformed();
    return static_cast<T>(value);
  } else {
    try {
      return it->template get<T>();
    } catch (const nlohmann::json::exception&) {
      throw malformed();
    }
  }
}

// What errors about a region descriptor call it (the `what` of parse_descriptor and field).
inline constexpr const char* kRegionDescriptor = "region descriptor";

// A region descriptor with the fields every transport's carries: the transport, the exporting
// endpoint, the region's id there and its size. The transport adds its own fields.
nlohmann::json region_descriptor(const char* transport, const std::string& endpoint,
                                 uint32_t region, uint64_t size);

// The common fields of a peer's region descriptor, as read_region_descriptor found them.
struct RegionDescriptorFields {
  nlohmann::json document;  // the whole descriptor: the transport reads its own fields from it
  std::string endpoint;     // the exporting endpoint: the connection's peer
  uint32_t region = 0;      // the region's id at that endpoint
  uint64_t size = 0;
};

// Reads a region descriptor a peer sent: it must be for `transport`, belong to endpoint `peer`
// (the connection's peer) and name a region and its size. Throws Error(HM_ERR_INVALID_ARGUMENT)
// saying what is wrong.
RegionDescriptorFields read_region_descriptor(const RegionDescriptor& bytes, const char* transport,
                                              const std::string& peer);

}  // namespace hetmesh::detail
