// Constructors of the transport implementations, and checks they share.
#pragma once

#include <hetmesh/transport/transport.hpp>

namespace hetmesh::detail {

std::unique_ptr<Transport> make_tcp_transport(const TransportOptions& options);
// Throws Error(HM_ERR_NOT_SUPPORTED) saying why when there is no usable RDMA device.
std::unique_ptr<Transport> make_verbs_transport(const TransportOptions& options);
std::unique_ptr<Transport> make_ipc_transport(const TransportOptions& options);
// Throws Error(HM_ERR_NOT_SUPPORTED) saying why when no libfabric provider fits.
std::unique_ptr<Transport> make_fabric_transport(const TransportOptions& options);

// Validates a registration: non-empty, and inside one allocation when the plugin knows the
// memory. Throws Error(INVALID_ARGUMENT) naming the problem.
void check_registration(const Device& device, const void* ptr, uint64_t size);

}  // namespace hetmesh::detail
