// What an RDMA device offers, read from it or probed (see verbs_probe.hpp).
#include "verbs/verbs_probe.hpp"

#include <fmt/format.h>

#include <arpa/inet.h>
#include <dlfcn.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

namespace hetmesh::detail {
namespace {

// Queue depths the transport asks for; the device's max_qp_wr and max_cqe bound them.
constexpr uint32_t kWantedSendDepth = 1024;
constexpr uint32_t kWantedRecvDepth = 1024;
// Inline sizes tried, largest first, when probing what the provider accepts.
constexpr uint32_t kInlineProbes[] = {1024, 512, 256, 128, 64, 32, 0};
constexpr int kGidScanLimit = 256;  // ibv_query_gid fallback: entries looked at, at most

}  // namespace

OpenedDevice::OpenedDevice(ibv_device* device) : name_(ibv_get_device_name(device)) {
  ibv_context* context = ibv_open_device(device);
  if (context == nullptr) {
    error_ = fmt::format("cannot open: {}", std::strerror(errno));
    return;
  }
  if (ibv_query_device(context, &attr_) != 0) {
    error_ = fmt::format("ibv_query_device failed: {}", std::strerror(errno));
    ibv_close_device(context);
    return;
  }
  context_ = context;
}

OpenedDevice::~OpenedDevice() {
  if (context_ != nullptr) ibv_close_device(context_);
}

OpenedDevice::OpenedDevice(OpenedDevice&& other) noexcept
    : name_(std::move(other.name_)),
      context_(other.release()),
      attr_(other.attr_),
      error_(std::move(other.error_)) {}

ibv_context* OpenedDevice::release() {
  return std::exchange(context_, nullptr);
}

QueueDepths queue_depths(const ibv_device_attr& device) {
  auto max_qp_wr = static_cast<uint32_t>(device.max_qp_wr);
  auto max_cqe = static_cast<uint32_t>(device.max_cqe);
  return {std::min({kWantedSendDepth, max_qp_wr, max_cqe}),
          std::min({kWantedRecvDepth, max_qp_wr, max_cqe})};
}

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

ibv_qp_init_attr rc_qp_attributes(ibv_cq* send_cq, ibv_cq* recv_cq, uint32_t send_depth,
                                  uint32_t recv_depth, uint32_t max_inline) {
  ibv_qp_init_attr init{};
  init.send_cq = send_cq;
  init.recv_cq = recv_cq;
  init.qp_type = IBV_QPT_RC;
  init.cap.max_send_wr = send_depth;
  init.cap.max_recv_wr = recv_depth;
  init.cap.max_send_sge = 1;
  init.cap.max_recv_sge = 1;
  init.cap.max_inline_data = max_inline;
  return init;
}

int32_t probe_max_inline(ibv_context* context, ibv_pd* pd, uint32_t send_depth,
                         uint32_t recv_depth) {
  ibv_cq* cq = ibv_create_cq(context, static_cast<int>(std::max(send_depth, recv_depth)), nullptr,
                             nullptr, 0);
  if (cq == nullptr) return -1;
  int32_t granted = -1;
  for (uint32_t wanted : kInlineProbes) {
    ibv_qp_init_attr init = rc_qp_attributes(cq, cq, send_depth, recv_depth, wanted);
    ibv_qp* qp = ibv_create_qp(pd, &init);
    if (qp == nullptr) continue;
    granted = static_cast<int32_t>(init.cap.max_inline_data);  // what the provider granted
    ibv_destroy_qp(qp);
    break;
  }
  ibv_destroy_cq(cq);
  return granted;
}

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

}  // namespace hetmesh::detail
