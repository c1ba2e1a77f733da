// Built without libfabric: the fabric transport reports why it is missing.
#include "common/transports.hpp"

#include <hetmesh/transport/fabric_info.hpp>

namespace hetmesh {

std::vector<FabricProviderInfo> list_fabric_providers() {
  return {};
}

}  // namespace hetmesh

namespace hetmesh::detail {

std::unique_ptr<Transport> make_fabric_transport(const TransportOptions&) {
  throw Error(HM_ERR_NOT_SUPPORTED,
              "fabric: this build of hetmesh has no libfabric support (libfabric was not found at "
              "build time; install libfabric-dev and rebuild)");
}

}  // namespace hetmesh::detail
