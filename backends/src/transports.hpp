// Constructors of the transport implementations, and checks they share.
#pragma once

#include <hetmesh/transport.hpp>

namespace hetmesh::detail {

std::unique_ptr<Transport> make_tcp_transport(const TransportOptions& options);

// Validates a registration: non-empty, and inside one allocation when the plugin knows the
// memory. Throws Error(INVALID_ARGUMENT) naming the problem.
void check_registration(const Device& device, const void* ptr, uint64_t size);

}  // namespace hetmesh::detail
