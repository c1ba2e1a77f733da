// Endpoint and region descriptors are small JSON documents: legible in logs and rendezvous dumps,
// and validated field by field when a peer's arrives.
#pragma once

#include <hetmesh/core/error.hpp>
#include <hetmesh/transport/transport.hpp>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace hetmesh::detail {

inline std::vector<uint8_t> to_bytes(const nlohmann::json& document) {
  std::string text = document.dump();
  return {text.begin(), text.end()};
}

// Parses a descriptor and checks it is for `transport`; throws Error(INVALID_ARGUMENT) naming
// `what` otherwise.
inline nlohmann::json parse_descriptor(const std::vector<uint8_t>& bytes, const char* transport,
                                       const char* what) {
  nlohmann::json document = nlohmann::json::parse(bytes.begin(), bytes.end(), nullptr, false);
  if (document.is_discarded() || !document.is_object())
    throw Error(HM_ERR_INVALID_ARGUMENT, fmt::format("{} is not a descriptor", what));
  if (document.value("transport", "") != transport)
    throw Error(HM_ERR_INVALID_ARGUMENT, fmt::format("{} is for transport '{}', not '{}'", what,
                                                     document.value("transport", "?"), transport));
  return document;
}

// Reads a required field of type T; throws naming the field.
template <typename T>
T field(const nlohmann::json& document, const char* name, const char* what) {
  auto it = document.find(name);
  if (it == document.end())
    throw Error(HM_ERR_INVALID_ARGUMENT, fmt::format("{} lacks '{}'", what, name));
  try {
    return it->get<T>();
  } catch (const nlohmann::json::exception&) {
    throw Error(HM_ERR_INVALID_ARGUMENT, fmt::format("{} has a malformed '{}'", what, name));
  }
}

}  // namespace hetmesh::detail
