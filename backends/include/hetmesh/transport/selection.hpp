// Which transport connects two ends. `auto` picks, in order: ipc when both ends run on the same
// node, else verbs when an RDMA device is usable on this host, else tcp. A config may force any
// one, and then it is taken as is (Transport::create says why if it cannot work here).
#pragma once

#include <hetmesh/transport/rdma_info.hpp>
#include <hetmesh/transport/transport.hpp>

#include <optional>
#include <string>
#include <vector>

// Exported from the library, which hides every other symbol (core/README.md, "Exports").
#pragma GCC visibility push(default)

namespace hetmesh {

// This node as the ipc transport sees it: "<hostname>/<boot id>". Two processes may use ipc
// (shared memory, /proc/<pid>/fd) exactly when their identities are equal.
std::string node_identity();

// Whether verbs can run on `device`: it was queried without error, its port is ACTIVE and it
// accepted a probe RC queue pair. If not, `why` (when given) says which.
bool rdma_device_usable(const RdmaDeviceInfo& device, std::string* why = nullptr);

struct TransportSelectionInput {
  std::optional<TransportKind> forced;  // the config names one: it is chosen, whatever the rest
  bool same_node = false;               // every peer runs on this node (equal node_identity())
  std::string rdma_device;              // verbs may use only this device ("" = any)
  std::vector<RdmaDeviceInfo> rdma_devices;  // this host's, as list_rdma_devices() reports them
};

struct TransportSelection {
  TransportKind kind;
  std::string reason;  // why this one, and why not those before it in the order
};

// Decides from `input` alone; neither queries the host nor logs.
TransportSelection choose_transport(const TransportSelectionInput& input);

// The same for this host: lists its RDMA devices when the answer depends on them, and logs the
// choice with its reason (info level).
TransportSelection choose_transport(std::optional<TransportKind> forced, bool same_node,
                                    const std::string& rdma_device = {});

}  // namespace hetmesh

#pragma GCC visibility pop
