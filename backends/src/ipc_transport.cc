// The ipc transport: processes of one host. Each connection is a unix socket (abstract namespace)
// that carries small frames and tells us when the peer dies, plus two ways of moving bytes:
//
//  - Zero-copy. When a peer region was exported with its plugin's IPC handle and this process has
//    that plugin too, import_region maps the peer's allocation here, and a write copies straight
//    into the peer's memory, by one of two routes:
//      host copy:   both sides are host-addressable (cpu device memory, pinned host memory), so a
//                   plain memcpy does it: in write() itself up to kInlineCopyBytes, else on the
//                   completion thread.
//      device copy: the source belongs to the mapping's plugin, whose copy engine does it with
//                   memcpy_async on the connection's stream for that plugin (a "lane"); an event
//                   recorded behind it tells the completion thread when the bytes have landed.
//    Either way the notification frame and write_done follow the bytes.
//  - The shared ring. Everything else (different plugins on the two sides, memory without IPC)
//    goes through a sealed memfd ring that the writer owns: the completion thread copies the
//    source into a free slot (through a bounce buffer for device memory the host cannot address),
//    sends a chunk frame, and the reader copies the slot into the region and hands the slot back
//    on the ring's credit channel. The reader checks every chunk against its region table first.
//
// Order, as on tcp or an RDMA queue pair: writes retire in the order they were issued, whichever
// way each goes (one completion thread per connection, or write() itself when nothing is queued
// ahead), so notifications arrive in issue order; a control message sent while writes are pending
// queues behind them. Bytes land in issue order too: a write that goes straight into the peer's
// memory after ring traffic waits until the peer has handed back every ring slot, i.e. landed
// every earlier chunk (see write()). Every wait is bounded; a dead or misbehaving peer becomes
// one peer_lost event and fails the writes still queued.
#include "transports.hpp"

#include "descriptor.hpp"
#include "event_queue.hpp"
#include "shm_ring.hpp"
#include "socket_link.hpp"
#include "staging.hpp"

#include <hetmesh/log.hpp>

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <thread>

namespace hetmesh::detail {
namespace {

constexpr uint32_t kHelloMagic = 0x48504948;  // "HIPH"
constexpr uint32_t kFrameMagic = 0x46504948;  // "HIPF"
constexpr uint16_t kProtocolVersion = 1;

// Ring geometry of the rings this side creates: four slots pipeline the writer's copy into one
// slot with the reader's copy out of another.
constexpr uint32_t kRingSlots = 4;
constexpr uint64_t kSlotBytes = 2 << 20;
// Limits on a peer's announced geometry.
constexpr uint32_t kMaxRingSlots = 64;
constexpr uint64_t kMaxSlotBytes = 64 << 20;

// Writes queued on one connection before write() waits for the oldest to retire.
constexpr size_t kMaxInFlight = 256;
// Host copies up to this size are made by write() itself when no earlier write's bytes are still
// on their way (as a shared-memory transport that copies in the caller would): handing them to the
// completion thread costs a thread wake-up per write, a fifth of the time of a 1 MiB copy. Larger
// writes stay fully asynchronous.
constexpr uint64_t kInlineCopyBytes = 4 << 20;
// Bound of every wait on progress: a copy engine finishing, ring credit, queue space.
constexpr std::chrono::seconds kProgressTimeout{30};

enum FrameType : uint8_t { kNotify = 1, kChunk = 2, kControl = 3 };
enum FrameFlags : uint8_t { kLastChunk = 1, kWithNotify = 2 };

// Everything on the socket after the hello is one of these, a control frame followed by its
// payload.
struct Frame {
  uint32_t magic;
  uint8_t type;
  uint8_t flags;
  uint16_t slot;    // kChunk
  uint32_t region;  // kChunk
  uint32_t value;   // kNotify; kChunk with kWithNotify
  uint64_t offset;  // kChunk
  uint64_t length;  // kChunk, kControl
};
static_assert(sizeof(Frame) == 32);

// Sent once each way after the socket connects, with the sender's outgoing ring attached.
struct Hello {
  uint32_t magic;
  uint16_t version;
  uint16_t ring_slots;
  uint64_t slot_bytes;
};
static_assert(sizeof(Hello) == 16);

Frame make_frame(FrameType type) {
  Frame f{};
  f.magic = kFrameMagic;
  f.type = type;
  return f;
}

// "<hostname>/<boot id>": equal only for processes of one running kernel on one machine.
std::string host_identity() {
  std::string boot_id;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot_id;
  char name[256] = {};
  gethostname(name, sizeof name - 1);
  return fmt::format("{}/{}", name, boot_id.empty() ? "unknown-boot" : boot_id);
}

std::string to_hex(const hm_ipc_handle& handle) {
  std::string text;
  text.reserve(2 * sizeof handle.bytes);
  for (uint8_t b : handle.bytes)
    text += fmt::format("{:02x}", b);
  return text;
}

hm_ipc_handle from_hex(const std::string& text) {
  hm_ipc_handle handle{};
  auto nibble = [&](char c) -> uint8_t {
    if (c >= '0' && c <= '9') return static_cast<uint8_t>(c - '0');
    if (c >= 'a' && c <= 'f') return static_cast<uint8_t>(c - 'a' + 10);
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("region descriptor has a malformed 'handle' (character '{}')", c));
  };
  if (text.size() != 2 * sizeof handle.bytes)
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("region descriptor's 'handle' has {} hex digits, not {}", text.size(),
                            2 * sizeof handle.bytes));
  for (size_t i = 0; i < sizeof handle.bytes; ++i)
    handle.bytes[i] = static_cast<uint8_t>(nibble(text[2 * i]) << 4 | nibble(text[2 * i + 1]));
  return handle;
}

class IpcRegion;

// State shared by the transport and its connections' threads.
struct IpcShared {
  std::string id;
  std::string host;
  EventQueue events;
  std::mutex regions_mutex;
  std::map<uint32_t, std::weak_ptr<IpcRegion>> regions;
  uint32_t next_region = 1;

  std::shared_ptr<IpcRegion> find_region(uint32_t id);
  // A device of `plugin` this process already uses (from a registered region), so zero-copy
  // writes run on the device that holds the sources; nullopt if none.
  std::optional<Device> registered_device_of(const std::string& plugin);
};

// How a region can be shared: the IPC handle of its allocation and where it starts in it.
struct IpcExport {
  std::string plugin;
  std::string handle;
  uint64_t offset;
};

std::optional<IpcExport> try_ipc_export(const Device& device, void* base) {
  if (!device.has(HM_CAP_IPC)) return std::nullopt;
  PointerInfo info = device.query(base);
  if (info.kind != HM_MEM_DEVICE && info.kind != HM_MEM_PINNED_HOST) return std::nullopt;
  try {
    hm_ipc_handle handle = ipc_export(device, base);
    return IpcExport{
        device.plugin().name(), to_hex(handle),
        static_cast<uint64_t>(static_cast<uint8_t*>(base) - static_cast<uint8_t*>(info.base))};
  } catch (const Error& e) {
    log(LogLevel::warn, "ipc: {} memory at {} cannot be exported ({}); it goes through the ring",
        device.selector(), base, e.what());
    return std::nullopt;
  }
}

RegistrationPath path_of(const std::optional<IpcExport>& exported, const Device& device,
                         const void* base) {
  if (exported) return RegistrationPath::ipc_handle;
  return host_addressable(device, base) ? RegistrationPath::host : RegistrationPath::staging;
}

class IpcRegion : public Region, public std::enable_shared_from_this<IpcRegion> {
 public:
  IpcRegion(std::shared_ptr<IpcShared> shared, uint32_t id, const Device& device, void* base,
            uint64_t size, std::optional<IpcExport> exported)
      : Region(device, base, size, path_of(exported, device, base)),
        shared_(std::move(shared)),
        id_(id),
        access_(device, base, size) {
    nlohmann::json d = {
        {"transport", "ipc"}, {"endpoint", shared_->id}, {"region", id}, {"size", size}};
    if (exported) {
      d["plugin"] = exported->plugin;
      d["handle"] = exported->handle;
      d["offset"] = exported->offset;
    }
    descriptor_ = to_bytes(d);
  }
  ~IpcRegion() override {
    std::lock_guard lock(shared_->regions_mutex);
    shared_->regions.erase(id_);
  }
  RegionDescriptor describe() const override { return descriptor_; }
  // The ring path's way in and out; HostAccess serialises its own users.
  HostAccess& access() const { return access_; }

 private:
  std::shared_ptr<IpcShared> shared_;
  uint32_t id_;
  RegionDescriptor descriptor_;
  mutable HostAccess access_;
};

std::shared_ptr<IpcRegion> IpcShared::find_region(uint32_t region_id) {
  std::lock_guard lock(regions_mutex);
  auto it = regions.find(region_id);
  return it == regions.end() ? nullptr : it->second.lock();
}

std::optional<Device> IpcShared::registered_device_of(const std::string& plugin) {
  // Collected first, examined after unlocking: dropping the last reference to a region takes the
  // lock in its destructor.
  std::vector<std::shared_ptr<IpcRegion>> live;
  {
    std::lock_guard lock(regions_mutex);
    for (auto& [region_id, weak] : regions)
      if (auto region = weak.lock()) live.push_back(std::move(region));
  }
  for (const auto& region : live)
    if (region->device().plugin().name() == plugin) return region->device();
  return std::nullopt;
}

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

class IpcRemoteRegion : public RemoteRegion, public std::enable_shared_from_this<IpcRemoteRegion> {
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

// Both rings of a connection with their credit channels: one SOCK_SEQPACKET pair per ring, on
// which the reader hands slots back. Credits have their own channel so that the reader thread
// never waits for room on the main socket (which writes and control messages fill), and the
// writer reads them right where it waits for them.
struct RingLink {
  SharedRing outgoing;  // ours: we write, the peer reads
  Fd credits_in;        // the peer returns our slots here
  SharedRing incoming;  // the peer's, mapped read-only
  Fd credits_out;       // we return the peer's slots here
};

class IpcConnection : public Connection {
 public:
  IpcConnection(ConnectionId id, std::shared_ptr<IpcShared> shared, std::string peer_id, Fd socket,
                RingLink rings)
      : Connection(id),
        shared_(std::move(shared)),
        peer_id_(std::move(peer_id)),
        socket_(std::move(socket)),
        rings_(std::move(rings)),
        credits_(rings_.outgoing.slots()),
        queue_(kMaxInFlight) {
    // A peer that stops reading (stopped, not dead) fails sends after this instead of hanging.
    timeval limit{kProgressTimeout.count(), 0};
    setsockopt(socket_.get(), SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof limit);
    reader_ = std::thread([this] { receive(); });
    completer_ = std::thread([this] { complete_in_order(); });
  }

  ~IpcConnection() override {
    {
      std::lock_guard lock(queue_mutex_);
      closing_ = true;
    }
    socket_.shutdown();
    rings_.credits_in.shutdown();
    queued_.notify_all();
    // The completion thread drains what is queued (failing it), waiting for copies still in
    // flight, so nothing below is destroyed under a running copy.
    completer_.join();
    reader_.join();
  }

  bool alive() const override { return alive_; }

  std::shared_ptr<RemoteRegion> import_region(const RegionDescriptor& descriptor) override {
    auto d = parse_descriptor(descriptor, "ipc", "region descriptor");
    auto owner = field<std::string>(d, "endpoint", "region descriptor");
    if (owner != peer_id_)
      throw Error(HM_ERR_INVALID_ARGUMENT,
                  fmt::format("region descriptor belongs to endpoint {}, this connection's peer "
                              "is {}",
                              owner, peer_id_));
    auto remote =
        std::make_shared<IpcRemoteRegion>(this, field<uint32_t>(d, "region", "region descriptor"),
                                          field<uint64_t>(d, "size", "region descriptor"));
    if (d.contains("handle")) map_peer_memory(*remote, d);
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
    auto* source = dynamic_cast<const IpcRegion*>(&src);
    auto* target = dynamic_cast<const IpcRemoteRegion*>(&dst);
    if (source == nullptr || target == nullptr)
      throw Error(HM_ERR_INVALID_ARGUMENT, "write: regions were not made by this ipc transport");
    if (target->owner != this)
      throw Error(HM_ERR_INVALID_ARGUMENT,
                  fmt::format("write: destination region {} was imported on another connection",
                              target->id));
    check_range("source", src_offset, length, src.size());
    check_range("destination", dst_offset, length, dst.size());
    if (!alive_) throw Error(kStatusPeerLost, fmt::format("write: peer {} is lost", peer_id_));

    Lane* lane = nullptr;
    Route route = route_for(*source, *target, &lane);
    uint8_t* to = target->mapped + dst_offset;
    const uint8_t* from = static_cast<const uint8_t*>(source->base()) + src_offset;
    std::unique_lock lock(queue_mutex_);
    size_t slot = claim_slot(lock, "write");
    // Bytes land in issue order. Ring bytes land when the peer's reader gets to them, so a write
    // that goes straight into the peer's memory while ring bytes may still be on their way is
    // left to the completion thread, which first waits for every ring slot to come back. (Host
    // and device copies never meet: a mapping is host-addressable or it is not.)
    bool ring_busy = ring_writes_queued_ > 0 || !ring_drained_;
    bool landed = false, deferred = false;
    switch (route) {
      case Route::device_copy:
        deferred = ring_busy || deferred_copies_ > 0;  // a later copy must not overtake it
        if (!deferred) start_copy(*lane, slot, to, from, length);  // in the stream, in order
        deferred_copies_ += deferred;
        break;
      case Route::host_copy:
        landed = length <= kInlineCopyBytes && !ring_busy && host_copies_queued_ == 0;
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
    // Nothing queued ahead: the notification and write_done can go now, still in order.
    if (landed && head_ == tail_) return retire_now(op, slot);
    publish(lock);
  }

  void send_control(std::span<const uint8_t> message) override {
    if (message.size() > kMaxControlBytes)
      throw Error(HM_ERR_INVALID_ARGUMENT, fmt::format("control message of {} bytes exceeds {}",
                                                       message.size(), kMaxControlBytes));
    if (!alive_)
      throw Error(kStatusPeerLost, fmt::format("send_control: peer {} is lost", peer_id_));
    std::unique_lock lock(queue_mutex_);
    if (head_ == tail_) {
      // Nothing pending, and no write can start while we hold the lock: it may go right away.
      try {
        send_control_frame(message.data(), message.size());
      } catch (const Error& e) {
        lock.unlock();
        lose(e.what());
        throw;
      }
      return;
    }
    size_t slot = claim_slot(lock, "send_control");
    PendingOp& op = queue_[slot];
    op.route = Route::control;
    op.landed = false;  // the slot's previous write must not count in the landing order
    op.deferred = false;
    op.payload.assign(message.begin(), message.end());
    publish(lock);
  }

 private:
  static void check_range(const char* side, uint64_t offset, uint64_t length, uint64_t size) {
    if (offset > size || length > size - offset)
      throw Error(HM_ERR_INVALID_ARGUMENT,
                  fmt::format("write: {} range [{}, +{}) is outside its region of {} bytes", side,
                              offset, length, size));
  }

  // ---- setup ----

  // The lane for `plugin`, created on first use: on the device of a region this process
  // registered with that plugin, else on the plugin's device 0. nullptr if this process has no
  // such plugin (the ring then carries the writes).
  Lane* lane_for(const std::string& plugin) {
    std::lock_guard lock(lanes_mutex_);
    if (auto it = lanes_.find(plugin); it != lanes_.end()) return it->second.get();
    std::optional<Device> device = shared_->registered_device_of(plugin);
    if (!device) {
      auto loaded = PluginRegistry::load().find(plugin);
      if (!loaded || loaded->device_count() == 0) return nullptr;
      device.emplace(loaded, 0);
    }
    return lanes_.emplace(plugin, std::make_unique<Lane>(*device)).first->second.get();
  }

  // Opens the peer's allocation for zero-copy writes. A handle this process cannot open (no such
  // plugin here, or a plugin that refuses it, as CUDA does within one process) leaves the region
  // on the ring; a descriptor that claims more than the allocation holds is refused.
  void map_peer_memory(IpcRemoteRegion& remote, const nlohmann::json& d) {
    auto plugin = field<std::string>(d, "plugin", "region descriptor");
    hm_ipc_handle handle = from_hex(field<std::string>(d, "handle", "region descriptor"));
    auto offset = field<uint64_t>(d, "offset", "region descriptor");
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
    if (info.kind != HM_MEM_IPC_MAPPED || info.base != mapping->data()) {
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
    remote.mapping.emplace(std::move(*mapping));
    remote.lane = lane;
  }

  // ---- issuing writes ----

  // Zero-copy needs the peer's memory mapped here, and either host code able to reach both sides
  // or a copy engine that reaches both (the mapping's plugin, on the source's device or with peer
  // copy). Anything else is staged through the ring.
  static Route route_for(const IpcRegion& src, const IpcRemoteRegion& dst, Lane** lane) {
    if (dst.lane == nullptr) return Route::ring;
    if (dst.host_addressable && src.access().direct()) return Route::host_copy;
    const Device& engine = dst.lane->device;
    if (src.device().plugin_ptr() != engine.plugin_ptr()) return Route::ring;
    if (src.device().index() != engine.index() && !engine.has(HM_CAP_PEER_COPY)) return Route::ring;
    *lane = dst.lane;
    return Route::device_copy;
  }

  // Waits (bounded) for room in the queue; returns the slot the next operation goes to.
  size_t claim_slot(std::unique_lock<std::mutex>& lock, const char* what) {
    if (!space_.wait_for(lock, kProgressTimeout, [&] { return tail_ - head_ < kMaxInFlight; }))
      throw Error(HM_ERR_TIMEOUT,
                  fmt::format("{}: {} operations to peer {} still pending after {} s", what,
                              kMaxInFlight, peer_id_, kProgressTimeout.count()));
    return tail_ % kMaxInFlight;
  }

  // Hands the operation in the claimed slot to the completion thread.
  void publish(std::unique_lock<std::mutex>& lock) {
    ++tail_;
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
      {
        std::unique_lock lock(queue_mutex_);
        queued_.wait(lock, [&] { return head_ != tail_ || closing_; });
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
        deferred_copies_ -= op->deferred;
        ++head_;
      }
      space_.notify_one();
    }
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
      lose(e.what());
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
      lose(e.what());
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
    send_frame(f, data, size);
  }

  void send_notification(uint32_t value) {
    Frame f = make_frame(kNotify);
    f.value = value;
    send_frame(f);
  }

  // Throws for writes still pending when the connection closes or the peer is lost.
  void check_open() const {
    if (closing_) throw Error(kStatusPeerLost, "the connection was closed before the write ended");
    if (!alive_) throw Error(kStatusPeerLost, "the peer was lost before the write ended");
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
      uint8_t* to = rings_.outgoing.slot(slot);
      w.src->access().read(w.src_offset + sent, n, [&](const uint8_t* data, uint64_t part) {
        std::memcpy(to, data, part);
        to += part;
      });
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
      send_frame(f);
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

  void await_credit() {
    int fd = rings_.credits_in.get();
    pollfd readable{fd, POLLIN, 0};
    int ready;
    do {
      ready = ::poll(&readable, 1, static_cast<int>(kProgressTimeout.count() * 1000));
    } while (ready < 0 && errno == EINTR);
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

  // ---- the socket ----

  void send_frame(const Frame& f, const void* payload = nullptr, size_t payload_size = 0) {
    std::lock_guard lock(send_mutex_);
    send_two(socket_.get(), &f, sizeof f, payload, payload_size, "ipc frame");
  }

  // Reports the peer lost once, with the first reason, and wakes everything that waits on it.
  void lose(const std::string& reason) {
    if (!alive_.exchange(false)) return;
    if (!closing_) {
      TransportEvent lost{TransportEvent::Type::peer_lost, id()};
      lost.status = kStatusPeerLost;
      lost.message = fmt::format("ipc peer {}: {}", peer_id_, reason);
      shared_->events.push(std::move(lost));
    }
    socket_.shutdown();
    rings_.credits_in.shutdown();
  }

  void receive() {
    try {
      for (;;) {
        Frame f;
        recv_all(socket_.get(), &f, sizeof f, "frame");
        if (f.magic != kFrameMagic)
          throw Error(kStatusProtocolError, fmt::format("bad frame (magic {:08x})", f.magic));
        switch (f.type) {
          case kNotify:
            deliver_notification(f.value);
            break;
          case kChunk:
            receive_chunk(f);
            break;
          case kControl:
            receive_control(f);
            break;
          default:
            throw Error(kStatusProtocolError, fmt::format("unknown frame type {}", f.type));
        }
      }
    } catch (const Error& e) {
      lose(e.what());
    }
  }

  void deliver_notification(uint32_t value) {
    TransportEvent note{TransportEvent::Type::notification, id()};
    note.value = value;
    shared_->events.push(std::move(note));
  }

  void receive_control(const Frame& f) {
    if (f.length > kMaxControlBytes)
      throw Error(kStatusProtocolError, fmt::format("control message of {} bytes exceeds {}",
                                                    f.length, kMaxControlBytes));
    TransportEvent control{TransportEvent::Type::control, id()};
    control.payload.resize(f.length);
    recv_all(socket_.get(), control.payload.data(), f.length, "control payload");
    shared_->events.push(std::move(control));
  }

  // Copies one ring slot into a region, after checking the frame names a slot, a region of ours
  // and a range inside it: a bad frame ends the connection before a byte lands.
  void receive_chunk(const Frame& f) {
    const SharedRing& ring = rings_.incoming;
    if (f.slot >= ring.slots() || f.length > ring.slot_bytes())
      throw Error(kStatusProtocolError,
                  fmt::format("ring chunk of {} bytes in slot {} does not fit the ring ({} slots "
                              "of {} bytes)",
                              f.length, f.slot, ring.slots(), ring.slot_bytes()));
    std::shared_ptr<IpcRegion> region = shared_->find_region(f.region);
    if (!region)
      throw Error(kStatusProtocolError,
                  fmt::format("write to region {}, which is not registered here", f.region));
    if (f.offset > region->size() || f.length > region->size() - f.offset)
      throw Error(kStatusProtocolError,
                  fmt::format("write to region {} at [{}, +{}) is outside its {} bytes; refused",
                              f.region, f.offset, f.length, region->size()));
    const uint8_t* data = ring.slot(f.slot);
    region->access().write(f.offset, f.length, [&](uint8_t* chunk, uint64_t n) {
      std::memcpy(chunk, data, n);
      data += n;
    });
    return_slot(f.slot);
    if ((f.flags & kLastChunk) && (f.flags & kWithNotify)) deliver_notification(f.value);
  }

  // Never blocks: the peer has at most as many slots out as its ring holds, and a SEQPACKET
  // socket buffers that many tiny messages.
  void return_slot(uint16_t slot) {
    uint32_t message = slot;
    if (send(rings_.credits_out.get(), &message, sizeof message, MSG_NOSIGNAL | MSG_DONTWAIT) !=
        static_cast<ssize_t>(sizeof message))
      throw Error(kStatusPeerLost,
                  fmt::format("returning ring slot {} failed: {}", slot, std::strerror(errno)));
  }

  std::shared_ptr<IpcShared> shared_;
  std::string peer_id_;
  Fd socket_;
  std::mutex send_mutex_;
  std::atomic<bool> alive_{true};

  RingLink rings_;
  // Outgoing ring bookkeeping, touched by the completion thread only.
  uint32_t credits_;
  uint32_t next_slot_ = 0;
  uint32_t returned_slot_ = 0;

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
  // Landing order (see write()): queued host copies the completion thread has yet to make, ring
  // writes not yet sent, and device copies it has yet to start.
  uint64_t host_copies_queued_ = 0;
  uint64_t ring_writes_queued_ = 0;
  uint64_t deferred_copies_ = 0;
  // Every ring chunk sent so far has been landed by the peer. Written by the completion thread.
  std::atomic<bool> ring_drained_{true};
  std::atomic<bool> closing_{false};

  std::thread reader_;
  std::thread completer_;
};

// Exchanges hellos on a freshly connected socket: our outgoing ring and the peer's end of its
// credit channel travel to the peer; the peer's ring and our end of its channel arrive here.
RingLink exchange_rings(const Fd& socket, const std::string& peer_id,
                        std::chrono::milliseconds timeout) {
  RingLink link;
  link.outgoing = SharedRing::create(kRingSlots, kSlotBytes);
  int pair[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) != 0)
    throw Error(HM_ERR_BACKEND,
                fmt::format("socketpair for the ring credit channel: {}", std::strerror(errno)));
  link.credits_in = Fd(pair[0]);
  Fd peer_end(pair[1]);
  Hello mine{kHelloMagic, kProtocolVersion, kRingSlots, kSlotBytes};
  int fds[] = {link.outgoing.fd(), peer_end.get()};
  send_with_fds(socket.get(), &mine, sizeof mine, fds, "ipc hello");
  peer_end.reset();  // only the peer holds it now, so its death reads as EOF on credits_in

  Hello theirs{};
  std::vector<Fd> received =
      receive_with_fds(socket.get(), &theirs, sizeof theirs, 2, timeout, "ipc hello");
  if (theirs.magic != kHelloMagic || theirs.version != kProtocolVersion)
    throw Error(kStatusProtocolError,
                fmt::format("ipc peer {} sent a bad hello (magic {:08x}, version {}; expected "
                            "version {})",
                            peer_id, theirs.magic, theirs.version, kProtocolVersion));
  if (theirs.ring_slots == 0 || theirs.ring_slots > kMaxRingSlots || theirs.slot_bytes == 0 ||
      theirs.slot_bytes > kMaxSlotBytes)
    throw Error(
        kStatusProtocolError,
        fmt::format("ipc peer {} announced a ring of {} slots of {} bytes (limits: {} "
                    "slots of {} bytes)",
                    peer_id, theirs.ring_slots, theirs.slot_bytes, kMaxRingSlots, kMaxSlotBytes));
  int type = 0;
  socklen_t length = sizeof type;
  if (getsockopt(received[1].get(), SOL_SOCKET, SO_TYPE, &type, &length) != 0 ||
      type != SOCK_SEQPACKET)
    throw Error(
        kStatusProtocolError,
        fmt::format("ipc peer {} sent a credit channel that is not a SEQPACKET socket", peer_id));
  try {
    link.incoming = SharedRing::adopt(std::move(received[0]), theirs.ring_slots, theirs.slot_bytes);
  } catch (const Error& e) {
    throw Error(e.status(), fmt::format("ipc peer {}: {}", peer_id, e.what()));
  }
  link.credits_out = std::move(received[1]);
  return link;
}

class IpcTransport : public Transport {
 public:
  explicit IpcTransport(const TransportOptions&)
      : shared_(make_shared_state()),
        listener_(SocketAddress{fmt::format("unix:@hetmesh-{}", shared_->id)}, shared_->id) {}

  TransportKind kind() const override { return TransportKind::ipc; }

  EndpointDescriptor endpoint() const override {
    return to_bytes({{"transport", "ipc"},
                     {"endpoint", shared_->id},
                     {"address", listener_.address().text},
                     {"host", shared_->host}});
  }

  std::shared_ptr<Region> register_memory(const Device& device, void* ptr, uint64_t size) override {
    check_registration(device, ptr, size);
    std::optional<IpcExport> exported = try_ipc_export(device, ptr);
    std::lock_guard lock(shared_->regions_mutex);
    uint32_t id = shared_->next_region++;
    auto region = std::make_shared<IpcRegion>(shared_, id, device, ptr, size, std::move(exported));
    shared_->regions[id] = region;
    log(LogLevel::debug, "ipc: registered {} bytes of {} as region {} ({})", size,
        device.selector(), id, to_string(region->path()));
    return region;
  }

  std::shared_ptr<Connection> connect(const EndpointDescriptor& peer,
                                      std::chrono::milliseconds timeout) override {
    auto d = parse_descriptor(peer, "ipc", "endpoint descriptor");
    auto peer_id = field<std::string>(d, "endpoint", "endpoint descriptor");
    auto address = field<std::string>(d, "address", "endpoint descriptor");
    auto host = field<std::string>(d, "host", "endpoint descriptor");
    if (host != shared_->host)
      throw Error(HM_ERR_INVALID_ARGUMENT,
                  fmt::format("ipc peer {} runs on host '{}', this endpoint on '{}': the ipc "
                              "transport connects processes of one host (use tcp or verbs "
                              "between hosts)",
                              peer_id, host, shared_->host));
    Fd socket = connect_symmetric(listener_, shared_->id, peer_id, SocketAddress{address}, timeout);
    RingLink rings = exchange_rings(socket, peer_id, timeout);
    log(LogLevel::debug, "ipc: connected to {} at {} (rings: {} × {} bytes out, {} × {} in)",
        peer_id, address, rings.outgoing.slots(), rings.outgoing.slot_bytes(),
        rings.incoming.slots(), rings.incoming.slot_bytes());
    return std::make_shared<IpcConnection>(next_connection_++, shared_, peer_id, std::move(socket),
                                           std::move(rings));
  }

  size_t poll(std::vector<TransportEvent>& out, std::chrono::nanoseconds timeout) override {
    return shared_->events.poll(out, timeout);
  }

 private:
  static std::shared_ptr<IpcShared> make_shared_state() {
    auto shared = std::make_shared<IpcShared>();
    shared->id = new_endpoint_id();
    shared->host = host_identity();
    return shared;
  }

  std::shared_ptr<IpcShared> shared_;
  Listener listener_;
  std::atomic<ConnectionId> next_connection_{1};
};

}  // namespace

std::unique_ptr<Transport> make_ipc_transport(const TransportOptions& options) {
  return std::make_unique<IpcTransport>(options);
}

}  // namespace hetmesh::detail
