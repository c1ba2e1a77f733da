// One ipc connection: the writes and control messages it issues, in order.
//
// A write reaches the peer's memory by one of three routes:
//  - host copy:   the peer's region was exported with its plugin's IPC handle, this process has
//                 that plugin, and both sides are host-addressable (cpu device memory, pinned host
//                 memory): a plain memcpy into the mapping does it, in write() itself up to
//                 kInlineCopyBytes when nothing is pending, else on the completion thread;
//  - device copy: one copy engine reaches both sides, and does it with memcpy_async on the
//                 connection's stream for that device (a "lane"); an event recorded behind it
//                 tells the completion thread when the bytes have landed. The engine is the
//                 mapping's plugin's when the source is its device memory, or host memory
//                 (registered with that plugin where it registers host memory); or the source
//                 device's own when the mapping is host memory (a peer's cpu memory or pinned
//                 memory), which it registers likewise: one DMA, device to the peer's host
//                 memory or host to the peer's device memory, where two plugins meet;
//  - the ring:    everything else (different plugins on the two sides, memory without IPC) goes
//                 through the staging ring the writer owns: the completion thread copies the source
//                 into a free slot (through a bounce buffer for device memory the host cannot
//                 address) and sends a chunk frame; the peer copies the slot into the region and
//                 hands the slot back on the ring's credit channel.
// Either way the notification frame and write_done follow the bytes.
//
// Order, as on tcp or an RDMA queue pair: writes retire in the order they were issued, whichever
// way each goes (one completion thread per connection, or write() itself when nothing is queued
// ahead), so notifications arrive in issue order; a control message sent while writes are pending
// queues behind them. Bytes land in issue order too: a write that goes straight into the peer's
// memory after ring traffic waits until the peer has handed back every ring slot, i.e. landed
// every earlier chunk (see write()). Every wait is bounded; a dead or misbehaving peer becomes
// one peer_lost event and fails the writes still queued.
//
// This file is the ordered queue of operations and the completion thread that retires them; the
// choice of route and the lanes are in ipc_routes.*, the ring's writer end in ipc_ring_writer.*.
#include "ipc/ipc_connection.hpp"

#include "ipc/ipc_ring_writer.hpp"
#include "ipc/ipc_routes.hpp"

#include "common/descriptor.hpp"
#include "common/region_cast.hpp"
#include "common/transports.hpp"

#include <hetmesh/core/log.hpp>
#include <hetmesh/core/spin.hpp>
#include <hetmesh/core/thread.hpp>

#include <pthread.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <optional>
#include <thread>

namespace hetmesh::detail {
namespace {

// Host copies up to this size are made by write() itself when no earlier write's bytes are still
// on their way (as a shared-memory transport that copies in the caller would): handing them to the
// completion thread costs a thread wake-up per write, a fifth of the time of a 1 MiB copy. Larger
// writes stay fully asynchronous.
constexpr uint64_t kInlineCopyBytes = 4 << 20;

// A write between write() and its write_done event, or a control message waiting for the writes
// before it.
struct PendingOp {
  IpcRoute route = IpcRoute::ring;
  IpcLane* lane = nullptr;  // device_copy
  // Kept alive until the write retires: the copy engine or the ring copy may still read the
  // source, and the peer's mapping must stay while a copy writes into it.
  std::shared_ptr<const IpcRegion> src;
  std::shared_ptr<const IpcRemoteRegion> dst;
  uint64_t src_offset = 0;
  uint64_t dst_offset = 0;
  uint64_t length = 0;
  std::optional<uint32_t> notify;
  uint64_t cookie = 0;
  bool landed = false;    // host_copy: write() already copied the bytes
  bool deferred = false;  // device_copy: the completion thread starts the copy, after the ring
  std::vector<uint8_t> payload;  // control; its capacity is kept for the slot's next message
};

class IpcConnection : public Connection {
 public:
  IpcConnection(std::shared_ptr<IpcShared> shared, std::shared_ptr<IpcLink> link)
      : Connection(link->id()),
        shared_(std::move(shared)),
        link_(std::move(link)),
        peer_id_(link_->peer_id()),
        ring_(*link_),
        routes_(shared_, peer_id_),
        queue_(kMaxInFlight) {
    // Both rings registered now with the copy engines of the regions registered so far (an
    // engine's slots), not at their first chunk: a registration (cuMemHostRegister) may wait for
    // the device's streams, and a stream that a device-triggered round trip holds until this
    // connection's data lands would then never let it finish (seen on the H200: the first
    // chunk's registration in the comm thread, every peer then "hung").
    for (const Device& device : shared_->copy_engine_devices()) {
      link_->register_ring_with(device);
      ring_.register_with(device);
    }
    progress_ = start_thread("hm-ipc-progress", [this] { link_->run_progress(); });
    try {
      completer_ = start_thread("hm-ipc-complete", [this] { complete_in_order(); });
    } catch (...) {  // the progress thread ends with its link; a running one would abort here
      link_->close();
      progress_.join();
      throw;
    }
    shared_->add_link(link_);
  }

  ~IpcConnection() override {
    if (held_inline_.exchange(false)) {  // a run its caller left open: what landed is told
      try {
        link_->flush();
      } catch (const Error&) {  // the peer is gone: nobody to tell
      }
    }
    {
      std::lock_guard lock(queue_mutex_);
      link_->close();
    }
    queued_.notify_all();
    // The completion thread drains what is queued (failing it), waiting for copies still in
    // flight, so nothing below is destroyed under a running copy.
    completer_.join();
    progress_.join();
    // No poller reads the link once it is off the list and the one that may hold it lets go.
    shared_->remove_link(link_.get());
    link_->quiesce();
  }

  bool alive() const override { return link_->alive(); }

  std::shared_ptr<RemoteRegion> import_region(const RegionDescriptor& descriptor) override {
    RegionDescriptorFields d = read_region_descriptor(descriptor, "ipc", peer_id_);
    auto remote = std::make_shared<IpcRemoteRegion>(this, d.region, d.size);
    if (d.document.contains("handle")) routes_.map_peer_memory(*remote, d.document);
    log(LogLevel::debug, "ipc: region {} of peer {} ({} bytes): {}", remote->id, peer_id_,
        remote->size(),
        remote->lane ? fmt::format("mapped through {} for zero-copy writes{}",
                                   remote->lane->device.selector(),
                                   remote->host_addressable ? " (host-addressable)" : "")
                     : std::string("reached through the shared ring"));
    return remote;
  }

  using Connection::write;  // the overload without `more`
  void write(const Region& src, uint64_t src_offset, const RemoteRegion& dst, uint64_t dst_offset,
             uint64_t length, std::optional<uint32_t> notify, uint64_t cookie, bool more) override {
    // A write without `more` ends a run: what earlier writes held goes first (their bytes have
    // landed), so it goes even if this write is refused below.
    if (!more) flush_held();
    auto* source = region_cast<const IpcRegion>(src);
    auto* target = region_cast<const IpcRemoteRegion>(dst);
    if (source == nullptr || target == nullptr)
      throw Error(HM_ERR_INVALID_ARGUMENT, "write: regions were not made by this ipc transport");
    if (target->owner != this)
      throw Error(HM_ERR_INVALID_ARGUMENT,
                  fmt::format("write: destination region {} was imported on another connection",
                              target->id));
    check_write_range("source", src_offset, length, src.size());
    check_write_range("destination", dst_offset, length, dst.size());
    if (!link_->alive())
      throw Error(kStatusPeerLost, fmt::format("write: peer {} is lost", peer_id_));

    IpcLane* lane = nullptr;
    IpcRoute route = routes_.route_for(*source, *target, &lane);
    uint8_t* to = target->mapped + dst_offset;
    const uint8_t* from = static_cast<const uint8_t*>(source->base()) + src_offset;
    std::unique_lock lock(queue_mutex_);
    size_t slot = claim_slot(lock, "write");
    if (route == IpcRoute::host_copy && head_ == tail_ && ring_.drained() &&
        length <= kInlineCopyBytes)
      return write_now(to, from, length, notify, cookie, target->id, more);
    // Bytes land in issue order. Ring bytes land when the peer's reader gets to them, so a write
    // that goes straight into the peer's memory while ring bytes may still be on their way is
    // left to the completion thread, which first waits for every ring slot to come back. (Host
    // and device copies never meet: a mapping is host-addressable or it is not.)
    bool ring_busy = ring_writes_queued_ > 0 || !ring_.drained();
    bool landed = false, deferred = false;
    switch (route) {
      case IpcRoute::device_copy:
        // A later copy must not overtake it: one on another engine's stream waits until the
        // copies before it have landed.
        deferred =
            ring_busy || deferred_copies_ > 0 || (copies_pending_ > 0 && copies_lane_ != lane);
        if (!deferred) start_copy(*lane, slot, to, from, length);  // in the stream, in order
        deferred_copies_ += deferred;
        ++copies_pending_;
        copies_lane_ = lane;
        break;
      case IpcRoute::host_copy:
        // Host and device copies meet in a host-addressable mapping that device sources write
        // too: a host copy lands by itself only when no device copy is still on its way.
        landed = length <= kInlineCopyBytes && !ring_busy && host_copies_queued_ == 0 &&
                 copies_pending_ == 0;
        if (landed) std::memcpy(to, from, length);
        host_copies_queued_ += !landed;
        break;
      case IpcRoute::ring:
        ++ring_writes_queued_;
        break;
      case IpcRoute::control:
        break;
    }
    PendingOp& op = queue_[slot];
    op.route = route;
    op.lane = lane;
    op.src = source->shared_from_this();
    op.dst = target->shared_from_this();
    op.src_offset = src_offset;
    op.dst_offset = dst_offset;
    op.length = length;
    op.notify = notify;
    op.cookie = cookie;
    op.landed = landed;
    op.deferred = deferred;
    publish(lock);
  }

  void send_control(std::span<const uint8_t> message) override {
    control(message, /*may_wait=*/true);
  }

  bool try_send_control(std::span<const uint8_t> message) override {
    return control(message, /*may_wait=*/false);
  }

 private:
  // Sends at once when nothing is pending; else queues behind the pending writes, waiting for a
  // free slot, unless !may_wait: then it sends nothing and returns false (writes are on their way).
  bool control(std::span<const uint8_t> message, bool may_wait) {
    if (message.size() > kMaxControlBytes)
      throw Error(HM_ERR_INVALID_ARGUMENT, fmt::format("control message of {} bytes exceeds {}",
                                                       message.size(), kMaxControlBytes));
    if (!link_->alive())
      throw Error(kStatusPeerLost, fmt::format("send_control: peer {} is lost", peer_id_));
    std::unique_lock lock(queue_mutex_);
    if (head_ == tail_) {
      // Nothing pending, and no write can start while we hold the lock: it may go right away.
      try {
        send_control_frame(message.data(), message.size());
      } catch (const Error& e) {
        lock.unlock();
        link_->lost_on_send(e.what());
        throw;
      }
      return true;
    }
    if (!may_wait) return false;
    size_t slot = claim_slot(lock, "send_control");
    PendingOp& op = queue_[slot];
    op.route = IpcRoute::control;
    op.landed = false;  // the slot's previous write must not count in the landing order
    op.deferred = false;
    op.payload.assign(message.begin(), message.end());
    publish(lock);
    return true;
  }

  // A host copy with nothing pending ahead of it, the common case: the bytes, the notification
  // and write_done all go now, in the caller's thread, with no thread hop, no system call and no
  // allocation (a peer that polls reads the notification straight from shared memory). With
  // `more`, the notification is put in the ring and published with the run's last.
  void write_now(uint8_t* to, const uint8_t* from, uint64_t length, std::optional<uint32_t> notify,
                 uint64_t cookie, uint32_t region, bool more) {
    std::memcpy(to, from, length);
    TransportEvent done{TransportEvent::Type::write_done, id()};
    done.cookie = cookie;
    try {
      link_->check_open();
      if (notify) {
        link_->send_notification(*notify, more);
        held_inline_.store(more, std::memory_order_relaxed);  // without: it published the run
      }
    } catch (const Error& e) {
      done.status = e.status();
      done.message =
          fmt::format("write {} to region {} of peer {}: {}", cookie, region, peer_id_, e.what());
      link_->lost_on_send(e.what());
    }
    shared_->events.push(std::move(done));
  }

  // ---- issuing writes ----

  // Publishes the notifications that earlier inline writes with `more` held, if any. A failure
  // loses the peer (the writes still queued then fail through their write_done).
  void flush_held() {
    if (!held_inline_.load(std::memory_order_relaxed) || !held_inline_.exchange(false)) return;
    try {
      link_->flush();
    } catch (const Error& e) {
      link_->lost_on_send(e.what());
    }
  }

  // Waits (bounded) for room in the queue; returns the slot the next operation goes to.
  size_t claim_slot(std::unique_lock<std::mutex>& lock, const char* what) {
    if (tail_ - head_ < kMaxInFlight) return tail_ % kMaxInFlight;  // no clock read: the usual case
    if (!space_.wait_for(lock, kProgressTimeout, [&] { return tail_ - head_ < kMaxInFlight; }))
      throw Error(HM_ERR_TIMEOUT,
                  fmt::format("{}: {} operations to peer {} still pending after {} s", what,
                              kMaxInFlight, peer_id_, kProgressTimeout.count()));
    return tail_ % kMaxInFlight;
  }

  // Hands the operation in the claimed slot to the completion thread.
  void publish(std::unique_lock<std::mutex>& lock) {
    ++tail_;
    published_.store(tail_, std::memory_order_release);
    lock.unlock();
    queued_.notify_one();
  }

  void start_copy(const IpcLane& lane, size_t slot, uint8_t* dst, const uint8_t* src,
                  uint64_t length) {
    lane.stream.copy(dst, src, length);
    try {
      lane.events[slot].record(lane.stream);
    } catch (const Error&) {
      // The copy is under way with nothing to track it: let it finish before the caller may
      // reuse the source.
      try {
        lane.stream.synchronize(kProgressTimeout);
      } catch (const Error&) {
      }
      throw;
    }
  }

  // ---- retiring writes (the completion thread) ----

  void complete_in_order() {
    for (;;) {
      PendingOp* op;
      size_t slot;
      await_queued();
      {
        std::lock_guard lock(queue_mutex_);
        if (head_ == tail_) return;  // closing, and nothing left
        slot = head_ % kMaxInFlight;
        op = &queue_[slot];  // callers touch only slots past head_ until head_ moves
      }
      if (op->route == IpcRoute::control)
        send_queued_control(*op);
      else
        retire_now(*op, slot);
      {
        std::lock_guard lock(queue_mutex_);
        host_copies_queued_ -= op->route == IpcRoute::host_copy && !op->landed;
        ring_writes_queued_ -= op->route == IpcRoute::ring;
        copies_pending_ -= op->route == IpcRoute::device_copy;
        deferred_copies_ -= op->deferred;
        ++head_;
      }
      space_.notify_one();
    }
  }

  // Waits until an operation is queued or the connection closes: spinning first while writes
  // come back to back (see hetmesh/core/spin.hpp), as a thread hop per write would cost more than a
  // copy between GPUs. head_ is this thread's own.
  void await_queued() {
    TimedWait wait(spin_);
    if (wait.spin([&] {
          return published_.load(std::memory_order_acquire) != head_ || link_->closing();
        }))
      return;
    std::unique_lock lock(queue_mutex_);
    queued_.wait(lock, [&] { return head_ != tail_ || link_->closing(); });
  }

  // Finishes a write and reports it; its region references go before the report, so a caller who
  // drops a region after write_done really frees it.
  void retire_now(PendingOp& op, size_t slot) {
    TransportEvent done = retire(op, slot);
    op.src.reset();
    op.dst.reset();
    shared_->events.push(std::move(done));
  }

  // send_control has returned already: a failure is reported as the peer's loss.
  void send_queued_control(const PendingOp& op) {
    try {
      link_->check_open();
      send_control_frame(op.payload.data(), op.payload.size());
    } catch (const Error& e) {
      link_->lost_on_send(e.what());
    }
  }

  TransportEvent retire(const PendingOp& w, size_t slot) {
    TransportEvent done{TransportEvent::Type::write_done, id()};
    done.cookie = w.cookie;
    try {
      switch (w.route) {
        case IpcRoute::host_copy:
          copy_by_host(w);
          break;
        case IpcRoute::device_copy:
          finish_device_copy(w, slot);
          break;
        case IpcRoute::ring:
          ring_.send(*w.src, w.src_offset, w.dst->id, w.dst_offset, w.length, w.notify);
          break;
        case IpcRoute::control:
          break;  // never retired here
      }
    } catch (const Error& e) {
      // Whatever failed (the peer, a copy engine, a ring slot taken but never announced), the
      // ordered stream of writes is broken, so the connection ends here.
      done.status = e.status();
      done.message = fmt::format("write {} to region {} of peer {}: {}", w.cookie, w.dst->id,
                                 peer_id_, e.what());
      link_->lost_on_send(e.what());
    }
    return done;
  }

  void copy_by_host(const PendingOp& w) {
    link_->check_open();
    if (!w.landed) {
      ring_.drain();
      std::memcpy(w.dst->mapped + w.dst_offset,
                  static_cast<const uint8_t*>(w.src->base()) + w.src_offset, w.length);
    }
    if (w.notify) send_notification(*w.notify);
  }

  void finish_device_copy(const PendingOp& w, size_t slot) {
    if (w.deferred) {
      ring_.drain();
      start_copy(*w.lane, slot, w.dst->mapped + w.dst_offset,
                 static_cast<const uint8_t*>(w.src->base()) + w.src_offset, w.length);
    }
    try {
      w.lane->events[slot].synchronize(kProgressTimeout);
    } catch (const Error& e) {
      throw Error(e.status(), fmt::format("the {} copy into the peer's memory did not finish: {}",
                                          w.lane->device.selector(), e.what()));
    }
    // The bytes are in the peer's memory, but a peer that is gone will never see them.
    link_->check_open();
    if (w.notify) send_notification(*w.notify);
  }

  void send_control_frame(const uint8_t* data, size_t size) {
    Frame f = make_frame(kControl);
    f.length = size;
    link_->send(f, data, size);
  }

  void send_notification(uint32_t value) { link_->send_notification(value); }

  std::shared_ptr<IpcShared> shared_;
  std::shared_ptr<IpcLink> link_;
  std::string peer_id_;
  RingWriter ring_;  // the completion thread's
  IpcRoutes routes_;

  // Operations in issue order: [head_, tail_) are pending, queue_[i % kMaxInFlight] holds the
  // i-th.
  std::mutex queue_mutex_;
  // An inline write with `more` held its notification back (the link's ring has it, unpublished):
  // the next write without `more`, or the end, publishes it.
  std::atomic<bool> held_inline_{false};
  std::condition_variable queued_;
  std::condition_variable space_;
  std::vector<PendingOp> queue_;
  uint64_t head_ = 0;
  uint64_t tail_ = 0;
  std::atomic<uint64_t> published_{0};  // tail_, for the completion thread's spin
  SpinPolicy spin_;                     // the completion thread's
  // Landing order (see write()): queued host copies the completion thread has yet to make, ring
  // writes not yet sent, and device copies it has yet to start.
  uint64_t host_copies_queued_ = 0;
  uint64_t ring_writes_queued_ = 0;
  uint64_t deferred_copies_ = 0;
  uint64_t copies_pending_ = 0;  // device copies not yet retired, the latest on copies_lane_
  const IpcLane* copies_lane_ = nullptr;

  std::thread progress_;
  std::thread completer_;
};

}  // namespace

std::shared_ptr<Connection> make_ipc_connection(std::shared_ptr<IpcShared> shared,
                                                std::shared_ptr<IpcLink> link) {
  return std::make_shared<IpcConnection>(std::move(shared), std::move(link));
}

}  // namespace hetmesh::detail
