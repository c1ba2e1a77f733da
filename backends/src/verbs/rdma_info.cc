// list_rdma_devices (rdma_info.hpp), for `hetmesh info` and transport selection: every port of
// every RDMA device, with the limits and registration paths the verbs transport would find there.
#include <hetmesh/transport/rdma_info.hpp>

#include "verbs/verbs_probe.hpp"

#include <fmt/format.h>

#include <cerrno>
#include <cstring>

namespace hetmesh::detail {
namespace {

// One port's entry: the device-wide fields of `info`, then what the port itself says.
RdmaDeviceInfo port_info(const OpenedDevice& device, uint8_t port, RdmaDeviceInfo info) {
  info.port = port;
  ibv_port_attr attr{};
  if (ibv_query_port(device.context(), port, &attr) != 0) {
    info.error = fmt::format("ibv_query_port failed: {}", std::strerror(errno));
    return info;
  }
  info.port_state = port_state_name(attr.state);
  info.link_layer = is_ethernet(attr) ? "Ethernet" : "InfiniBand";
  info.active_mtu = mtu_bytes(attr.active_mtu);
  info.lid = attr.lid;
  info.max_msg_sz = attr.max_msg_sz;
  ibv_gid gid{};
  info.gid_index =
      find_ipv4_gid(device.context(), port, device.attr().phys_port_cnt, attr.gid_tbl_len, &gid);
  if (info.gid_index >= 0) info.gid = gid_text(gid);
  return info;
}

// Appends an entry per port of `handle`'s device, or one saying why the device could not be
// queried. The probes need a protection domain; without one they report failure.
void list_device(ibv_device* handle, bool peermem, std::vector<RdmaDeviceInfo>& out) {
  OpenedDevice device(handle);
  RdmaDeviceInfo common;  // what every port of the device shares
  common.name = device.name();
  if (device.context() == nullptr) {
    common.error = device.error();
    out.push_back(std::move(common));
    return;
  }
  const ibv_device_attr& attr = device.attr();
  common.max_qp_wr = static_cast<uint32_t>(attr.max_qp_wr);
  common.max_sge = static_cast<uint32_t>(attr.max_sge);
  common.max_mr_size = attr.max_mr_size;
  common.peermem_present = peermem;
  ibv_pd* pd = ibv_alloc_pd(device.context());
  common.dmabuf_detail = "no protection domain";
  common.dmabuf_supported = pd != nullptr && probe_dmabuf(pd, &common.dmabuf_detail);
  QueueDepths depths = queue_depths(attr);
  common.max_inline =
      pd != nullptr ? probe_max_inline(device.context(), pd, depths.send, depths.recv) : -1;
  for (uint8_t port = 1; port <= attr.phys_port_cnt; ++port)
    out.push_back(port_info(device, port, common));
  if (pd != nullptr) ibv_dealloc_pd(pd);
}

}  // namespace
}  // namespace hetmesh::detail

namespace hetmesh {

std::vector<RdmaDeviceInfo> list_rdma_devices() {
  std::vector<RdmaDeviceInfo> out;
  detail::DeviceList list;
  if (list.devices == nullptr) return out;
  bool peermem = detail::peermem_present();
  for (int i = 0; i < list.count; ++i)
    detail::list_device(list.devices[i], peermem, out);
  return out;
}

}  // namespace hetmesh
