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
std::unique_ptr<Transport> make_rails_transport(const TransportOptions& options);

void check_registration(const Device& device, const void* ptr, uint64_t size);

// A write's source or destination range ([offset, +length) of a region of `size` bytes; `side` is
// "source" or "destination") must lie within its region: Error(HM_ERR_INVALID_ARGUMENT) if not.
void check_write_range(const char* side, uint64_t offset, uint64_t length, uint64_t size);

}  // namespace hetmesh::detail
