// One verbs connection: an RC queue pair with its completion queues, and the out-of-band socket
// it was set up over, which then carries control messages and says when the peer is gone (EOF).
//
// Setup and teardown (verbs_link_setup.cc): the QP is created with the provider's limits, the two
// sides swap QpInfo over the socket, move their QPs to RTR and RTS and meet at a barrier.
//
// The data path (verbs_link_io.cc): a write is RDMA WRITEs, the last one WRITE_WITH_IMM (imm =
// notification value) when the caller wants a notification; a range larger than the port's
// max_msg_sz goes as several WRs. Every WR is signalled and counted, so the send queue never holds
// more than its depth; what does not fit waits in a software queue that the completion poller
// drains, and so do the WRs of writes marked `more` until their run ends (or a completion posts
// them sooner). RC ordering makes writes of one connection complete and notify in order.
//
// Staged destinations (device memory the NIC cannot reach): the writer writes into the receiver's
// registered host mirror, then SENDs a StagedMessage; RC ordering makes the SEND arrive after the
// data, and the receiver's delivery thread copies the range to the device before it raises the
// notification. Staged sources are copied device-to-mirror before the WRs are posted.
#pragma once

#include "common/socket_link.hpp"
#include "verbs/verbs_shared.hpp"
#include "verbs/verbs_wire.hpp"

#include <hetmesh/transport/transport.hpp>

#include <infiniband/verbs.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

namespace hetmesh::detail {

// Completions taken from one CQ per ibv_poll_cq call. VerbsLink::poll wants room for twice this.
constexpr int kPollBatch = 32;

// Page-aligned host memory registered for local access, freed on destruction.
class LocalBuffer {
 public:
  LocalBuffer() = default;
  LocalBuffer(const LocalBuffer&) = delete;
  LocalBuffer& operator=(const LocalBuffer&) = delete;
  ~LocalBuffer();
  // Throws Error if the memory cannot be had or registered.
  void allocate(ibv_pd* pd, size_t size, const char* what);
  uint8_t* data() const { return static_cast<uint8_t*>(data_); }
  uint32_t lkey() const { return mr_->lkey; }

 private:
  void* data_ = nullptr;
  ibv_mr* mr_ = nullptr;
};

class VerbsLink : public std::enable_shared_from_this<VerbsLink> {
 public:
  using Clock = std::chrono::steady_clock;

  VerbsLink(ConnectionId id, std::shared_ptr<VerbsShared> shared, std::string peer_id, Fd socket);
  ~VerbsLink();
  VerbsLink(const VerbsLink&) = delete;
  VerbsLink& operator=(const VerbsLink&) = delete;

  ConnectionId id() const { return id_; }
  const std::string& peer_id() const { return peer_id_; }
  bool alive() const { return alive_; }

  // --- setup and teardown (verbs_link_setup.cc) ---

  // Creates the QP, swaps QP info with the peer over the socket, brings the QP to RTS and meets
  // the peer at a barrier. Throws Error (HM_ERR_TIMEOUT past `deadline`).
  void setup(Clock::time_point deadline);
  // Starts the thread that reads control frames and watches the socket.
  void start();
  // The user dropped the Connection: stop its thread, fail what is in flight, leave the poller.
  void close();
  // Marks the connection failed: the QP goes to the error state (flushing what is posted, each
  // flush becoming a failed write_done), queued writes fail now, the socket closes, and a
  // peer_lost event says why, once.
  void fail(const std::string& reason);

  // --- the data path (verbs_link_io.cc) ---

  std::shared_ptr<RemoteRegion> import_region(const RegionDescriptor& descriptor);
  // With `more`, the write's work requests wait in the software queue for the run's last write
  // (one without `more`, even a refused one) or a control message: on an idle link the run goes in
  // one ibv_post_send, one doorbell (on soft-RoCE one system call) for the lot.
  void write(const Region& src, uint64_t src_offset, const RemoteRegion& dst, uint64_t dst_offset,
             uint64_t length, std::optional<uint32_t> notify, uint64_t cookie, bool more);
  void send_control(std::span<const uint8_t> message);

  // Poller: handles what both CQs hold; returns how many completions there were. `wcs` has room
  // for 2 * kPollBatch completions.
  int poll(ibv_wc* wcs);
  // Poller: asks for a completion event on both CQs before it blocks.
  void arm();
  // Delivery thread: a staged write landed in `d.region`'s mirror; copy it to the device.
  bool finish_staged(const VerbsDelivery& d);

  ibv_qp* qp() const { return qp_; }
  bool owns(const ibv_cq* cq) const { return cq == send_cq_ || cq == recv_cq_; }
  bool closed();

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

  // Setup (verbs_link_setup.cc). The steps of setup(), in order: the CQs, the QP within the
  // provider's limits and the slot buffers; INIT with every receive slot posted; the QpInfo swap
  // (the peer's checked); RTR (returns the path MTU); RTS.
  void create_queue_pair();
  void to_init();
  QpInfo local_qp_info() const;
  QpInfo swap_qp_info(const QpInfo& mine, Clock::time_point deadline);
  ibv_mtu to_rtr(const QpInfo& mine, const QpInfo& peer);
  void to_rts(uint32_t psn);
  void modify(ibv_qp_attr& attr, int mask, const char* state);
  void to_error();
  int post_recv(uint32_t slot);
  void fail_locked(const std::string& reason);

  // Data path (verbs_link_io.cc).
  void done_locked(uint64_t cookie, hm_status status, const std::string& message);
  // write()'s work requests into the software queue, checked; not posted.
  void queue(const Region& src, uint64_t src_offset, const RemoteRegion& dst, uint64_t dst_offset,
             uint64_t length, std::optional<uint32_t> notify, uint64_t cookie);
  // Posts as much of the software queue as the send queue has room for, in one call.
  void post_locked();
  // Posts what the software queue holds (writes marked `more`, or beyond the send queue's depth).
  void post_held();
  void on_send_locked(const ibv_wc& wc);
  void on_recv(const ibv_wc& wc, ibv_wc* spare);
  // The control thread: reads control frames until the socket ends.
  void receive();

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
  std::deque<SendOp> waiting_;  // not yet posted: the send queue was full, or a run goes on
  std::deque<Pending> posted_;  // posted, completion not yet seen (in order: RC)
  std::vector<ibv_send_wr> wrs_;
  std::vector<ibv_sge> sges_;
  uint64_t next_send_slot_ = 0;
  bool failed_ = false;
  bool closed_ = false;
  std::string first_error_;
};

}  // namespace hetmesh::detail
