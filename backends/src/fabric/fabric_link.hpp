// One fabric connection: the peer's address in the endpoint's address vector, the out-of-band
// socket it was set up over (the hello, then control messages, and its end says the peer is
// gone), and the link's writes in flight.
//
// A write goes as RMA writes of at most the provider's message size into the peer's region (its
// host mirror where the region is device memory the NIC cannot reach), followed by a notice
// message when the peer must act: raise a notification, or copy the bytes from its mirror to the
// device. A notification alone rides on the last RMA write as its remote CQ data instead, where
// both ends take that (FabricEndpoint::notify_by_data) and no notice went before on the link
// (write()): one operation, one completion each side, where a notice doubled both (small writes
// over tcp: docs/benchmarks.md). Nothing may overtake the writes before it: where the provider
// keeps writes in order and sends after them (FI_ORDER_WAW, FI_ORDER_SAW) a link posts back to
// back, else each write or notice waits for the delivery-complete completions of the writes
// before it. Messages keep their order (FI_ORDER_SAS), so notifications arrive in issue order; so
// do notifications by data, all before the link's first notice: their writes land in order
// (FI_ORDER_WAW), and the provider reports each as it lands (rxm: one connection per peer, read
// in order; comp_order itself promises nothing); write_done events are raised in issue order
// too. A link whose writes stop completing for io_timeout fails.
//
// (A small write carried inside its message would save a trip, but its bytes would land when the
// peer's CPU takes the message, after a later write's RMA to the same place could have.)
#pragma once

#include "common/socket_link.hpp"
#include "fabric/fabric_shared.hpp"

#include <hetmesh/transport/transport.hpp>

#include <atomic>
#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>

namespace hetmesh::detail {

class FabricLink : public std::enable_shared_from_this<FabricLink> {
 public:
  using Clock = std::chrono::steady_clock;

  FabricLink(ConnectionId id, std::shared_ptr<FabricShared> shared, std::string peer_id, Fd socket);
  ~FabricLink();
  FabricLink(const FabricLink&) = delete;
  FabricLink& operator=(const FabricLink&) = delete;

  ConnectionId id() const { return id_; }
  bool alive() const { return alive_; }

  // Swaps hellos with the peer over the socket and puts its address in the address vector.
  // Throws Error (HM_ERR_TIMEOUT past `deadline`, kStatusProtocolError for a bad hello).
  void setup(Clock::time_point deadline);
  // Starts the thread that reads control frames and watches the socket.
  void start();
  // The user dropped the Connection: stop the thread, fail what is in flight.
  void close();

  std::shared_ptr<RemoteRegion> import_region(const RegionDescriptor& descriptor);
  void write(const Region& src, uint64_t src_offset, const RemoteRegion& dst, uint64_t dst_offset,
             uint64_t length, std::optional<uint32_t> notify, uint64_t cookie);
  // False, sending nothing, when `wait` is false and another send holds the socket.
  bool send_control(std::span<const uint8_t> message, bool wait);

  // --- called with the shared progress_mutex held ---

  // Posts what waits, in order, as far as the provider takes it. False if the provider refused
  // one for now (-FI_EAGAIN): the progress thread retries.
  bool post_locked();
  // An operation of this link completed (or failed, with `error`).
  void completed_locked(FabricOp& op, const std::string* error);
  // A message from the peer (its header checked for this link and token) with `bytes` after the
  // header; applies it.
  void received_locked(const MessageHeader& header, uint64_t bytes);
  // A write of the peer's landed with a notification as its data (notify_data), for this link.
  void received_data_locked(uint64_t data);
  // Fails the link once: what is in flight fails (write_done with `status`), and a peer_lost
  // event says why.
  void fail_locked(const std::string& reason, hm_status status = kStatusPeerLost);
  // Fails the link if writes are pending and none completed for io_timeout.
  void check_stall_locked(Clock::time_point now);
  uint64_t token() const { return token_; }

 private:
  struct Post {
    FabricOp* op;
    // kWrite: the local bytes and the remote place; kSend: the slot's `bytes`.
    const uint8_t* local = nullptr;
    void* desc = nullptr;
    uint64_t bytes = 0;
    uint64_t remote = 0;
    uint64_t key = 0;
    std::optional<uint64_t> data;  // kWrite: remote CQ data (a notification) to carry
  };
  struct Pending {
    uint64_t seq;
    uint64_t cookie;
    uint32_t ops;  // not yet completed
  };

  // A send buffer for a notice, waiting up to io_timeout; throws naming this peer if it is the
  // one that stopped taking them.
  uint32_t take_send_slot();
  FabricOp* new_op(FabricOp::Kind kind, uint64_t seq, uint32_t slot = 0);
  // Raises write_done for the writes at the front whose operations are all done.
  void retire_locked();
  // The socket thread: control frames until the socket ends.
  void receive();
  // The socket ended or broke: let the progress thread deliver what came first, then fail.
  void lose(const std::string& reason);

  ConnectionId id_;
  std::shared_ptr<FabricShared> shared_;
  std::string peer_id_;
  Fd socket_;
  uint64_t token_;                // what the peer puts in its messages to us
  uint64_t peer_token_ = 0;       // what we put in ours
  uint32_t wire_id_ = 0;          // our number on the wire, set in setup (unique in shared_->links)
  uint32_t peer_link_ = 0;        // the peer's
  bool peer_takes_data_ = false;  // its hello's kTakesNotifyData
  // A notice was queued: notifications go as notices from then on (write()). Set under
  // shared_->progress_mutex.
  std::atomic<bool> notice_sent_{false};
  fi_addr_t peer_ = FI_ADDR_NOTAVAIL;
  std::mutex send_mutex_;  // socket writes
  std::atomic<bool> alive_{true};
  std::atomic<bool> closing_{false};
  std::thread receiver_;

  // Guarded by shared_->progress_mutex.
  std::deque<Post> queue_;
  std::deque<Pending> pending_;
  uint64_t next_seq_ = 0;
  uint32_t writes_in_flight_ = 0;  // RMA writes posted, not completed
  uint64_t writing_ = 0;           // the user write those belong to
  Clock::time_point progress_at_;  // the last completion, or when the link last went busy
  bool failed_ = false;
  bool waiting_ = false;  // in shared_->waiting
};

}  // namespace hetmesh::detail
