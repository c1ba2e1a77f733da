// What an RDMA device offers, read from it or probed, never assumed: the device list, an opened
// device and its attributes, port states, the IPv4-mapped GID, the queue depths and inline size an
// RC QP gets, dma-buf and peermem support. The verbs transport's device context (verbs_device.cc)
// and the `hetmesh info` listing (rdma_info.cc) both read devices through these.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <string>

namespace hetmesh::detail {

// The attributes of the RC QP a verbs link creates, one SGE each way: the link's QPs and the
// probe of what inline size they get are made from this one description.
ibv_qp_init_attr rc_qp_attributes(ibv_cq* send_cq, ibv_cq* recv_cq, uint32_t send_depth,
                                  uint32_t recv_depth, uint32_t max_inline);

// ibv_get_device_list's array, freed when this goes. A device opened from it stays open after.
struct DeviceList {
  ibv_device** devices = nullptr;
  int count = 0;
  DeviceList() { devices = ibv_get_device_list(&count); }
  ~DeviceList() {
    if (devices != nullptr) ibv_free_device_list(devices);
  }
  DeviceList(const DeviceList&) = delete;
  DeviceList& operator=(const DeviceList&) = delete;
};

// One device, opened and queried (ibv_open_device, ibv_query_device); closed when this goes,
// unless release()d.
class OpenedDevice {
 public:
  explicit OpenedDevice(ibv_device* device);
  ~OpenedDevice();
  OpenedDevice(OpenedDevice&& other) noexcept;
  OpenedDevice(const OpenedDevice&) = delete;
  OpenedDevice& operator=(const OpenedDevice&) = delete;
  OpenedDevice& operator=(OpenedDevice&&) = delete;

  const std::string& name() const { return name_; }
  // Null if the device could not be opened or queried; error() then says why.
  ibv_context* context() const { return context_; }
  const std::string& error() const { return error_; }
  const ibv_device_attr& attr() const { return attr_; }
  // Hands the open context to the caller, who closes it from then on.
  ibv_context* release();

 private:
  std::string name_;
  ibv_context* context_ = nullptr;
  ibv_device_attr attr_{};
  std::string error_;
};

// The queue depths every QP of the device uses: what the transport wants, within max_qp_wr and
// max_cqe.
struct QueueDepths {
  uint32_t send = 0;
  uint32_t recv = 0;
};
QueueDepths queue_depths(const ibv_device_attr& device);

const char* port_state_name(ibv_port_state state);
inline bool is_ethernet(const ibv_port_attr& port) {
  return port.link_layer == IBV_LINK_LAYER_ETHERNET;
}

// The index of the first IPv4-mapped GID of `port` (RoCE v2 preferred), its GID into *out; -1 if
// none. `ports` and `table_length` size the buffer for ibv_query_gid_table, which returns every
// port's.
int find_ipv4_gid(ibv_context* context, uint8_t port, uint8_t ports, int table_length,
                  ibv_gid* out);

// Creates and destroys an RC QP with each inline size in turn, largest first; returns what the
// provider granted for the first it accepted, or -1 if it accepted none.
int32_t probe_max_inline(ibv_context* context, ibv_pd* pd, uint32_t send_depth,
                         uint32_t recv_depth);

// ibv_reg_dmabuf_mr (rdma-core >= 34, symbol version IBVERBS_1.12), looked up at run time so an
// older libibverbs still loads us. Null if absent.
using RegDmabufMrFn = ibv_mr* (*)(ibv_pd*, uint64_t, size_t, uint64_t, int, int);
RegDmabufMrFn reg_dmabuf_mr_function();

// Probes ibv_reg_dmabuf_mr on `pd` with fd -1: EBADF means the kernel and provider would accept a
// real dma-buf. Returns the verdict and a sentence saying why.
bool probe_dmabuf(ibv_pd* pd, std::string* detail);

// True if /sys/module/nvidia_peermem exists (plain ibv_reg_mr then accepts GPU pointers).
bool peermem_present();

// Bytes of an ibv_mtu; 0 for an unknown value.
uint32_t mtu_bytes(ibv_mtu mtu);
std::string gid_text(const ibv_gid& gid);
bool gid_is_ipv4_mapped(const ibv_gid& gid);

}  // namespace hetmesh::detail
