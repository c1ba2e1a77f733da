// Reading and writing descriptors (descriptor.hpp): the checks every peer's descriptor passes,
// and the region fields all transports share.
#include "common/descriptor.hpp"

namespace hetmesh::detail {

nlohmann::json parse_descriptor(const std::vector<uint8_t>& bytes, const char* transport,
                                const char* what) {
  nlohmann::json document = nlohmann::json::parse(bytes.begin(), bytes.end(), nullptr, false);
  if (document.is_discarded() || !document.is_object())
    throw Error(HM_ERR_INVALID_ARGUMENT, fmt::format("{} is not a descriptor", what));
  if (document.value("transport", "") != transport)
    throw Error(HM_ERR_INVALID_ARGUMENT, fmt::format("{} is for transport '{}', not '{}'", what,
                                                     document.value("transport", "?"), transport));
  return document;
}

nlohmann::json region_descriptor(const char* transport, const std::string& endpoint,
                                 uint32_t region, uint64_t size) {
  return {{"transport", transport}, {"endpoint", endpoint}, {"region", region}, {"size", size}};
}

RegionDescriptorFields read_region_descriptor(const RegionDescriptor& bytes, const char* transport,
                                              const std::string& peer) {
  RegionDescriptorFields fields;
  fields.document = parse_descriptor(bytes, transport, kRegionDescriptor);
  fields.endpoint = field<std::string>(fields.document, "endpoint", kRegionDescriptor);
  if (fields.endpoint != peer)
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("{} belongs to endpoint {}, this connection's peer is {}",
                            kRegionDescriptor, fields.endpoint, peer));
  fields.region = field<uint32_t>(fields.document, "region", kRegionDescriptor);
  fields.size = field<uint64_t>(fields.document, "size", kRegionDescriptor);
  return fields;
}

}  // namespace hetmesh::detail
