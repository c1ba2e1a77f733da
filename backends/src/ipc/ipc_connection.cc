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
#include "ipc/ipc_connection.hpp"

#include "common/descriptor.hpp"
#include "common/region_cast.hpp"

#include <hetmesh/core/hex.hpp>
#include <hetmesh/core/log.hpp>
#include <hetmesh/core/spin.hpp>

#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

namespace hetmesh::detail {
namespace {

// A ring slot not back after this long: the peer's progress thread is woken (await_credit).
constexpr int kNudgeAfterMs = 1;
// Writes queued on one connection before write() waits for the oldest to retire.
constexpr size_t kMaxInFlight = 256;
// Host copies up to this size are made by write() itself when no earlier write's bytes are still
// on their way (as a shared-memory transport that copies in the caller would): handing them to the
// completion thread costs a thread wake-up per write, a fifth of the time of a 1 MiB copy. Larger
// writes stay fully asynchronous.
constexpr uint64_t kInlineCopyBytes = 4 << 20;

// The copy engine of one plugin on one connection. Zero-copy writes into that plugin's peer
// memory are enqueued on `stream`; events[i] marks the end of the write in queue slot i, so an
// event is never re-recorded before its write retired.
struct Lane {
  Device device;
  Stream stream;
  std::vector<Event> events;

  explicit Lane(const Device& d) : device(d), stream(d.create_stream()) {
    events.reserve(kMaxInFlight);
    for (size_t i = 0; i < kMaxInFlight; ++i)
      events.push_back(d.create_event(HM_EVENT_DISABLE_TIMING));
  }
};

class IpcRemoteRegion final : public RemoteRegion,
                              public std::enable_shared_from_this<IpcRemoteRegion> {
 public:
  IpcRemoteRegion(const void* connection, uint32_t region_id, uint64_t size)
      : RemoteRegion(size), owner(connection), id(region_id) {}
  const void* owner;  // the connection it was imported on
  uint32_t id;
  // Set when writes can go zero-copy: the lane whose device mapped the peer's allocation, where
  // byte 0 of the region lies in this process, and whether host code may write it there.
  Lane* lane = nullptr;
  std::optional<IpcMapping> mapping;
  uint8_t* mapped = nullptr;
  bool host_addressable = false;
  // A host-addressable mapping, registered with the plugins of the devices whose copy engines
  // write it. After `mapping`, so the registrations go before the mapping does.
  mutable std::optional<HostRegistrations> registered;
};

// How a write reaches the peer's memory, or that the queued operation is a control message.
enum class Route : uint8_t {
  host_copy,    // memcpy into the mapped peer memory, by write() or the completion thread
  device_copy,  // memcpy_async on a lane's stream into the mapped peer memory
  ring,         // through the shared ring, landed by the peer
  control       // a control message queued behind pending writes
};

// A write between write() and its write_done event, or a control message waiting for the writes
// before it.
struct PendingOp {
  Route route = Route::ring;
  Lane* lane = nullptr;  // device_copy
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
        rings_(link_->rings()),
        credits_(rings_.outgoing.slots()),
        ring_registered_(rings_.outgoing.slot(0),
                         uint64_t{rings_.outgoing.slots()} * rings_.outgoing.slot_bytes(),
                         fmt::format("ipc: the staging ring to peer {}", peer_id_)),
        queue_(kMaxInFlight) {
    progress_ = std::thread([this] {
      pthread_setname_np(pthread_self(), "hm-ipc-progress");
      link_->run_progress();
    });
    completer_ = std::thread([this] {
      pthread_setname_np(pthread_self(), "hm-ipc-complete");
      complete_in_order();
    });
    shared_->add_link(link_);
  }

  ~IpcConnection() override {
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
    if (d.document.contains("handle")) map_peer_memory(*remote, d.document);
    log(LogLevel::debug, "ipc: region {} of peer {} ({} bytes): {}", remote->id, peer_id_,
        remote->size(),
        remote->lane ? fmt::format("mapped through {} for zero-copy writes{}",
                                   remote->lane->device.selector(),
                                   remote->host_addressable ? " (host-addressable)" : "")
                     : std::string("reached through the shared ring"));
    return remote;
  }

  void write(const Region& src, uint64_t src_offset, const RemoteRegion& dst, uint64_t dst_offset,
             uint64_t length, std::optional<uint32_t> notify, uint64_t cookie) override {
    auto* source = region_cast<const IpcRegion>(src);
    auto* target = region_cast<const IpcRemoteRegion>(dst);
    if (source == nullptr || target == nullptr)
      throw Error(HM_ERR_INVALID_ARGUMENT, "write: regions were not made by this ipc transport");
    if (target->owner != this)
      throw Error(HM_ERR_INVALID_ARGUMENT,
                  fmt::format("write: destination region {} was imported on another connection",
                              target->id));
    check_range("source", src_offset, length, src.size());
    check_range("destination", dst_offset, length, dst.size());
    if (!link_->alive())
      throw Error(kStatusPeerLost, fmt::format("write: peer {} is lost", peer_id_));

    Lane* lane = nullptr;
    Route route = route_for(*source, *target, &lane);
    uint8_t* to = target->mapped + dst_offset;
    const uint8_t* from = static_cast<const uint8_t*>(source->base()) + src_offset;
    std::unique_lock lock(queue_mutex_);
    size_t slot = claim_slot(lock, "write");
    if (route == Route::host_copy && head_ == tail_ && ring_drained_ && length <= kInlineCopyBytes)
      return write_now(to, from, length, notify, cookie, target->id);
    // Bytes land in issue order. Ring bytes land when the peer's reader gets to them, so a write
    // that goes straight into the peer's memory while ring bytes may still be on their way is
    // left to the completion thread, which first waits for every ring slot to come back. (Host
    // and device copies never meet: a mapping is host-addressable or it is not.)
    bool ring_busy = ring_writes_queued_ > 0 || !ring_drained_;
    bool landed = false, deferred = false;
    switch (route) {
      case Route::device_copy:
        // A later copy must not overtake it: one on another engine's stream waits until the
        // copies before it have landed.
        deferred =
            ring_busy || deferred_copies_ > 0 || (copies_pending_ > 0 && copies_lane_ != lane);
        if (!deferred) start_copy(*lane, slot, to, from, length);  // in the stream, in order
        deferred_copies_ += deferred;
        ++copies_pending_;
        copies_lane_ = lane;
        break;
      case Route::host_copy:
        // Host and device copies meet in a host-addressable mapping that device sources write
        // too: a host copy lands by itself only when no device copy is still on its way.
        landed = length <= kInlineCopyBytes && !ring_busy && host_copies_queued_ == 0 &&
                 copies_pending_ == 0;
        if (landed) std::memcpy(to, from, length);
        host_copies_queued_ += !landed;
        break;
      case Route::ring:
        ++ring_writes_queued_;
        break;
      case Route::control:
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
    op.route = Route::control;
    op.landed = false;  // the slot's previous write must not count in the landing order
    op.deferred = false;
    op.payload.assign(message.begin(), message.end());
    publish(lock);
    return true;
  }

  static void check_range(const char* side, uint64_t offset, uint64_t length, uint64_t size) {
    if (offset > size || length > size - offset)
      throw Error(HM_ERR_INVALID_ARGUMENT,
                  fmt::format("write: {} range [{}, +{}) is outside its region of {} bytes", side,
                              offset, length, size));
  }

  // A host copy with nothing pending ahead of it, the common case: the bytes, the notification
  // and write_done all go now, in the caller's thread, with no thread hop, no system call and no
  // allocation (a peer that polls reads the notification straight from shared memory).
  void write_now(uint8_t* to, const uint8_t* from, uint64_t length, std::optional<uint32_t> notify,
                 uint64_t cookie, uint32_t region) {
    std::memcpy(to, from, length);
    TransportEvent done{TransportEvent::Type::write_done, id()};
    done.cookie = cookie;
    try {
      check_open();
      if (notify) link_->send_notification(*notify);
    } catch (const Error& e) {
      done.status = e.status();
      done.message =
          fmt::format("write {} to region {} of peer {}: {}", cookie, region, peer_id_, e.what());
      link_->lost_on_send(e.what());
    }
    shared_->events.push(std::move(done));
  }

  // ---- setup ----

  // The lane for `plugin`, created on first use: on the device of a region this process
  // registered with that plugin, else on the plugin's device 0. nullptr if this process has no
  // such plugin (the ring then carries the writes).
  Lane* lane_for(const std::string& plugin) {
    std::optional<Device> device = shared_->registered_device_of(plugin);
    if (!device) {
      auto loaded = PluginRegistry::load().find(plugin);
      if (!loaded || loaded->device_count() == 0) return nullptr;
      device.emplace(loaded, 0);
    }
    return lane_on(*device);
  }

  // The lane on `device`, created on first use: one stream per device, so copies by one engine
  // land in the order they were issued.
  Lane* lane_on(const Device& device) {
    std::lock_guard lock(lanes_mutex_);
    auto& lane = lanes_[device.selector()];
    if (!lane) lane = std::make_unique<Lane>(device);
    return lane.get();
  }

  // The lane of `device`'s copy engine for writes into `dst`, a host-addressable mapping
  // registered with that plugin; nullptr if the plugin refused (the ring then carries them).
  Lane* writer_lane(const IpcRemoteRegion& dst, const Device& device) {
    if (!dst.registered || !dst.registered->ensure(device)) return nullptr;
    return lane_on(device);
  }

  // Opens the peer's allocation for zero-copy writes. A handle this process cannot open (no such
  // plugin here, or a plugin that refuses it, as CUDA does within one process) leaves the region
  // on the ring; a descriptor that claims more than the allocation holds is refused.
  void map_peer_memory(IpcRemoteRegion& remote, const nlohmann::json& d) {
    auto plugin = field<std::string>(d, "plugin", kRegionDescriptor);
    hm_ipc_handle handle{};
    from_hex(field<std::string>(d, "handle", kRegionDescriptor), handle.bytes,
             "region descriptor's 'handle'");
    auto offset = field<uint64_t>(d, "offset", kRegionDescriptor);
    Lane* lane = nullptr;
    std::optional<IpcMapping> mapping;
    PointerInfo info;
    try {
      lane = lane_for(plugin);
      if (lane == nullptr) {
        log(LogLevel::info,
            "ipc: no {} device in this process; region {} of peer {} goes through the ring", plugin,
            remote.id, peer_id_);
        return;
      }
      mapping.emplace(lane->device, handle);
      info = lane->device.query(mapping->data());
    } catch (const Error& e) {
      log(LogLevel::info, "ipc: cannot map region {} of peer {} ({}); it goes through the ring",
          remote.id, peer_id_, e.what());
      return;
    }
    // Without the mapping's extent the descriptor's offset and size cannot be checked.
    bool mapped = info.kind == HM_MEM_IPC_MAPPED || info.kind == HM_MEM_IPC_MAPPED_HOST;
    if (!mapped || info.base != mapping->data()) {
      log(LogLevel::warn,
          "ipc: {}: pointer_query does not describe the IPC mapping {} of region {} of peer {}; "
          "the region goes through the ring",
          lane->device.selector(), mapping->data(), remote.id, peer_id_);
      return;
    }
    if (offset > info.size || remote.size() > info.size - offset)
      throw Error(HM_ERR_INVALID_ARGUMENT,
                  fmt::format("region descriptor of region {}: [{}, +{}) overruns the exported "
                              "allocation of {} bytes",
                              remote.id, offset, remote.size(), info.size));
    remote.mapped = static_cast<uint8_t*>(mapping->data()) + offset;
    remote.host_addressable = host_addressable(lane->device, mapping->data());
    if (remote.host_addressable)
      remote.registered.emplace(mapping->data(), info.size,
                                fmt::format("ipc: region {} of peer {}", remote.id, peer_id_));
    remote.mapping.emplace(std::move(*mapping));
    remote.lane = lane;
  }

  // ---- issuing writes ----

  // Zero-copy needs the peer's memory mapped here, and either host code able to reach both sides
  // or one copy engine that reaches both: the mapping's plugin's (for its own device memory, on
  // the source's device or with peer copy, or for host memory), or, into a host-addressable
  // mapping, the source device's. Anything else is staged through the ring.
  Route route_for(const IpcRegion& src, const IpcRemoteRegion& dst, Lane** lane) {
    if (dst.lane == nullptr) return Route::ring;
    const bool host_source = src.access().direct();
    if (dst.host_addressable && host_source) return Route::host_copy;
    const Device& engine = dst.lane->device;
    if (src.device().plugin_ptr() == engine.plugin_ptr()) {
      if (src.device().index() != engine.index() && !engine.has(HM_CAP_PEER_COPY))
        return Route::ring;
      *lane = dst.lane;
      return Route::device_copy;
    }
    if (host_source && src.reachable_by(engine)) {  // host memory into the peer's device memory
      *lane = dst.lane;
      return Route::device_copy;
    }
    if (dst.host_addressable) {  // device memory into the peer's host memory
      *lane = writer_lane(dst, src.device());
      if (*lane != nullptr) return Route::device_copy;
    }
    return Route::ring;
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

  void start_copy(const Lane& lane, size_t slot, uint8_t* dst, const uint8_t* src,
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
      if (op->route == Route::control)
        send_queued_control(*op);
      else
        retire_now(*op, slot);
      {
        std::lock_guard lock(queue_mutex_);
        host_copies_queued_ -= op->route == Route::host_copy && !op->landed;
        ring_writes_queued_ -= op->route == Route::ring;
        copies_pending_ -= op->route == Route::device_copy;
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
      check_open();
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
        case Route::host_copy:
          copy_by_host(w);
          break;
        case Route::device_copy:
          finish_device_copy(w, slot);
          break;
        case Route::ring:
          send_through_ring(w);
          break;
        case Route::control:
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
    check_open();
    if (!w.landed) {
      drain_ring();
      std::memcpy(w.dst->mapped + w.dst_offset,
                  static_cast<const uint8_t*>(w.src->base()) + w.src_offset, w.length);
    }
    if (w.notify) send_notification(*w.notify);
  }

  void finish_device_copy(const PendingOp& w, size_t slot) {
    if (w.deferred) {
      drain_ring();
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
    check_open();
    if (w.notify) send_notification(*w.notify);
  }

  void send_control_frame(const uint8_t* data, size_t size) {
    Frame f = make_frame(kControl);
    f.length = size;
    link_->send(f, data, size);
  }

  void send_notification(uint32_t value) { link_->send_notification(value); }

  // Throws for writes still pending when the connection closes or the peer is lost.
  void check_open() const {
    if (link_->closing())
      throw Error(kStatusPeerLost, "the connection was closed before the write ended");
    if (!link_->alive()) throw Error(kStatusPeerLost, "the peer was lost before the write ended");
  }

  // Copies the source slot by slot into the outgoing ring, each slot announced by a chunk frame.
  // A slot is taken before the source is touched: the source's bounce buffer is then held only
  // for the copy, never while waiting on the peer, whose progress may need our reader thread to
  // land a chunk through that same buffer.
  void send_through_ring(const PendingOp& w) {
    if (w.length == 0) {
      check_open();
      if (w.notify) send_notification(*w.notify);
      return;
    }
    ring_drained_ = false;  // before the first chunk: write() must never see it too early
    for (uint64_t sent = 0; sent < w.length;) {
      uint64_t n = std::min(w.length - sent, rings_.outgoing.slot_bytes());
      uint16_t slot = take_slot();
      // Straight into the slot: by the host, or by the source device's copy engine (the ring
      // registered with it), while the peer lands the chunk before.
      if (!w.src->access().direct()) ring_registered_.ensure(w.src->device());
      w.src->access().copy_out(w.src_offset + sent, n, rings_.outgoing.slot(slot));
      Frame f = make_frame(kChunk);
      f.slot = slot;
      f.region = w.dst->id;
      f.offset = w.dst_offset + sent;
      f.length = n;
      sent += n;
      if (sent == w.length) {
        f.flags = kLastChunk | (w.notify ? kWithNotify : 0);
        f.value = w.notify.value_or(0);
      }
      link_->send(f);
    }
  }

  // A free slot of the outgoing ring, waiting for the peer to return one if none is. The peer
  // handles chunks in order, so slots come back in the order they went out and the next free
  // slot is always the oldest. Only the completion thread calls this.
  uint16_t take_slot() {
    while (credits_ == 0)
      await_credit();
    --credits_;
    auto slot = static_cast<uint16_t>(next_slot_);
    next_slot_ = (next_slot_ + 1) % rings_.outgoing.slots();
    return slot;
  }

  // Waits until the peer has handed back every slot, i.e. landed every chunk sent so far.
  void drain_ring() {
    if (ring_drained_) return;
    while (credits_ < rings_.outgoing.slots())
      await_credit();
    ring_drained_ = true;
  }

  // Waits for the peer to hand back a slot. A slot that is not back within kNudgeAfter may be
  // waiting for a reader that is not there (the peer's application stopped polling and its
  // poller left without asking for wake-ups): its progress thread is woken to land the chunks.
  void await_credit() {
    int fd = rings_.credits_in.get();
    pollfd readable{fd, POLLIN, 0};
    int ready;
    do {
      ready = ::poll(&readable, 1, kNudgeAfterMs);
    } while (ready < 0 && errno == EINTR);
    if (ready == 0) {
      check_open();
      link_->nudge();
      do {
        ready = ::poll(&readable, 1, static_cast<int>(kProgressTimeout.count() * 1000));
      } while (ready < 0 && errno == EINTR);
    }
    check_open();  // woken by close() or lose()
    if (ready == 0)
      throw Error(HM_ERR_TIMEOUT, fmt::format("peer {} returned no ring slot within {} s", peer_id_,
                                              kProgressTimeout.count()));
    uint32_t slot = 0;
    ssize_t n = recv(fd, &slot, sizeof slot, MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR))
      throw Error(kStatusPeerLost, "the peer closed its ring credit channel");
    if (n < 0) return;  // spurious wake-up
    if (n != sizeof slot || slot != returned_slot_)
      throw Error(kStatusProtocolError, fmt::format("peer returned ring slot {}, expected slot {}",
                                                    slot, returned_slot_));
    returned_slot_ = (returned_slot_ + 1) % rings_.outgoing.slots();
    ++credits_;
  }

  std::shared_ptr<IpcShared> shared_;
  std::shared_ptr<IpcLink> link_;
  std::string peer_id_;
  RingLink& rings_;  // the link's
  // Outgoing ring bookkeeping, touched by the completion thread only.
  uint32_t credits_;
  uint32_t next_slot_ = 0;
  uint32_t returned_slot_ = 0;
  HostRegistrations ring_registered_;  // the outgoing ring, with the sources' plugins

  std::mutex lanes_mutex_;
  std::map<std::string, std::unique_ptr<Lane>> lanes_;

  // Operations in issue order: [head_, tail_) are pending, queue_[i % kMaxInFlight] holds the
  // i-th.
  std::mutex queue_mutex_;
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
  const Lane* copies_lane_ = nullptr;
  // Every ring chunk sent so far has been landed by the peer. Written by the completion thread.
  std::atomic<bool> ring_drained_{true};

  std::thread progress_;
  std::thread completer_;
};

}  // namespace

std::shared_ptr<Connection> make_ipc_connection(std::shared_ptr<IpcShared> shared,
                                                std::shared_ptr<IpcLink> link) {
  return std::make_shared<IpcConnection>(std::move(shared), std::move(link));
}

}  // namespace hetmesh::detail
