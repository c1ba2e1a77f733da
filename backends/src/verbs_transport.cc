// The verbs transport (rdma-core ibverbs).
//
// Connections: one RC queue pair each, connected out of band over a socket (socket_link.hpp): the
// two sides swap QPN, PSN, GID, LID and MTU, move their QPs to RTR and RTS, and meet at a barrier.
// The socket stays open for control messages and liveness: EOF on it means the peer is gone.
//
// Writes: RDMA WRITE, the last one WRITE_WITH_IMM (imm = notification value) when the caller wants
// a notification; a range larger than the port's max_msg_sz goes as several WRs. Every WR is
// signalled and counted, so the send queue never holds more than its depth; what does not fit
// waits in a software queue that the completion poller drains. RC ordering makes writes of one
// connection complete and notify in order.
//
// Staged destinations (device memory the NIC cannot reach): the writer writes into the receiver's
// registered host mirror, then SENDs {region, offset, length, notify, value}; RC ordering makes the
// SEND arrive after the data, and the receiver copies the range to the device before it raises the
// notification. Staged sources are copied device-to-mirror before the WRs are posted.
//
// Threads: a completion poller per transport (pinnable, busy or adaptive: spin, then block on the
// completion channel with a timeout), a delivery thread for staged copies (notifications that
// arrive behind a staged copy queue behind it, so order holds), and per connection a thread
// reading control frames from the socket.
#include "transports.hpp"

#include "descriptor.hpp"
#include "event_queue.hpp"
#include "socket_link.hpp"
#include "verbs_device.hpp"
#include "verbs_memory.hpp"

#include <hetmesh/log.hpp>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <random>
#include <thread>
#include <vector>

namespace hetmesh::detail {
namespace {

using Clock = std::chrono::steady_clock;

// Control frames on the out-of-band socket.
constexpr uint32_t kFrameMagic = 0x42564d48;  // "HMVB"
constexpr uint8_t kFrameVersion = 1;
enum FrameType : uint8_t { kControl = 1 };
struct FrameHeader {
  uint32_t magic;
  uint8_t version;
  uint8_t type;
  uint16_t reserved;
  uint64_t length;
};
static_assert(sizeof(FrameHeader) == 16);

// What each side tells the other to connect its QP.
constexpr uint32_t kQpInfoMagic = 0x51564d48;  // "HMVQ"
constexpr uint16_t kQpInfoVersion = 1;
struct QpInfo {
  uint32_t magic;
  uint16_t version;
  uint8_t ethernet;
  uint8_t mtu;  // ibv_mtu
  uint32_t qpn;
  uint32_t psn;
  uint16_t lid;
  uint16_t reserved;
  uint32_t recv_depth;
  uint8_t gid[16];
};
static_assert(sizeof(QpInfo) == 40);

// The SEND that follows a write into a staged region.
constexpr uint32_t kStagedMagic = 0x53564d48;  // "HMVS"
constexpr uint8_t kStagedNotify = 1;
struct StagedMessage {
  uint32_t magic;
  uint8_t flags;
  uint8_t reserved[3];
  uint32_t region;
  uint32_t value;
  uint64_t offset;
  uint64_t length;
};
static_assert(sizeof(StagedMessage) == 32);
constexpr uint32_t kSlotBytes = 64;  // a receive (or non-inline send) slot; holds a StagedMessage

// QP timers. The local ACK timeout is 4.096 us * 2^kQpTimeout (268 ms) and is retried kRetryCount
// times, so a write to a dead peer fails within about two seconds. The retry count is 6, not the
// spec's maximum of 7: soft-RoCE (rxe) reads retry_cnt 7 as "retry forever", like rnr_retry 7,
// and a dead peer would then never fail. RNR retries are unbounded: receivers repost at once, and
// a dead peer is caught by the retry count and the socket.
constexpr uint8_t kQpTimeout = 16;
constexpr uint8_t kRetryCount = 6;
constexpr uint8_t kRnrRetry = 7;
constexpr uint8_t kMinRnrTimer = 12;  // 0.64 ms
// Adaptive polling: spin this long after the last completion, then block this long per wait.
constexpr auto kSpin = std::chrono::microseconds(50);
constexpr int kBlockMs = 100;
constexpr auto kAsyncCheck = std::chrono::milliseconds(10);
constexpr int kPollBatch = 32;

class VerbsRegion;
class QpState;

// A receive-side event that must keep its order: a notification, or a staged copy (and maybe a
// notification after it).
struct Delivery {
  std::shared_ptr<QpState> qp;
  std::shared_ptr<VerbsRegion> region;  // staged copy when set
  uint64_t offset = 0;
  uint64_t length = 0;
  bool notify = false;
  uint32_t value = 0;
};

// State shared by the transport, its regions, its connections and its threads.
struct VerbsShared {
  VerbsShared(std::shared_ptr<VerbsContext> verbs, const TransportOptions& transport_options)
      : id(new_endpoint_id()), context(verbs), options(transport_options), cache(verbs) {}
  ~VerbsShared() {
    if (channel != nullptr && ibv_destroy_comp_channel(channel) != 0)
      log(LogLevel::warn, "verbs: ibv_destroy_comp_channel failed: {}", std::strerror(errno));
  }
  VerbsShared(const VerbsShared&) = delete;
  VerbsShared& operator=(const VerbsShared&) = delete;

  void wake_poller() const {
    uint64_t one = 1;
    // Fails only when the counter is saturated, and then the poller is awake anyway.
    [[maybe_unused]] ssize_t n = write(wake.get(), &one, sizeof one);
  }
  void add_qp(std::shared_ptr<QpState> qp) {
    {
      std::lock_guard lock(qps_mutex);
      qps.push_back(std::move(qp));
      ++qps_version;
    }
    wake_poller();
  }
  void remove_qp(const QpState* qp) {
    {
      std::lock_guard lock(qps_mutex);
      std::erase_if(qps, [&](const auto& q) { return q.get() == qp; });
      ++qps_version;
    }
    wake_poller();
  }
  void deliver(Delivery delivery);

  std::string id;
  std::shared_ptr<VerbsContext> context;
  TransportOptions options;
  EventQueue events;
  RegistrationCache cache;
  ibv_comp_channel* channel = nullptr;
  Fd wake;  // eventfd that wakes a blocked poller

  std::mutex regions_mutex;
  std::map<uint32_t, std::weak_ptr<VerbsRegion>> regions;
  uint32_t next_region = 1;

  std::mutex qps_mutex;
  std::vector<std::shared_ptr<QpState>> qps;  // what the poller serves
  std::atomic<uint64_t> qps_version{0};

  std::mutex delivery_mutex;
  std::condition_variable delivery_ready;
  std::deque<Delivery> deliveries;
  size_t delivery_pending = 0;  // queued plus the one being executed
  bool delivery_stopping = false;
};

class VerbsRegion : public Region {
 public:
  VerbsRegion(std::shared_ptr<VerbsShared> shared, uint32_t id, const Device& device, void* base,
              uint64_t size, std::shared_ptr<Registration> registration)
      : Region(device, base, size, registration->path()),
        shared_(std::move(shared)),
        id_(id),
        registration_(std::move(registration)) {}
  ~VerbsRegion() override {
    std::lock_guard lock(shared_->regions_mutex);
    shared_->regions.erase(id_);
  }
  RegionDescriptor describe() const override {
    return to_bytes({{"transport", "verbs"},
                     {"endpoint", shared_->id},
                     {"region", id_},
                     {"size", size()},
                     {"addr", registration_->remote_address()},
                     {"rkey", registration_->rkey()},
                     {"path", to_string(path())},
                     {"staged", registration_->staged()}});
  }
  uint32_t id() const { return id_; }
  const VerbsShared* owner() const { return shared_.get(); }
  Registration& registration() const { return *registration_; }

 private:
  std::shared_ptr<VerbsShared> shared_;
  uint32_t id_;
  std::shared_ptr<Registration> registration_;
};

class VerbsRemoteRegion : public RemoteRegion {
 public:
  VerbsRemoteRegion(std::string owner, uint32_t region_id, uint64_t size, uint64_t address,
                    uint32_t remote_key, bool is_staged)
      : RemoteRegion(size),
        endpoint(std::move(owner)),
        id(region_id),
        addr(address),
        rkey(remote_key),
        staged(is_staged) {}
  std::string endpoint;
  uint32_t id;
  uint64_t addr;
  uint32_t rkey;
  bool staged;
};

void check_range(const char* side, uint64_t offset, uint64_t length, uint64_t size) {
  if (offset > size || length > size - offset)
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("write: {} range [{}, +{}) is outside its region of {} bytes", side,
                            offset, length, size));
}

// recv_all with a deadline, for the connection handshake.
void recv_until(int fd, void* data, size_t size, Clock::time_point deadline, const char* what) {
  auto* p = static_cast<uint8_t*>(data);
  while (size > 0) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0)
      throw Error(HM_ERR_TIMEOUT, fmt::format("verbs: timed out waiting for the peer's {}", what));
    pollfd pfd{fd, POLLIN, 0};
    int ready = ::poll(&pfd, 1, static_cast<int>(std::min<int64_t>(left.count(), 1000)));
    if (ready < 0 && errno != EINTR)
      throw Error(kStatusPeerLost, fmt::format("verbs: poll: {}", std::strerror(errno)));
    if (ready <= 0) continue;
    ssize_t n = recv(fd, p, size, 0);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0)
      throw Error(kStatusPeerLost,
                  fmt::format("verbs: receiving the peer's {} failed: {}", what,
                              n < 0 ? std::strerror(errno) : "peer closed the connection"));
    p += n;
    size -= static_cast<size_t>(n);
  }
}

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

// Page-aligned host memory registered for local access, freed on destruction.
class LocalBuffer {
 public:
  LocalBuffer() = default;
  LocalBuffer(const LocalBuffer&) = delete;
  LocalBuffer& operator=(const LocalBuffer&) = delete;
  ~LocalBuffer() {
    if (mr_ != nullptr) ibv_dereg_mr(mr_);
    std::free(data_);
  }
  void allocate(ibv_pd* pd, size_t size, const char* what) {
    if (posix_memalign(&data_, static_cast<size_t>(sysconf(_SC_PAGESIZE)), size) != 0)
      throw Error(HM_ERR_OUT_OF_MEMORY, fmt::format("verbs: no memory for {}", what));
    std::memset(data_, 0, size);
    mr_ = ibv_reg_mr(pd, data_, size, int{IBV_ACCESS_LOCAL_WRITE});
    if (mr_ == nullptr)
      throw Error(HM_ERR_BACKEND,
                  fmt::format("verbs: ibv_reg_mr of {} failed: {}", what, std::strerror(errno)));
  }
  uint8_t* data() const { return static_cast<uint8_t*>(data_); }
  uint32_t lkey() const { return mr_->lkey; }

 private:
  void* data_ = nullptr;
  ibv_mr* mr_ = nullptr;
};

// One connection's queue pair, its completion queues and its out-of-band socket.
class QpState : public std::enable_shared_from_this<QpState> {
 public:
  QpState(ConnectionId id, std::shared_ptr<VerbsShared> shared, std::string peer_id, Fd socket)
      : id_(id),
        shared_(std::move(shared)),
        peer_id_(std::move(peer_id)),
        socket_(std::move(socket)) {}

  ~QpState() {
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
  QpState(const QpState&) = delete;
  QpState& operator=(const QpState&) = delete;

  ConnectionId id() const { return id_; }
  const std::string& peer_id() const { return peer_id_; }
  bool alive() const { return alive_; }

  // Creates the QP, swaps QP info with the peer over the socket, brings the QP to RTS and meets
  // the peer at a barrier. Throws Error (HM_ERR_TIMEOUT past `deadline`).
  void setup(Clock::time_point deadline) {
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
    ibv_qp_init_attr init{};
    init.send_cq = send_cq_;
    init.recv_cq = recv_cq_;
    init.qp_type = IBV_QPT_RC;
    init.cap.max_send_wr = send_depth_;
    init.cap.max_recv_wr = recv_depth_;
    init.cap.max_send_sge = 1;
    init.cap.max_recv_sge = 1;
    init.cap.max_inline_data = max_inline_;
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

    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_INIT;
    attr.pkey_index = 0;
    attr.port_num = verbs.port();
    attr.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
    modify(attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, "INIT");
    for (uint32_t slot = 0; slot < recv_depth_; ++slot)
      if (int rc = post_recv(slot); rc != 0)
        throw Error(HM_ERR_BACKEND,
                    fmt::format("verbs: ibv_post_recv failed: {}", std::strerror(rc)));

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
    send_all(socket_.get(), &mine, sizeof mine, "QP info");
    QpInfo peer{};
    recv_until(socket_.get(), &peer, sizeof peer, deadline, "QP info");
    if (peer.magic != kQpInfoMagic || peer.version != kQpInfoVersion)
      throw Error(kStatusProtocolError,
                  fmt::format("verbs: peer {} sent bad QP info (magic {:08x}, version {})",
                              peer_id_, peer.magic, peer.version));
    if (peer.ethernet != mine.ethernet)
      throw Error(HM_ERR_NOT_SUPPORTED,
                  fmt::format("verbs: peer {} is on {}, this side on {}", peer_id_,
                              peer.ethernet ? "Ethernet" : "InfiniBand",
                              mine.ethernet ? "Ethernet" : "InfiniBand"));

    attr = {};
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
    attr = {};
    attr.qp_state = IBV_QPS_RTS;
    attr.timeout = kQpTimeout;
    attr.retry_cnt = kRetryCount;
    attr.rnr_retry = kRnrRetry;
    attr.sq_psn = mine.psn;
    attr.max_rd_atomic = 1;
    modify(attr,
           IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
               IBV_QP_MAX_QP_RD_ATOMIC,
           "RTS");
    // Neither side writes before the other's QP is ready to receive.
    uint8_t ready = 'R', peer_ready = 0;
    send_all(socket_.get(), &ready, 1, "ready");
    recv_until(socket_.get(), &peer_ready, 1, deadline, "ready");
    keep_alive(socket_.get());
    log(LogLevel::info,
        "verbs: connection {} to {}: QP {} <-> {}, MTU {}, depth {}/{}, inline {}, max message {}",
        id_, peer_id_, mine.qpn, peer.qpn, mtu_bytes(path_mtu), send_depth_, recv_depth_,
        max_inline_, max_chunk_);
  }

  // Starts the thread that reads control frames and watches the socket.
  void start() {
    receiver_ = std::thread([this] { receive(); });
  }

  // The user dropped the Connection: stop its thread, fail what is in flight, leave the poller.
  void close() {
    closing_ = true;
    socket_.shutdown();
    if (receiver_.joinable()) receiver_.join();
    {
      std::lock_guard lock(mutex_);
      closed_ = true;
      alive_ = false;
      if (!failed_) to_error();
      failed_ = true;
      std::string why = fmt::format(
          "verbs: connection {} to {} was closed with the write in flight", id_, peer_id_);
      for (const Pending& p : posted_)
        if (p.last) done_locked(p.cookie, kStatusPeerLost, why);
      for (const SendOp& op : waiting_)
        if (op.last) done_locked(op.cookie, kStatusPeerLost, why);
      posted_.clear();
      waiting_.clear();
    }
    shared_->remove_qp(this);
  }

  // Marks the connection failed: the QP goes to the error state (flushing what is posted, each
  // flush becoming a failed write_done), queued writes fail now, the socket closes, and a
  // peer_lost event says why, once.
  void fail(const std::string& reason) {
    std::lock_guard lock(mutex_);
    fail_locked(reason);
  }

  std::shared_ptr<RemoteRegion> import_region(const RegionDescriptor& descriptor) {
    const char* what = "region descriptor";
    auto d = parse_descriptor(descriptor, "verbs", what);
    auto owner = field<std::string>(d, "endpoint", what);
    if (owner != peer_id_)
      throw Error(HM_ERR_INVALID_ARGUMENT,
                  fmt::format("region descriptor belongs to endpoint {}, this connection's peer "
                              "is {}",
                              owner, peer_id_));
    auto size = field<uint64_t>(d, "size", what);
    auto addr = field<uint64_t>(d, "addr", what);
    if (addr + size < addr)
      throw Error(HM_ERR_INVALID_ARGUMENT,
                  fmt::format("region descriptor: [{:#x}, +{}) wraps around", addr, size));
    return std::make_shared<VerbsRemoteRegion>(owner, field<uint32_t>(d, "region", what), size,
                                               addr, field<uint32_t>(d, "rkey", what),
                                               field<bool>(d, "staged", what));
  }

  void write(const Region& src, uint64_t src_offset, const RemoteRegion& dst, uint64_t dst_offset,
             uint64_t length, std::optional<uint32_t> notify, uint64_t cookie) {
    const auto* source = dynamic_cast<const VerbsRegion*>(&src);
    const auto* target = dynamic_cast<const VerbsRemoteRegion*>(&dst);
    if (source == nullptr || target == nullptr)
      throw Error(HM_ERR_INVALID_ARGUMENT, "write: regions were not made by the verbs transport");
    if (source->owner() != shared_.get())
      throw Error(HM_ERR_INVALID_ARGUMENT,
                  "write: the source region was registered with another verbs transport");
    if (target->endpoint != peer_id_)
      throw Error(HM_ERR_INVALID_ARGUMENT,
                  fmt::format("write: the destination region belongs to endpoint {}, this "
                              "connection's peer is {}",
                              target->endpoint, peer_id_));
    check_range("source", src_offset, length, src.size());
    check_range("destination", dst_offset, length, dst.size());
    if (!alive_) throw Error(kStatusPeerLost, fmt::format("write: peer {} is lost", peer_id_));

    Registration& registration = source->registration();
    registration.stage_out(src_offset, length);  // staged sources only
    uint64_t local = registration.remote_address() + src_offset;
    uint64_t remote = target->addr + dst_offset;
    uint64_t chunks = length == 0 ? 1 : (length + max_chunk_ - 1) / max_chunk_;
    if (target->staged && length == 0) chunks = 0;  // the SEND alone says it

    std::lock_guard lock(mutex_);
    if (failed_) throw Error(kStatusPeerLost, fmt::format("write: peer {} is lost", peer_id_));
    for (uint64_t i = 0; i < chunks; ++i) {
      uint64_t offset = i * max_chunk_;
      SendOp op{};
      op.cookie = cookie;
      op.last = i + 1 == chunks && !target->staged;
      op.opcode = op.last && notify ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE;
      op.imm = htonl(notify.value_or(0));
      op.local = local + offset;
      op.lkey = registration.lkey();
      op.length = static_cast<uint32_t>(std::min<uint64_t>(max_chunk_, length - offset));
      op.remote = remote + offset;
      op.rkey = target->rkey;
      op.cpu_readable = registration.cpu_readable();
      waiting_.push_back(op);
    }
    if (target->staged) {
      SendOp op{};
      op.cookie = cookie;
      op.last = true;
      op.opcode = IBV_WR_SEND;
      op.message = {kStagedMagic,
                    static_cast<uint8_t>(notify ? kStagedNotify : 0),
                    {},
                    target->id,
                    notify.value_or(0),
                    dst_offset,
                    length};
      waiting_.push_back(op);
    }
    post_locked();
  }

  void send_control(std::span<const uint8_t> message) {
    if (message.size() > Connection::kMaxControlBytes)
      throw Error(HM_ERR_INVALID_ARGUMENT,
                  fmt::format("control message of {} bytes exceeds {}", message.size(),
                              Connection::kMaxControlBytes));
    if (!alive_)
      throw Error(kStatusPeerLost, fmt::format("send_control: peer {} is lost", peer_id_));
    FrameHeader header{kFrameMagic, kFrameVersion, kControl, 0, message.size()};
    try {
      std::lock_guard lock(send_mutex_);
      send_two(socket_.get(), &header, sizeof header, message.data(), message.size(), "control");
    } catch (const Error& e) {
      fail(e.what());
      throw;
    }
  }

  // Poller: handles what both CQs hold; returns how many completions there were. `wcs` has room
  // for 2 * kPollBatch completions.
  int poll(ibv_wc* wcs) {
    int total = 0;
    int n = ibv_poll_cq(send_cq_, kPollBatch, wcs);
    if (n > 0) {
      std::lock_guard lock(mutex_);
      for (int i = 0; i < n; ++i)
        on_send_locked(wcs[i]);
      if (!failed_) post_locked();
      total += n;
    } else if (n < 0) {
      fail("ibv_poll_cq on the send queue failed");
    }
    n = ibv_poll_cq(recv_cq_, kPollBatch, wcs);
    if (n > 0) {
      for (int i = 0; i < n; ++i)
        on_recv(wcs[i], wcs + kPollBatch);
      total += n;
    } else if (n < 0) {
      fail("ibv_poll_cq on the receive queue failed");
    }
    return total;
  }

  // Poller: asks for a completion event on both CQs before it blocks.
  void arm() {
    ibv_req_notify_cq(send_cq_, 0);
    ibv_req_notify_cq(recv_cq_, 0);
  }

  // Delivery thread: a staged write landed in `region`'s mirror; copy it to the device.
  bool finish_staged(const Delivery& d) {
    try {
      d.region->registration().stage_in(d.offset, d.length);
      return true;
    } catch (const Error& e) {
      fail(fmt::format("copying a staged write into region {} failed: {}", d.region->id(),
                       e.what()));
      return false;
    }
  }

  ibv_qp* qp() const { return qp_; }
  bool owns(const ibv_cq* cq) const { return cq == send_cq_ || cq == recv_cq_; }

  bool closed() {
    std::lock_guard lock(mutex_);
    return closed_;
  }

 private:
  struct SendOp {
    uint64_t cookie;
    bool last;  // ends a user write: its completion raises write_done
    ibv_wr_opcode opcode;
    bool cpu_readable;  // the source may be sent inline
    uint32_t imm;       // network order
    uint64_t local;
    uint32_t lkey;
    uint32_t length;
    uint64_t remote;
    uint32_t rkey;
    StagedMessage message;  // IBV_WR_SEND
  };
  struct Pending {
    uint64_t cookie;
    bool last;
  };

  void modify(ibv_qp_attr& attr, int mask, const char* state) {
    if (int rc = ibv_modify_qp(qp_, &attr, mask); rc != 0)
      throw Error(HM_ERR_BACKEND,
                  fmt::format("verbs: moving the QP to {} failed: {}", state, std::strerror(rc)));
  }

  void to_error() {
    if (qp_ == nullptr) return;
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_ERR;
    ibv_modify_qp(qp_, &attr, IBV_QP_STATE);
  }

  int post_recv(uint32_t slot) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(recv_slots_.data() + size_t{slot} * kSlotBytes),
                kSlotBytes, recv_slots_.lkey()};
    ibv_recv_wr wr{};
    wr.wr_id = slot;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    return ibv_post_recv(qp_, &wr, &bad);
  }

  void done_locked(uint64_t cookie, hm_status status, const std::string& message) {
    TransportEvent done{TransportEvent::Type::write_done, id_};
    done.cookie = cookie;
    done.status = status;
    done.message = message;
    shared_->events.push(std::move(done));
  }

  void fail_locked(const std::string& reason) {
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

  // Posts as much of the software queue as the send queue has room for, in one call.
  void post_locked() {
    size_t n = std::min<size_t>(send_depth_ - posted_.size(), waiting_.size());
    if (n == 0) return;
    for (size_t i = 0; i < n; ++i) {
      SendOp& op = waiting_[i];
      ibv_send_wr& wr = wrs_[i];
      ibv_sge& sge = sges_[i];
      wr = {};
      wr.wr_id = op.cookie;
      wr.next = i + 1 < n ? &wrs_[i + 1] : nullptr;
      wr.sg_list = &sge;
      wr.opcode = op.opcode;
      wr.send_flags = IBV_SEND_SIGNALED;
      if (op.opcode == IBV_WR_SEND) {
        wr.num_sge = 1;
        if (sizeof op.message <= max_inline_) {
          sge = {reinterpret_cast<uintptr_t>(&op.message), sizeof op.message, 0};
          wr.send_flags |= IBV_SEND_INLINE;
        } else {
          uint8_t* slot = send_slots_.data() + (next_send_slot_++ % send_depth_) * kSlotBytes;
          std::memcpy(slot, &op.message, sizeof op.message);
          sge = {reinterpret_cast<uintptr_t>(slot), sizeof op.message, send_slots_.lkey()};
        }
        continue;
      }
      wr.num_sge = op.length > 0 ? 1 : 0;
      sge = {op.local, op.length, op.lkey};
      if (op.cpu_readable && op.length > 0 && op.length <= max_inline_)
        wr.send_flags |= IBV_SEND_INLINE;
      wr.imm_data = op.imm;
      wr.wr.rdma.remote_addr = op.remote;
      wr.wr.rdma.rkey = op.rkey;
    }
    ibv_send_wr* bad = nullptr;
    int rc = ibv_post_send(qp_, wrs_.data(), &bad);
    size_t posted = rc == 0 ? n : static_cast<size_t>(bad - wrs_.data());
    for (size_t i = 0; i < posted; ++i) {
      posted_.push_back({waiting_.front().cookie, waiting_.front().last});
      waiting_.pop_front();
    }
    if (rc != 0) fail_locked(fmt::format("ibv_post_send failed: {}", std::strerror(rc)));
  }

  void on_send_locked(const ibv_wc& wc) {
    if (closed_ || posted_.empty()) return;
    Pending p = posted_.front();
    posted_.pop_front();
    bool ok = wc.status == IBV_WC_SUCCESS;
    if (!ok)
      fail_locked(fmt::format("RDMA write to {} failed: {} (status {}, vendor error {:#x})",
                              peer_id_, ibv_wc_status_str(wc.status), static_cast<int>(wc.status),
                              wc.vendor_err));
    if (p.last)
      done_locked(p.cookie, ok ? HM_OK : kStatusPeerLost,
                  ok ? std::string() : fmt::format("write failed: {}", first_error_));
  }

  void on_recv(const ibv_wc& wc, ibv_wc* spare) {
    if (wc.status != IBV_WC_SUCCESS) {
      if (wc.status == IBV_WC_WR_FLUSH_ERR) {
        // The QP is in the error state already; the cause (a failed send, say) may still sit in
        // the send CQ, and makes the better message.
        std::lock_guard lock(mutex_);
        if (failed_) return;
        int n = ibv_poll_cq(send_cq_, kPollBatch, spare);
        for (int i = 0; i < n; ++i)
          on_send_locked(spare[i]);
        fail_locked("the queue pair entered the error state (receives flushed)");
        return;
      }
      fail(fmt::format("receive from {} failed: {} (status {}, vendor error {:#x})", peer_id_,
                       ibv_wc_status_str(wc.status), static_cast<int>(wc.status), wc.vendor_err));
      return;
    }
    auto slot = static_cast<uint32_t>(wc.wr_id);
    Delivery d;
    d.qp = shared_from_this();
    if (wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
      d.notify = true;
      d.value = ntohl(wc.imm_data);
    } else if (wc.opcode == IBV_WC_RECV) {
      StagedMessage m{};
      if (wc.byte_len == sizeof m)
        std::memcpy(&m, recv_slots_.data() + size_t{slot} * kSlotBytes, sizeof m);
      if (m.magic != kStagedMagic) {
        fail(fmt::format("protocol error: a {}-byte SEND that is no staged-write message",
                         wc.byte_len));
        return;
      }
      {
        std::lock_guard lock(shared_->regions_mutex);
        auto it = shared_->regions.find(m.region);
        if (it != shared_->regions.end()) d.region = it->second.lock();
      }
      if (!d.region || !d.region->registration().staged() || m.offset > d.region->size() ||
          m.length > d.region->size() - m.offset) {
        fail(
            fmt::format("protocol error: staged write to region {} at [{}, +{}) does not fit a "
                        "staged region here; refused",
                        m.region, m.offset, m.length));
        return;
      }
      d.offset = m.offset;
      d.length = m.length;
      d.notify = (m.flags & kStagedNotify) != 0;
      d.value = m.value;
    } else {
      fail(
          fmt::format("protocol error: unexpected receive opcode {}", static_cast<int>(wc.opcode)));
      return;
    }
    if (int rc = post_recv(slot); rc != 0) {
      fail(fmt::format("ibv_post_recv failed: {}", std::strerror(rc)));
      return;
    }
    shared_->deliver(std::move(d));
  }

  void receive() {
    try {
      for (;;) {
        FrameHeader h;
        recv_all(socket_.get(), &h, sizeof h, "frame header");
        if (h.magic != kFrameMagic || h.version != kFrameVersion)
          throw Error(kStatusProtocolError,
                      fmt::format("bad frame (magic {:08x}, version {})", h.magic, h.version));
        if (h.type != kControl)
          throw Error(kStatusProtocolError, fmt::format("unknown frame type {}", h.type));
        if (h.length > Connection::kMaxControlBytes)
          throw Error(kStatusProtocolError, fmt::format("control message of {} bytes exceeds {}",
                                                        h.length, Connection::kMaxControlBytes));
        TransportEvent control{TransportEvent::Type::control, id_};
        control.payload.resize(h.length);
        recv_all(socket_.get(), control.payload.data(), h.length, "control payload");
        shared_->events.push(std::move(control));
      }
    } catch (const Error& e) {
      if (!closing_) fail(e.what());
    }
  }

  ConnectionId id_;
  std::shared_ptr<VerbsShared> shared_;
  std::string peer_id_;
  Fd socket_;
  std::mutex send_mutex_;  // socket writes
  std::atomic<bool> alive_{true};
  std::atomic<bool> closing_{false};
  std::thread receiver_;

  ibv_cq* send_cq_ = nullptr;
  ibv_cq* recv_cq_ = nullptr;
  ibv_qp* qp_ = nullptr;
  uint32_t send_depth_ = 0;
  uint32_t recv_depth_ = 0;
  uint32_t max_inline_ = 0;
  uint64_t max_chunk_ = 0;
  LocalBuffer recv_slots_;
  LocalBuffer send_slots_;

  std::mutex mutex_;            // everything below
  std::deque<SendOp> waiting_;  // not yet posted: the send queue was full
  std::deque<Pending> posted_;  // posted, completion not yet seen (in order: RC)
  std::vector<ibv_send_wr> wrs_;
  std::vector<ibv_sge> sges_;
  uint64_t next_send_slot_ = 0;
  bool failed_ = false;
  bool closed_ = false;
  std::string first_error_;
};

void VerbsShared::deliver(Delivery delivery) {
  std::lock_guard lock(delivery_mutex);
  if (delivery_pending == 0 && !delivery.region) {
    // Nothing queued ahead of it: raise the notification from the poller right away.
    TransportEvent note{TransportEvent::Type::notification, delivery.qp->id()};
    note.value = delivery.value;
    events.push(std::move(note));
    return;
  }
  deliveries.push_back(std::move(delivery));
  ++delivery_pending;
  delivery_ready.notify_one();
}

class VerbsConnection : public Connection {
 public:
  explicit VerbsConnection(std::shared_ptr<QpState> state)
      : Connection(state->id()), state_(std::move(state)) {}
  ~VerbsConnection() override { state_->close(); }
  bool alive() const override { return state_->alive(); }
  std::shared_ptr<RemoteRegion> import_region(const RegionDescriptor& descriptor) override {
    return state_->import_region(descriptor);
  }
  void write(const Region& src, uint64_t src_offset, const RemoteRegion& dst, uint64_t dst_offset,
             uint64_t length, std::optional<uint32_t> notify, uint64_t cookie) override {
    state_->write(src, src_offset, dst, dst_offset, length, notify, cookie);
  }
  void send_control(std::span<const uint8_t> message) override { state_->send_control(message); }

 private:
  std::shared_ptr<QpState> state_;
};

class VerbsTransport : public Transport {
 public:
  explicit VerbsTransport(const TransportOptions& options)
      : shared_(std::make_shared<VerbsShared>(VerbsContext::open(options), options)),
        listener_(
            SocketAddress{fmt::format("tcp://{}:{}", options.listen_host, options.listen_port)},
            shared_->id) {
    shared_->channel = ibv_create_comp_channel(shared_->context->context());
    if (shared_->channel == nullptr)
      throw Error(HM_ERR_BACKEND,
                  fmt::format("verbs: ibv_create_comp_channel failed: {}", std::strerror(errno)));
    for (int fd : {shared_->channel->fd, shared_->context->context()->async_fd})
      fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    shared_->wake = Fd(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
    if (!shared_->wake)
      throw Error(HM_ERR_BACKEND, fmt::format("verbs: eventfd: {}", std::strerror(errno)));
    poller_ = std::thread([this] { poll_completions(); });
    delivery_ = std::thread([this] { run_deliveries(); });
  }

  ~VerbsTransport() override {
    stopping_ = true;
    shared_->wake_poller();
    poller_.join();
    {
      std::lock_guard lock(shared_->delivery_mutex);
      shared_->delivery_stopping = true;
    }
    shared_->delivery_ready.notify_all();
    delivery_.join();
    std::vector<std::shared_ptr<QpState>> qps;
    {
      std::lock_guard lock(shared_->qps_mutex);
      qps.swap(shared_->qps);
    }
    // Connections the user still holds can no longer complete anything: fail them, so the peers
    // see EOF and nothing waits forever.
    for (auto& qp : qps)
      qp->fail("the local verbs transport was destroyed");
    std::lock_guard lock(shared_->delivery_mutex);
    shared_->deliveries.clear();
  }

  TransportKind kind() const override { return TransportKind::verbs; }

  EndpointDescriptor endpoint() const override {
    const VerbsContext& verbs = *shared_->context;
    return to_bytes({{"transport", "verbs"},
                     {"endpoint", shared_->id},
                     {"address", listener_.address().text},
                     {"device", verbs.name()},
                     {"port", verbs.port()},
                     {"link_layer", verbs.ethernet() ? "Ethernet" : "InfiniBand"},
                     {"lid", verbs.lid()},
                     {"gid", gid_text(verbs.gid())}});
  }

  std::shared_ptr<Region> register_memory(const Device& device, void* ptr, uint64_t size) override {
    check_registration(device, ptr, size);
    auto registration = shared_->cache.get(device, ptr, size);
    std::lock_guard lock(shared_->regions_mutex);
    uint32_t id = shared_->next_region++;
    auto region = std::make_shared<VerbsRegion>(shared_, id, device, ptr, size, registration);
    shared_->regions[id] = region;
    log(LogLevel::info, "verbs: registered {} bytes of {} at {} as region {}: path {} ({})", size,
        device.selector(), ptr, id, to_string(region->path()), registration->reason());
    return region;
  }

  std::shared_ptr<Connection> connect(const EndpointDescriptor& peer,
                                      std::chrono::milliseconds timeout) override {
    auto deadline = Clock::now() + timeout;
    auto d = parse_descriptor(peer, "verbs", "endpoint descriptor");
    auto peer_id = field<std::string>(d, "endpoint", "endpoint descriptor");
    auto address = field<std::string>(d, "address", "endpoint descriptor");
    Fd socket = connect_symmetric(listener_, shared_->id, peer_id, SocketAddress{address}, timeout);
    auto state = std::make_shared<QpState>(next_connection_++, shared_, peer_id, std::move(socket));
    state->setup(deadline);
    shared_->add_qp(state);
    state->start();
    return std::make_shared<VerbsConnection>(std::move(state));
  }

  size_t poll(std::vector<TransportEvent>& out, std::chrono::nanoseconds timeout) override {
    return shared_->events.poll(out, timeout);
  }

 private:
  void pin_poller() {
    pthread_setname_np(pthread_self(), "hm-verbs-poll");
    int cpu = shared_->options.poller_cpu;
    if (cpu < 0) return;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (int rc = pthread_setaffinity_np(pthread_self(), sizeof set, &set); rc != 0)
      log(LogLevel::warn, "verbs: cannot pin the completion poller to CPU {}: {}", cpu,
          std::strerror(rc));
    else
      log(LogLevel::info, "verbs: completion poller pinned to CPU {}", cpu);
  }

  // The completion poller: busy, or adaptive (spin for kSpin after the last completion, then arm
  // the CQs and block on the completion channel, kBlockMs at a time so shutdown never hangs).
  void poll_completions() {
    pin_poller();
    const bool busy = shared_->options.busy_poll;
    std::vector<std::shared_ptr<QpState>> qps;
    uint64_t version = ~uint64_t{0};
    ibv_wc wcs[2 * kPollBatch];
    auto idle_since = Clock::now();
    auto async_checked = idle_since;
    for (uint64_t round = 0; !stopping_; ++round) {
      if (uint64_t now_version = shared_->qps_version; now_version != version) {
        std::lock_guard lock(shared_->qps_mutex);
        qps = shared_->qps;
        version = shared_->qps_version;
      }
      // While spinning, look at the device's asynchronous events now and then.
      if (round % 256 == 0 && Clock::now() - async_checked > kAsyncCheck) {
        handle_async_events(qps);
        async_checked = Clock::now();
      }
      int n = 0;
      for (auto& qp : qps)
        n += qp->poll(wcs);
      if (n > 0) {
        idle_since = Clock::now();
        continue;
      }
      if (!qps.empty() && (busy || Clock::now() - idle_since < kSpin)) continue;
      for (auto& qp : qps)
        qp->arm();
      for (auto& qp : qps)
        n += qp->poll(wcs);  // what arrived before the CQs were armed
      if (n > 0) {
        idle_since = Clock::now();
        continue;
      }
      pollfd fds[3] = {{shared_->channel->fd, POLLIN, 0},
                       {shared_->wake.get(), POLLIN, 0},
                       {shared_->context->context()->async_fd, POLLIN, 0}};
      ::poll(fds, 3, kBlockMs);
      if (fds[2].revents != 0) handle_async_events(qps);
      ibv_cq* cq = nullptr;
      void* context = nullptr;
      while (ibv_get_cq_event(shared_->channel, &cq, &context) == 0)
        ibv_ack_cq_events(cq, 1);
      uint64_t count;
      while (read(shared_->wake.get(), &count, sizeof count) > 0) {
      }
      idle_since = Clock::now();
    }
  }

  // Asynchronous device events: a QP or CQ error fails its connection, a fatal device error fails
  // them all; the rest are logged.
  void handle_async_events(const std::vector<std::shared_ptr<QpState>>& qps) {
    ibv_async_event event;
    while (ibv_get_async_event(shared_->context->context(), &event) == 0) {
      std::string what = fmt::format("asynchronous event on {}: {}", shared_->context->name(),
                                     ibv_event_type_str(event.event_type));
      switch (event.event_type) {
        case IBV_EVENT_QP_FATAL:
        case IBV_EVENT_QP_REQ_ERR:
        case IBV_EVENT_QP_ACCESS_ERR:
          for (auto& qp : qps)
            if (qp->qp() == event.element.qp) qp->fail(what);
          break;
        case IBV_EVENT_CQ_ERR:
          for (auto& qp : qps)
            if (qp->owns(event.element.cq)) qp->fail(what);
          break;
        case IBV_EVENT_DEVICE_FATAL:
          for (auto& qp : qps)
            qp->fail(what);
          break;
        default:
          break;
      }
      log(event.event_type == IBV_EVENT_COMM_EST ? LogLevel::debug : LogLevel::warn, "verbs: {}",
          what);
      ibv_ack_async_event(&event);
    }
  }

  // Staged copies (and the notifications behind them), in arrival order.
  void run_deliveries() {
    pthread_setname_np(pthread_self(), "hm-verbs-stage");
    for (;;) {
      Delivery d;
      {
        std::unique_lock lock(shared_->delivery_mutex);
        shared_->delivery_ready.wait(
            lock, [&] { return shared_->delivery_stopping || !shared_->deliveries.empty(); });
        if (shared_->delivery_stopping) return;
        d = std::move(shared_->deliveries.front());
        shared_->deliveries.pop_front();
      }
      bool ok = !d.region || d.qp->finish_staged(d);
      std::lock_guard lock(shared_->delivery_mutex);
      if (ok && d.notify && !d.qp->closed()) {
        TransportEvent note{TransportEvent::Type::notification, d.qp->id()};
        note.value = d.value;
        shared_->events.push(std::move(note));
      }
      --shared_->delivery_pending;
    }
  }

  std::shared_ptr<VerbsShared> shared_;
  Listener listener_;
  std::atomic<ConnectionId> next_connection_{1};
  std::atomic<bool> stopping_{false};
  std::thread poller_;
  std::thread delivery_;
};

}  // namespace

std::unique_ptr<Transport> make_verbs_transport(const TransportOptions& options) {
  return std::make_unique<VerbsTransport>(options);
}

}  // namespace hetmesh::detail
