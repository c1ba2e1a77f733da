// One ipc connection: importing the peer's regions and issuing writes and control messages to it,
// in order (see ipc_connection.cc).
#pragma once

#include "ipc/ipc_link.hpp"
#include "ipc/ipc_shared.hpp"

#include <hetmesh/transport/transport.hpp>

#include <memory>

namespace hetmesh::detail {

// A connection over `link`, which it registers with `shared` for the poller and starts the
// progress thread of.
std::shared_ptr<Connection> make_ipc_connection(std::shared_ptr<IpcShared> shared,
                                                std::shared_ptr<IpcLink> link);

}  // namespace hetmesh::detail
