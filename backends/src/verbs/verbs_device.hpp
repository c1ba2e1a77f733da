// The verbs transport's view of one RDMA device port: the opened context and protection domain,
// the GID and LID it is addressed by, and every provider limit the transport obeys, read from
// ibv_query_device / ibv_query_port and probes, never assumed.
#pragma once

#include "verbs/verbs_probe.hpp"

#include <hetmesh/transport/transport.hpp>

#include <infiniband/verbs.h>

#include <cstdint>
#include <memory>
#include <string>

namespace hetmesh::detail {

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

// Which registration paths for device memory the device offers, and why (for logs and errors).
struct RegistrationSupport {
  bool dmabuf = false;
  std::string dmabuf_detail;
  bool peermem = false;
  std::string peermem_detail;
};

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
  bool dmabuf_supported() const { return registration_.dmabuf; }
  const std::string& dmabuf_detail() const { return registration_.dmabuf_detail; }
  bool peermem() const { return registration_.peermem; }
  const std::string& peermem_detail() const { return registration_.peermem_detail; }
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
  RegistrationSupport registration_;
};

}  // namespace hetmesh::detail
