#include "verbs_device.hpp"

#include <hetmesh/core/error.hpp>
#include <hetmesh/core/log.hpp>

#include <fmt/format.h>

#include <arpa/inet.h>
#include <dlfcn.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace hetmesh::detail {
namespace {

constexpr int kGidScanLimit = 256;  // ibv_query_gid fallback: entries looked at, at most

const char* port_state_name(ibv_port_state state) {
  switch (state) {
    case IBV_PORT_NOP:
      return "NOP";
    case IBV_PORT_DOWN:
      return "DOWN";
    case IBV_PORT_INIT:
      return "INIT";
    case IBV_PORT_ARMED:
      return "ARMED";
    case IBV_PORT_ACTIVE:
      return "ACTIVE";
    case IBV_PORT_ACTIVE_DEFER:
      return "ACTIVE_DEFER";
  }
  return "?";
}

bool is_ethernet(const ibv_port_attr& port) {
  return port.link_layer == IBV_LINK_LAYER_ETHERNET;
}

// The first IPv4-mapped GID of the port (RoCE v2 preferred), or -1.
// `ports` and `table_length` size the buffer for ibv_query_gid_table, which returns every port's.
int find_ipv4_gid(ibv_context* context, uint8_t port, uint8_t ports, int table_length,
                  ibv_gid* out) {
  std::vector<ibv_gid_entry> entries(static_cast<size_t>(std::max(table_length, 1)) *
                                     std::max<uint8_t>(ports, 1));
  ssize_t n = ibv_query_gid_table(context, entries.data(), entries.size(), 0);
  if (n >= 0) {
    int fallback = -1;
    for (ssize_t i = 0; i < n; ++i) {
      const ibv_gid_entry& e = entries[static_cast<size_t>(i)];
      // sgid_index in an address handle is 8 bits wide.
      if (e.port_num != port || e.gid_index > UINT8_MAX || !gid_is_ipv4_mapped(e.gid)) continue;
      if (e.gid_type == IBV_GID_TYPE_ROCE_V2) {
        std::memcpy(out, &e.gid, sizeof *out);
        return static_cast<int>(e.gid_index);
      }
      if (fallback < 0) {
        fallback = static_cast<int>(e.gid_index);
        std::memcpy(out, &e.gid, sizeof *out);
      }
    }
    return fallback;
  }
  // Older kernels: read the table entry by entry.
  for (int i = 0; i < std::min(table_length, kGidScanLimit); ++i) {
    ibv_gid gid{};
    if (ibv_query_gid(context, port, i, &gid) == 0 && gid_is_ipv4_mapped(gid)) {
      *out = gid;
      return i;
    }
  }
  return -1;
}

// Creates and destroys an RC QP with each inline size in turn; returns what the provider granted
// for the first it accepted, or -1 if it accepted none.
int32_t probe_max_inline(ibv_context* context, ibv_pd* pd, uint32_t send_depth,
                         uint32_t recv_depth) {
  ibv_cq* cq = ibv_create_cq(context, static_cast<int>(std::max(send_depth, recv_depth)), nullptr,
                             nullptr, 0);
  if (cq == nullptr) return -1;
  int32_t granted = -1;
  for (uint32_t wanted : kInlineProbes) {
    ibv_qp_init_attr init{};
    init.send_cq = cq;
    init.recv_cq = cq;
    init.qp_type = IBV_QPT_RC;
    init.cap.max_send_wr = send_depth;
    init.cap.max_recv_wr = recv_depth;
    init.cap.max_send_sge = 1;
    init.cap.max_recv_sge = 1;
    init.cap.max_inline_data = wanted;
    ibv_qp* qp = ibv_create_qp(pd, &init);
    if (qp == nullptr) continue;
    granted = static_cast<int32_t>(init.cap.max_inline_data);  // what the provider granted
    ibv_destroy_qp(qp);
    break;
  }
  ibv_destroy_cq(cq);
  return granted;
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

}  // namespace

RegDmabufMrFn reg_dmabuf_mr_function() {
  static const RegDmabufMrFn fn = [] {
    void* symbol = nullptr;
    // libibverbs is linked in, so RTLD_NOLOAD finds it even if we were dlopen'ed RTLD_LOCAL.
    if (void* library = dlopen("libibverbs.so.1", RTLD_LAZY | RTLD_NOLOAD)) {
      symbol = dlvsym(library, "ibv_reg_dmabuf_mr", "IBVERBS_1.12");
      if (symbol == nullptr) symbol = dlsym(library, "ibv_reg_dmabuf_mr");
      dlclose(library);  // drops the reference NOLOAD took; the library stays loaded
    }
    if (symbol == nullptr) symbol = dlvsym(RTLD_DEFAULT, "ibv_reg_dmabuf_mr", "IBVERBS_1.12");
    return reinterpret_cast<RegDmabufMrFn>(symbol);
  }();
  return fn;
}

bool probe_dmabuf(ibv_pd* pd, std::string* detail) {
  RegDmabufMrFn reg = reg_dmabuf_mr_function();
  if (reg == nullptr) {
    *detail = "libibverbs lacks ibv_reg_dmabuf_mr (rdma-core < 34)";
    return false;
  }
  errno = 0;
  ibv_mr* mr = reg(pd, 0, 4096, 0, -1, IBV_ACCESS_LOCAL_WRITE);
  int err = errno;
  if (mr != nullptr) {
    ibv_dereg_mr(mr);
    *detail = "ibv_reg_dmabuf_mr accepted fd -1; not trusted";
    return false;
  }
  if (err == EBADF) {
    *detail = "ibv_reg_dmabuf_mr probe: EBADF for fd -1, so dma-buf MRs are supported";
    return true;
  }
  *detail = fmt::format("ibv_reg_dmabuf_mr probe with fd -1: {} (errno {}), not EBADF",
                        std::strerror(err), err);
  return false;
}

bool peermem_present() {
  struct stat st {};
  return stat("/sys/module/nvidia_peermem", &st) == 0;
}

uint32_t mtu_bytes(ibv_mtu mtu) {
  switch (mtu) {
    case IBV_MTU_256:
      return 256;
    case IBV_MTU_512:
      return 512;
    case IBV_MTU_1024:
      return 1024;
    case IBV_MTU_2048:
      return 2048;
    case IBV_MTU_4096:
      return 4096;
  }
  return 0;
}

std::string gid_text(const ibv_gid& gid) {
  char text[INET6_ADDRSTRLEN] = {};
  inet_ntop(AF_INET6, gid.raw, text, sizeof text);
  return text;
}

bool gid_is_ipv4_mapped(const ibv_gid& gid) {
  static const uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  return std::memcmp(gid.raw, prefix, sizeof prefix) == 0;
}

std::shared_ptr<VerbsContext> VerbsContext::open(const TransportOptions& options) {
  DeviceList list;
  if (list.devices == nullptr) {
    int err = errno;
    throw Error(HM_ERR_NOT_SUPPORTED,
                err == ENOSYS
                    ? std::string("verbs: no RDMA device (ibv_get_device_list found none: "
                                  "this kernel has no RDMA support, ENOSYS)")
                    : fmt::format("verbs: no RDMA device (ibv_get_device_list failed: {})",
                                  std::strerror(err)));
  }
  if (list.count == 0)
    throw Error(HM_ERR_NOT_SUPPORTED, "verbs: no RDMA device (ibv_get_device_list found none)");

  std::vector<std::string> seen;  // "rxe0 port 1: DOWN", for the error message
  std::shared_ptr<VerbsContext> self(new VerbsContext());
  for (int i = 0; i < list.count && self->context_ == nullptr; ++i) {
    std::string name = ibv_get_device_name(list.devices[i]);
    if (!options.rdma_device.empty() && name != options.rdma_device) {
      seen.push_back(name);
      continue;
    }
    ibv_context* context = ibv_open_device(list.devices[i]);
    if (context == nullptr) {
      seen.push_back(fmt::format("{}: cannot open ({})", name, std::strerror(errno)));
      continue;
    }
    ibv_device_attr device{};
    if (ibv_query_device(context, &device) != 0) {
      seen.push_back(fmt::format("{}: ibv_query_device failed ({})", name, std::strerror(errno)));
      ibv_close_device(context);
      continue;
    }
    for (uint8_t port = 1; port <= device.phys_port_cnt; ++port) {
      ibv_port_attr attr{};
      if (ibv_query_port(context, port, &attr) != 0) {
        seen.push_back(fmt::format("{} port {}: ibv_query_port failed", name, port));
        continue;
      }
      if (attr.state != IBV_PORT_ACTIVE) {
        seen.push_back(fmt::format("{} port {}: {}", name, port, port_state_name(attr.state)));
        continue;
      }
      self->context_ = context;
      self->name_ = name;
      self->port_ = port;
      self->ethernet_ = is_ethernet(attr);
      self->lid_ = attr.lid;
      VerbsLimits& l = self->limits_;
      l.max_qp_wr = static_cast<uint32_t>(device.max_qp_wr);
      l.max_sge = static_cast<uint32_t>(device.max_sge);
      l.max_cqe = static_cast<uint32_t>(device.max_cqe);
      l.max_mr_size = device.max_mr_size;
      l.max_msg_sz = attr.max_msg_sz;
      l.active_mtu = attr.active_mtu;
      l.send_depth = std::min({kWantedSendDepth, l.max_qp_wr, l.max_cqe});
      l.recv_depth = std::min({kWantedRecvDepth, l.max_qp_wr, l.max_cqe});
      if (options.gid_index >= 0) {
        if (options.gid_index >= attr.gid_tbl_len || options.gid_index > UINT8_MAX)
          throw Error(HM_ERR_INVALID_ARGUMENT,
                      fmt::format("verbs: GID index {} is outside {} port {}'s table of {} (or "
                                  "above 255)",
                                  options.gid_index, name, port, attr.gid_tbl_len));
        if (ibv_query_gid(context, port, options.gid_index, &self->gid_) != 0)
          throw Error(HM_ERR_INVALID_ARGUMENT,
                      fmt::format("verbs: cannot read GID {} of {} port {}: {}", options.gid_index,
                                  name, port, std::strerror(errno)));
        self->gid_index_ = options.gid_index;
      } else {
        self->gid_index_ =
            find_ipv4_gid(context, port, device.phys_port_cnt, attr.gid_tbl_len, &self->gid_);
        if (self->gid_index_ < 0) {
          // InfiniBand routes by LID and needs no GRH; RoCE without an IPv4 GID takes index 0
          // (link-local), which works within one L2 segment.
          self->gid_index_ = 0;
          ibv_query_gid(context, port, 0, &self->gid_);
          if (self->ethernet_)
            log(LogLevel::warn, "verbs: {} port {} has no IPv4-mapped GID; using GID 0 ({})", name,
                port, gid_text(self->gid_));
        }
      }
      break;
    }
    if (self->context_ == nullptr) ibv_close_device(context);
  }
  if (self->context_ == nullptr) {
    std::string found = fmt::format("{}", fmt::join(seen, "; "));
    if (!options.rdma_device.empty())
      throw Error(HM_ERR_NOT_SUPPORTED,
                  fmt::format("verbs: RDMA device '{}' has no ACTIVE port or does not exist "
                              "(found: {})",
                              options.rdma_device, found));
    throw Error(HM_ERR_NOT_SUPPORTED,
                fmt::format("verbs: no RDMA device with an ACTIVE port (found: {})", found));
  }

  self->pd_ = ibv_alloc_pd(self->context_);
  if (self->pd_ == nullptr)
    throw Error(HM_ERR_BACKEND, fmt::format("verbs: ibv_alloc_pd on {} failed: {}", self->name_,
                                            std::strerror(errno)));
  VerbsLimits& l = self->limits_;
  if (uint32_t cap = env_max_msg(); cap != 0 && cap < l.max_msg_sz) {
    log(LogLevel::info, "verbs: HETMESH_VERBS_MAX_MSG lowers the message size from {} to {}",
        l.max_msg_sz, cap);
    l.max_msg_sz = cap;
  }
  if (l.max_msg_sz == 0) l.max_msg_sz = 1u << 30;  // a provider that reports none: 1 GiB
  int32_t inline_size = probe_max_inline(self->context_, self->pd_, l.send_depth, l.recv_depth);
  if (inline_size < 0)
    throw Error(HM_ERR_BACKEND,
                fmt::format("verbs: {} refuses an RC QP of depth {}/{} with one SGE: {}",
                            self->name_, l.send_depth, l.recv_depth, std::strerror(errno)));
  l.max_inline = static_cast<uint32_t>(inline_size);
  self->dmabuf_supported_ = probe_dmabuf(self->pd_, &self->dmabuf_detail_);
  self->peermem_ = peermem_present();
  self->peermem_detail_ =
      self->peermem_ ? "/sys/module/nvidia_peermem exists" : "/sys/module/nvidia_peermem absent";
  // Knobs that walk the registration fallback order on any machine (the fallback tests): switch
  // the dma-buf or peermem step off, or pretend nvidia_peermem is loaded so that ibv_reg_mr on
  // device memory is tried (and fails where no peer-memory client backs it).
  auto knob = [](const char* name) {
    const char* value = std::getenv(name);
    return value != nullptr && *value != '\0' && *value != '0';
  };
  if (knob("HETMESH_VERBS_DISABLE_DMABUF")) {
    self->dmabuf_supported_ = false;
    self->dmabuf_detail_ += "; disabled by HETMESH_VERBS_DISABLE_DMABUF";
  }
  if (knob("HETMESH_VERBS_ASSUME_PEERMEM")) {
    self->peermem_ = true;
    self->peermem_detail_ += "; assumed loaded by HETMESH_VERBS_ASSUME_PEERMEM";
  }
  if (knob("HETMESH_VERBS_DISABLE_PEERMEM")) {
    self->peermem_ = false;
    self->peermem_detail_ += "; disabled by HETMESH_VERBS_DISABLE_PEERMEM";
  }
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
      dmabuf_supported_ ? "supported" : "unsupported", dmabuf_detail_,
      peermem_ ? "usable" : "unusable", peermem_detail_);
}

}  // namespace hetmesh::detail

namespace hetmesh {

std::vector<RdmaDeviceInfo> list_rdma_devices() {
  using namespace detail;
  std::vector<RdmaDeviceInfo> out;
  DeviceList list;
  if (list.devices == nullptr) return out;
  bool peermem = peermem_present();
  for (int i = 0; i < list.count; ++i) {
    std::string name = ibv_get_device_name(list.devices[i]);
    ibv_context* context = ibv_open_device(list.devices[i]);
    if (context == nullptr) {
      RdmaDeviceInfo info;
      info.name = name;
      info.error = fmt::format("cannot open: {}", std::strerror(errno));
      out.push_back(std::move(info));
      continue;
    }
    ibv_device_attr device{};
    if (ibv_query_device(context, &device) != 0) {
      RdmaDeviceInfo info;
      info.name = name;
      info.error = fmt::format("ibv_query_device failed: {}", std::strerror(errno));
      out.push_back(std::move(info));
      ibv_close_device(context);
      continue;
    }
    ibv_pd* pd = ibv_alloc_pd(context);
    std::string dmabuf_detail = "no protection domain";
    bool dmabuf = pd != nullptr && probe_dmabuf(pd, &dmabuf_detail);
    uint32_t send_depth = std::min({kWantedSendDepth, static_cast<uint32_t>(device.max_qp_wr),
                                    static_cast<uint32_t>(device.max_cqe)});
    uint32_t recv_depth = std::min({kWantedRecvDepth, static_cast<uint32_t>(device.max_qp_wr),
                                    static_cast<uint32_t>(device.max_cqe)});
    int32_t max_inline = pd != nullptr ? probe_max_inline(context, pd, send_depth, recv_depth) : -1;
    for (uint8_t port = 1; port <= device.phys_port_cnt; ++port) {
      RdmaDeviceInfo info;
      info.name = name;
      info.port = port;
      info.max_qp_wr = static_cast<uint32_t>(device.max_qp_wr);
      info.max_sge = static_cast<uint32_t>(device.max_sge);
      info.max_mr_size = device.max_mr_size;
      info.max_inline = max_inline;
      info.dmabuf_supported = dmabuf;
      info.dmabuf_detail = dmabuf_detail;
      info.peermem_present = peermem;
      ibv_port_attr attr{};
      if (ibv_query_port(context, port, &attr) != 0) {
        info.error = fmt::format("ibv_query_port failed: {}", std::strerror(errno));
      } else {
        info.port_state = port_state_name(attr.state);
        info.link_layer = is_ethernet(attr) ? "Ethernet" : "InfiniBand";
        info.active_mtu = mtu_bytes(attr.active_mtu);
        info.lid = attr.lid;
        info.max_msg_sz = attr.max_msg_sz;
        ibv_gid gid{};
        info.gid_index = find_ipv4_gid(context, port, device.phys_port_cnt, attr.gid_tbl_len, &gid);
        if (info.gid_index >= 0) info.gid = gid_text(gid);
      }
      out.push_back(std::move(info));
    }
    if (pd != nullptr) ibv_dealloc_pd(pd);
    ibv_close_device(context);
  }
  return out;
}

}  // namespace hetmesh
