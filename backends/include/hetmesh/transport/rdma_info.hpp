// What the RDMA devices of this host offer, for `hetmesh info` and for choosing a transport.
// Every limit is read from the device (ibv_query_device, ibv_query_port, a probe QP); none is
// assumed. Built without libibverbs, list_rdma_devices() returns nothing.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

// Exported from the library, which hides every other symbol (core/README.md, "Exports").
#pragma GCC visibility push(default)

namespace hetmesh {

// One port of one RDMA device.
struct RdmaDeviceInfo {
  std::string name;         // "mlx5_0", "rxe0"
  uint32_t port = 0;        // 1-based
  std::string port_state;   // "ACTIVE", "DOWN", ...
  std::string link_layer;   // "InfiniBand" or "Ethernet" (RoCE)
  uint32_t active_mtu = 0;  // bytes
  uint16_t lid = 0;         // InfiniBand only
  int gid_index = -1;       // the first IPv4-mapped GID (RoCE), -1 if none
  std::string gid;          // that GID as text
  uint32_t max_qp_wr = 0;
  uint32_t max_sge = 0;
  int32_t max_inline = -1;  // probed by creating an RC QP; -1 if the probe failed
  uint64_t max_mr_size = 0;
  uint32_t max_msg_sz = 0;  // port attribute: the largest single message
  bool dmabuf_supported = false;
  std::string dmabuf_detail;     // why (ibv_reg_dmabuf_mr probe with fd -1: EBADF means supported)
  bool peermem_present = false;  // /sys/module/nvidia_peermem exists
  std::string error;             // non-empty if the device or port could not be queried
};

// Every port of every RDMA device ibv_get_device_list reports; empty if there is none.
std::vector<RdmaDeviceInfo> list_rdma_devices();

}  // namespace hetmesh

#pragma GCC visibility pop
