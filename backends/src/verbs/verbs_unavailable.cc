// Built without libibverbs: the verbs transport reports why it is missing, and there are no RDMA
// devices to list.
#include "common/transports.hpp"

#include <hetmesh/transport/rdma_info.hpp>

namespace hetmesh {

std::vector<RdmaDeviceInfo> list_rdma_devices() {
  return {};
}

namespace detail {

std::unique_ptr<Transport> make_verbs_transport(const TransportOptions&) {
  throw Error(HM_ERR_NOT_SUPPORTED,
              "verbs: this build of hetmesh has no RDMA support (libibverbs was not found at "
              "build time; install libibverbs-dev and rebuild)");
}

}  // namespace detail
}  // namespace hetmesh
