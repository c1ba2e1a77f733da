// The verbs transport's view of one RDMA device port: the opened context and protection domain,
// the GID and LID it is addressed by, and every provider limit the transport obeys, read from
// ibv_query_device / ibv_query_port and probes, never assumed.
#pragma once

#include <hetmesh/transport/rdma_info.hpp>
#include <hetmesh/transport/transport.hpp>

#include <infiniband/verbs.h>

#include <cstdint>
#include <memory>
#include <string>

namespace hetmesh::detail {

// Queue depths the transport asks for; the device's max_qp_wr and max_cqe bound them.
constexpr uint32_t kWantedSendDepth = 1024;
constexpr uint32_t kWantedRecvDepth = 1024;
// Inline sizes tried, largest first, when probing what the provider accepts.
constexpr uint32_t kInlineProbes[] = {1024, 512, 256, 128, 64, 32, 0};

struct VerbsLimits {
  uint32_t max_qp_wr = 0;
  uint32_t max_sge = 0;
  uint32_t max_cqe = 0;
  uint64_t max_mr_size = 0;
  uint32_t max_msg_sz = 0;  // after HETMESH_VERBS_MAX_MSG (tests only lower it)
  uint32_t max_inline = 0;  // probed; 0 if the provider has no inline sends
  uint32_t send_depth = 0;  // send queue depth used for every QP
  uint32_t recv_depth = 0;  // receive queue depth used for every QP
  ibv_mtu active_mtu = IBV_MTU_1024;
};

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

class VerbsContext {
 public:
  // Opens options.rdma_device (or the first device with an ACTIVE port), picks the port and GID,
  // allocates the protection domain and reads the limits. Throws Error(HM_ERR_NOT_SUPPORTED)
  // saying what was (not) found.
  static std::shared_ptr<VerbsContext> open(const TransportOptions& options);
  ~VerbsContext();
  VerbsContext(const VerbsContext&) = delete;
  VerbsContext& operator=(const VerbsContext&) = delete;

  ibv_context* context() const { return context_; }
  ibv_pd* pd() const { return pd_; }
  const std::string& name() const { return name_; }
  uint8_t port() const { return port_; }
  bool ethernet() const { return ethernet_; }
  uint16_t lid() const { return lid_; }
  int gid_index() const { return gid_index_; }
  const ibv_gid& gid() const { return gid_; }
  const VerbsLimits& limits() const { return limits_; }
  bool dmabuf_supported() const { return dmabuf_supported_; }
  const std::string& dmabuf_detail() const { return dmabuf_detail_; }
  bool peermem() const { return peermem_; }
  const std::string& peermem_detail() const { return peermem_detail_; }
  // One line for logs: device, port, link layer, GID, limits, registration paths.
  std::string summary() const;

 private:
  VerbsContext() = default;
  ibv_context* context_ = nullptr;
  ibv_pd* pd_ = nullptr;
  std::string name_;
  uint8_t port_ = 1;
  bool ethernet_ = false;
  uint16_t lid_ = 0;
  int gid_index_ = 0;
  ibv_gid gid_{};
  VerbsLimits limits_;
  bool dmabuf_supported_ = false;
  std::string dmabuf_detail_;
  bool peermem_ = false;
  std::string peermem_detail_;
};

}  // namespace hetmesh::detail
