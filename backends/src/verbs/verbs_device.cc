// VerbsContext: opening the device port a verbs transport uses, and the limits and registration
// paths it finds there (verbs_device.hpp). The queries and probes themselves are verbs_probe.cc's.
#include "verbs/verbs_device.hpp"

#include <hetmesh/core/error.hpp>
#include <hetmesh/core/log.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace hetmesh::detail {
namespace {

// The device port open() settled on: its device, opened and queried, and the port's attributes.
struct ActivePort {
  OpenedDevice device;
  uint8_t number = 0;
  ibv_port_attr attr{};
};

Error device_list_error(int err) {
  return Error(HM_ERR_NOT_SUPPORTED,
               err == ENOSYS ? std::string("verbs: no RDMA device (ibv_get_device_list found none: "
                                           "this kernel has no RDMA support, ENOSYS)")
                             : fmt::format("verbs: no RDMA device (ibv_get_device_list failed: {})",
                                           std::strerror(err)));
}

Error no_active_port_error(const std::string& wanted, const std::vector<std::string>& seen) {
  std::string found = fmt::format("{}", fmt::join(seen, "; "));
  if (!wanted.empty())
    return Error(HM_ERR_NOT_SUPPORTED,
                 fmt::format("verbs: RDMA device '{}' has no ACTIVE port or does not exist "
                             "(found: {})",
                             wanted, found));
  return Error(HM_ERR_NOT_SUPPORTED,
               fmt::format("verbs: no RDMA device with an ACTIVE port (found: {})", found));
}

// The first ACTIVE port of device `wanted`, or of the first device that has one if `wanted` is
// empty. Throws Error(HM_ERR_NOT_SUPPORTED) listing every device and port passed over, and why.
ActivePort find_active_port(const std::string& wanted) {
  DeviceList list;
  if (list.devices == nullptr) throw device_list_error(errno);
  if (list.count == 0)
    throw Error(HM_ERR_NOT_SUPPORTED, "verbs: no RDMA device (ibv_get_device_list found none)");
  std::vector<std::string> seen;  // "rxe0 port 1: DOWN", for the error message
  for (int i = 0; i < list.count; ++i) {
    std::string name = ibv_get_device_name(list.devices[i]);
    if (!wanted.empty() && name != wanted) {
      seen.push_back(name);
      continue;
    }
    ActivePort port{OpenedDevice(list.devices[i])};
    if (port.device.context() == nullptr) {
      seen.push_back(fmt::format("{}: {}", name, port.device.error()));
      continue;
    }
    for (uint8_t number = 1; number <= port.device.attr().phys_port_cnt; ++number) {
      if (ibv_query_port(port.device.context(), number, &port.attr) != 0) {
        seen.push_back(fmt::format("{} port {}: ibv_query_port failed", name, number));
        continue;
      }
      if (port.attr.state == IBV_PORT_ACTIVE) {
        port.number = number;
        return port;
      }
      seen.push_back(fmt::format("{} port {}: {}", name, number, port_state_name(port.attr.state)));
    }
  }
  throw no_active_port_error(wanted, seen);
}

// The GID index the port is addressed by, its GID into *gid: `wanted` if given (>= 0), else the
// first IPv4-mapped one, else 0. Throws Error(HM_ERR_INVALID_ARGUMENT) if `wanted` is unusable.
int choose_gid(const ActivePort& port, int wanted, ibv_gid* gid) {
  const std::string& name = port.device.name();
  ibv_context* context = port.device.context();
  if (wanted >= 0) {
    if (wanted >= port.attr.gid_tbl_len || wanted > UINT8_MAX)
      throw Error(HM_ERR_INVALID_ARGUMENT,
                  fmt::format("verbs: GID index {} is outside {} port {}'s table of {} (or "
                              "above 255)",
                              wanted, name, port.number, port.attr.gid_tbl_len));
    if (ibv_query_gid(context, port.number, wanted, gid) != 0)
      throw Error(HM_ERR_INVALID_ARGUMENT,
                  fmt::format("verbs: cannot read GID {} of {} port {}: {}", wanted, name,
                              port.number, std::strerror(errno)));
    return wanted;
  }
  int index = find_ipv4_gid(context, port.number, port.device.attr().phys_port_cnt,
                            port.attr.gid_tbl_len, gid);
  if (index >= 0) return index;
  // InfiniBand routes by LID and needs no GRH; RoCE without an IPv4 GID takes index 0
  // (link-local), which works within one L2 segment.
  ibv_query_gid(context, port.number, 0, gid);
  if (is_ethernet(port.attr))
    log(LogLevel::warn, "verbs: {} port {} has no IPv4-mapped GID; using GID 0 ({})", name,
        port.number, gid_text(*gid));
  return 0;
}

// The limits ibv_query_device and ibv_query_port report, and the queue depths within them.
VerbsLimits limits_of(const ibv_device_attr& device, const ibv_port_attr& port) {
  VerbsLimits l;
  l.max_qp_wr = static_cast<uint32_t>(device.max_qp_wr);
  l.max_sge = static_cast<uint32_t>(device.max_sge);
  l.max_cqe = static_cast<uint32_t>(device.max_cqe);
  l.max_mr_size = device.max_mr_size;
  l.max_msg_sz = port.max_msg_sz;
  l.active_mtu = port.active_mtu;
  QueueDepths depths = queue_depths(device);
  l.send_depth = depths.send;
  l.recv_depth = depths.recv;
  return l;
}

uint32_t env_max_msg() {
  const char* text = std::getenv("HETMESH_VERBS_MAX_MSG");
  if (text == nullptr || *text == '\0') return 0;
  char* end = nullptr;
  unsigned long long value = std::strtoull(text, &end, 0);
  if (end == text || *end != '\0' || value == 0 || value > UINT32_MAX) {
    log(LogLevel::warn, "verbs: ignoring HETMESH_VERBS_MAX_MSG='{}' (want 1..{})", text,
        UINT32_MAX);
    return 0;
  }
  return static_cast<uint32_t>(value);
}

// The largest message one work request carries: the port's, lowered by HETMESH_VERBS_MAX_MSG
// (tests), 1 GiB where the provider reports none.
uint32_t message_size_limit(uint32_t port_max) {
  if (uint32_t cap = env_max_msg(); cap != 0 && cap < port_max) {
    log(LogLevel::info, "verbs: HETMESH_VERBS_MAX_MSG lowers the message size from {} to {}",
        port_max, cap);
    port_max = cap;
  }
  return port_max != 0 ? port_max : 1u << 30;
}

// The inline size an RC QP of the transport's depths is granted. Throws Error(HM_ERR_BACKEND) if
// the device refuses such a QP outright.
uint32_t inline_limit(ibv_context* context, ibv_pd* pd, const std::string& name,
                      const VerbsLimits& l) {
  int32_t inline_size = probe_max_inline(context, pd, l.send_depth, l.recv_depth);
  if (inline_size < 0)
    throw Error(HM_ERR_BACKEND,
                fmt::format("verbs: {} refuses an RC QP of depth {}/{} with one SGE: {}", name,
                            l.send_depth, l.recv_depth, std::strerror(errno)));
  return static_cast<uint32_t>(inline_size);
}

bool knob(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' && *value != '0';
}

// What the dma-buf probe and /sys/module say, then the knobs that walk the registration fallback
// order on any machine (the fallback tests): switch the dma-buf or peermem step off, or pretend
// nvidia_peermem is loaded so that ibv_reg_mr on device memory is tried (and fails where no
// peer-memory client backs it).
RegistrationSupport registration_support(ibv_pd* pd) {
  RegistrationSupport r;
  r.dmabuf = probe_dmabuf(pd, &r.dmabuf_detail);
  r.peermem = peermem_present();
  r.peermem_detail =
      r.peermem ? "/sys/module/nvidia_peermem exists" : "/sys/module/nvidia_peermem absent";
  if (knob("HETMESH_VERBS_DISABLE_DMABUF")) {
    r.dmabuf = false;
    r.dmabuf_detail += "; disabled by HETMESH_VERBS_DISABLE_DMABUF";
  }
  if (knob("HETMESH_VERBS_ASSUME_PEERMEM")) {
    r.peermem = true;
    r.peermem_detail += "; assumed loaded by HETMESH_VERBS_ASSUME_PEERMEM";
  }
  if (knob("HETMESH_VERBS_DISABLE_PEERMEM")) {
    r.peermem = false;
    r.peermem_detail += "; disabled by HETMESH_VERBS_DISABLE_PEERMEM";
  }
  return r;
}

}  // namespace

std::shared_ptr<VerbsContext> VerbsContext::open(const TransportOptions& options) {
  std::shared_ptr<VerbsContext> self(new VerbsContext());
  ActivePort port = find_active_port(options.rdma_device);
  self->name_ = port.device.name();
  self->port_ = port.number;
  self->ethernet_ = is_ethernet(port.attr);
  self->lid_ = port.attr.lid;
  self->limits_ = limits_of(port.device.attr(), port.attr);
  self->gid_index_ = choose_gid(port, options.gid_index, &self->gid_);
  self->context_ = port.device.release();  // closed by ~VerbsContext from here on

  self->pd_ = ibv_alloc_pd(self->context_);
  if (self->pd_ == nullptr)
    throw Error(HM_ERR_BACKEND, fmt::format("verbs: ibv_alloc_pd on {} failed: {}", self->name_,
                                            std::strerror(errno)));
  VerbsLimits& l = self->limits_;
  l.max_msg_sz = message_size_limit(l.max_msg_sz);
  l.max_inline = inline_limit(self->context_, self->pd_, self->name_, l);
  self->registration_ = registration_support(self->pd_);
  log(LogLevel::info, "verbs: {}", self->summary());
  return self;
}

VerbsContext::~VerbsContext() {
  if (pd_ != nullptr && ibv_dealloc_pd(pd_) != 0)
    log(LogLevel::warn, "verbs: ibv_dealloc_pd on {} failed: {}", name_, std::strerror(errno));
  if (context_ != nullptr) ibv_close_device(context_);
}

std::string VerbsContext::summary() const {
  const VerbsLimits& l = limits_;
  return fmt::format(
      "{} port {} ({}, {} {}, MTU {}); max_qp_wr {}, max_sge {}, max_inline {}, max_mr_size {:#x}, "
      "max_msg_sz {}, queue depths {}/{}; dma-buf: {} ({}); peermem: {} ({})",
      name_, port_, ethernet_ ? "Ethernet/RoCE" : "InfiniBand",
      ethernet_ ? "GID" : fmt::format("LID {}, GID", lid_),
      fmt::format("{} {}", gid_index_, gid_text(gid_)), mtu_bytes(l.active_mtu), l.max_qp_wr,
      l.max_sge, l.max_inline, l.max_mr_size, l.max_msg_sz, l.send_depth, l.recv_depth,
      registration_.dmabuf ? "supported" : "unsupported", registration_.dmabuf_detail,
      registration_.peermem ? "usable" : "unusable", registration_.peermem_detail);
}

}  // namespace hetmesh::detail
