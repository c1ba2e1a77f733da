// A verbs connection's setup and teardown: the queue pair, its handshake over the out-of-band
// socket (QpInfo, then INIT, RTR, RTS and a barrier), closing, and failing.
#include "verbs/verbs_link.hpp"

#include <hetmesh/core/log.hpp>
#include <hetmesh/core/socket.hpp>
#include <hetmesh/core/thread.hpp>

#include <fmt/format.h>

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <random>

namespace hetmesh::detail {
namespace {

// QP timers. The local ACK timeout is 4.096 us * 2^kQpTimeout (268 ms) and is retried kRetryCount
// times, so a write to a dead peer fails within about two seconds. The retry count is 6, not the
// spec's maximum of 7: soft-RoCE (rxe) reads retry_cnt 7 as "retry forever", like rnr_retry 7,
// and a dead peer would then never fail. RNR retries are unbounded: receivers repost at once, and
// a dead peer is caught by the retry count and the socket.
constexpr uint8_t kQpTimeout = 16;
constexpr uint8_t kRetryCount = 6;
constexpr uint8_t kRnrRetry = 7;
constexpr uint8_t kMinRnrTimer = 12;  // 0.64 ms

// TCP keepalive on the out-of-band socket, so a peer host that vanishes without a FIN is noticed
// within about ten seconds. Unix sockets ignore this.
void keep_alive(int fd) {
  int on = 1, idle = 5, interval = 1, count = 5;
  unsigned int user_timeout_ms = 10000;
  if (setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof on) != 0) return;
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof interval);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof count);
  setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout_ms, sizeof user_timeout_ms);
}

}  // namespace

LocalBuffer::~LocalBuffer() {
  if (mr_ != nullptr) ibv_dereg_mr(mr_);
  std::free(data_);
}

void LocalBuffer::allocate(ibv_pd* pd, size_t size, const char* what) {
  if (posix_memalign(&data_, static_cast<size_t>(sysconf(_SC_PAGESIZE)), size) != 0)
    throw Error(HM_ERR_OUT_OF_MEMORY, fmt::format("verbs: no memory for {}", what));
  std::memset(data_, 0, size);
  mr_ = ibv_reg_mr(pd, data_, size, int{IBV_ACCESS_LOCAL_WRITE});
  if (mr_ == nullptr)
    throw Error(HM_ERR_BACKEND,
                fmt::format("verbs: ibv_reg_mr of {} failed: {}", what, std::strerror(errno)));
}

VerbsLink::VerbsLink(ConnectionId id, std::shared_ptr<VerbsShared> shared, std::string peer_id,
                     Fd socket)
    : id_(id),
      shared_(std::move(shared)),
      peer_id_(std::move(peer_id)),
      socket_(std::move(socket)) {}

VerbsLink::~VerbsLink() {
  if (receiver_.joinable()) {
    closing_ = true;
    socket_.shutdown();
    receiver_.join();
  }
  if (qp_ != nullptr && ibv_destroy_qp(qp_) != 0)
    log(LogLevel::warn, "verbs: ibv_destroy_qp failed: {}", std::strerror(errno));
  for (ibv_cq* cq : {send_cq_, recv_cq_})
    if (cq != nullptr && ibv_destroy_cq(cq) != 0)
      log(LogLevel::warn, "verbs: ibv_destroy_cq failed: {}", std::strerror(errno));
}

void VerbsLink::setup(Clock::time_point deadline) {
  create_queue_pair();
  to_init();
  QpInfo mine = local_qp_info();
  QpInfo peer = swap_qp_info(mine, deadline);
  ibv_mtu path_mtu = to_rtr(mine, peer);
  to_rts(mine.psn);
  // Neither side writes before the other's QP is ready to receive.
  uint8_t ready = 'R', peer_ready = 0;
  send_all(socket_.get(), &ready, 1, "ready");
  net::recv_all(socket_.get(), &peer_ready, 1, "the verbs peer's ready byte", deadline);
  keep_alive(socket_.get());
  log(LogLevel::info,
      "verbs: connection {} to {}: QP {} <-> {}, MTU {}, depth {}/{}, inline {}, max message {}",
      id_, peer_id_, mine.qpn, peer.qpn, mtu_bytes(path_mtu), send_depth_, recv_depth_, max_inline_,
      max_chunk_);
}

void VerbsLink::create_queue_pair() {
  const VerbsContext& verbs = *shared_->context;
  const VerbsLimits& limits = verbs.limits();
  send_depth_ = limits.send_depth;
  recv_depth_ = limits.recv_depth;
  max_inline_ = limits.max_inline;
  max_chunk_ = limits.max_msg_sz;
  send_cq_ =
      ibv_create_cq(verbs.context(), static_cast<int>(send_depth_), this, shared_->channel, 0);
  recv_cq_ =
      ibv_create_cq(verbs.context(), static_cast<int>(recv_depth_), this, shared_->channel, 0);
  if (send_cq_ == nullptr || recv_cq_ == nullptr)
    throw Error(HM_ERR_BACKEND,
                fmt::format("verbs: ibv_create_cq failed: {}", std::strerror(errno)));
  ibv_qp_init_attr init =
      rc_qp_attributes(send_cq_, recv_cq_, send_depth_, recv_depth_, max_inline_);
  qp_ = ibv_create_qp(verbs.pd(), &init);
  if (qp_ == nullptr)
    throw Error(HM_ERR_BACKEND,
                fmt::format("verbs: ibv_create_qp (RC, depth {}/{}, inline {}) failed: {}",
                            send_depth_, recv_depth_, max_inline_, std::strerror(errno)));
  max_inline_ = std::min(max_inline_, init.cap.max_inline_data);
  recv_slots_.allocate(verbs.pd(), size_t{recv_depth_} * kSlotBytes, "receive slots");
  send_slots_.allocate(verbs.pd(), size_t{send_depth_} * kSlotBytes, "send slots");
  wrs_.resize(send_depth_);
  sges_.resize(send_depth_);
}

void VerbsLink::to_init() {
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_INIT;
  attr.pkey_index = 0;
  attr.port_num = shared_->context->port();
  attr.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
  modify(attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, "INIT");
  for (uint32_t slot = 0; slot < recv_depth_; ++slot)
    if (int rc = post_recv(slot); rc != 0)
      throw Error(HM_ERR_BACKEND,
                  fmt::format("verbs: ibv_post_recv failed: {}", std::strerror(rc)));
}

QpInfo VerbsLink::local_qp_info() const {
  const VerbsContext& verbs = *shared_->context;
  std::random_device entropy;
  QpInfo mine{};
  mine.magic = kQpInfoMagic;
  mine.version = kQpInfoVersion;
  mine.ethernet = verbs.ethernet();
  mine.mtu = static_cast<uint8_t>(verbs.limits().active_mtu);
  mine.qpn = qp_->qp_num;
  mine.psn = entropy() & 0xffffff;
  mine.lid = verbs.lid();
  mine.recv_depth = recv_depth_;
  std::memcpy(mine.gid, verbs.gid().raw, sizeof mine.gid);
  return mine;
}

QpInfo VerbsLink::swap_qp_info(const QpInfo& mine, Clock::time_point deadline) {
  send_all(socket_.get(), &mine, sizeof mine, "QP info");
  QpInfo peer{};
  net::recv_all(socket_.get(), &peer, sizeof peer, "the verbs peer's QP info", deadline);
  if (peer.magic != kQpInfoMagic || peer.version != kQpInfoVersion)
    throw Error(kStatusProtocolError,
                fmt::format("verbs: peer {} sent bad QP info (magic {:08x}, version {})", peer_id_,
                            peer.magic, peer.version));
  if (peer.ethernet != mine.ethernet)
    throw Error(HM_ERR_NOT_SUPPORTED,
                fmt::format("verbs: peer {} is on {}, this side on {}", peer_id_,
                            peer.ethernet ? "Ethernet" : "InfiniBand",
                            mine.ethernet ? "Ethernet" : "InfiniBand"));
  return peer;
}

ibv_mtu VerbsLink::to_rtr(const QpInfo& mine, const QpInfo& peer) {
  const VerbsContext& verbs = *shared_->context;
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_RTR;
  auto path_mtu = static_cast<ibv_mtu>(std::min(mine.mtu, peer.mtu));
  attr.path_mtu = path_mtu;
  attr.dest_qp_num = peer.qpn;
  attr.rq_psn = peer.psn;
  attr.max_dest_rd_atomic = 1;
  attr.min_rnr_timer = kMinRnrTimer;
  attr.ah_attr.dlid = peer.lid;
  attr.ah_attr.sl = 0;
  attr.ah_attr.src_path_bits = 0;
  attr.ah_attr.port_num = verbs.port();
  // RoCE always needs the GRH; InfiniBand only when there is no LID to route by.
  if (verbs.ethernet() || peer.lid == 0) {
    attr.ah_attr.is_global = 1;
    std::memcpy(attr.ah_attr.grh.dgid.raw, peer.gid, sizeof peer.gid);
    attr.ah_attr.grh.sgid_index = static_cast<uint8_t>(verbs.gid_index());
    attr.ah_attr.grh.hop_limit = 64;
  }
  modify(attr,
         IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
             IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER,
         "RTR");
  return path_mtu;
}

void VerbsLink::to_rts(uint32_t psn) {
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_RTS;
  attr.timeout = kQpTimeout;
  attr.retry_cnt = kRetryCount;
  attr.rnr_retry = kRnrRetry;
  attr.sq_psn = psn;
  attr.max_rd_atomic = 1;
  modify(attr,
         IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
             IBV_QP_MAX_QP_RD_ATOMIC,
         "RTS");
}

void VerbsLink::start() {
  receiver_ = start_thread("hm-verbs-recv", [this] { receive(); });
}

void VerbsLink::close() {
  closing_ = true;
  socket_.shutdown();
  if (receiver_.joinable()) receiver_.join();
  {
    std::lock_guard lock(mutex_);
    closed_ = true;
    alive_ = false;
    if (!failed_) to_error();
    failed_ = true;
    std::string why = fmt::format("verbs: connection {} to {} was closed with the write in flight",
                                  id_, peer_id_);
    for (const Pending& p : posted_)
      if (p.last) done_locked(p.cookie, kStatusPeerLost, why);
    for (const SendOp& op : waiting_)
      if (op.last) done_locked(op.cookie, kStatusPeerLost, why);
    posted_.clear();
    waiting_.clear();
  }
  shared_->remove_link(this);
}

void VerbsLink::fail(const std::string& reason) {
  std::lock_guard lock(mutex_);
  fail_locked(reason);
}

void VerbsLink::fail_locked(const std::string& reason) {
  if (failed_) return;
  failed_ = true;
  alive_ = false;
  first_error_ = reason;
  to_error();
  for (const SendOp& op : waiting_)
    if (op.last) done_locked(op.cookie, kStatusPeerLost, fmt::format("write failed: {}", reason));
  waiting_.clear();
  if (!closing_) {
    TransportEvent lost{TransportEvent::Type::peer_lost, id_};
    lost.status = kStatusPeerLost;
    lost.message = fmt::format("verbs peer {}: {}", peer_id_, reason);
    log(LogLevel::info, "verbs: connection {} lost: {}", id_, lost.message);
    shared_->events.push(std::move(lost));
  }
  socket_.shutdown();
}

void VerbsLink::modify(ibv_qp_attr& attr, int mask, const char* state) {
  if (int rc = ibv_modify_qp(qp_, &attr, mask); rc != 0)
    throw Error(HM_ERR_BACKEND,
                fmt::format("verbs: moving the QP to {} failed: {}", state, std::strerror(rc)));
}

void VerbsLink::to_error() {
  if (qp_ == nullptr) return;
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_ERR;
  ibv_modify_qp(qp_, &attr, IBV_QP_STATE);
}

int VerbsLink::post_recv(uint32_t slot) {
  ibv_sge sge{reinterpret_cast<uintptr_t>(recv_slots_.data() + size_t{slot} * kSlotBytes),
              kSlotBytes, recv_slots_.lkey()};
  ibv_recv_wr wr{};
  wr.wr_id = slot;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  return ibv_post_recv(qp_, &wr, &bad);
}

}  // namespace hetmesh::detail
