// The ipc transport: processes of one host. Each connection is a unix socket (abstract namespace)
// that tells us when the peer dies and wakes it when it sleeps, and shared memory that carries
// everything else: a message ring of frames each way (ipc_link.hpp), a staging ring each way for
// bytes that cannot be copied straight into the peer's memory, and the peer's own allocations,
// mapped through their plugins' IPC handles, for those that can (ipc_connection.cc).
//
// Polling reads the message rings directly: while events keep coming soon after each other, poll()
// spins on the rings and the event queue for up to kSpin before blocking, so a notification
// reaches a polling peer with no system call, no thread hop and no sleep. It spins only while that
// pays: when most recent waits outlasted kSpin (events far apart, or peers starved of CPU by
// spinning pollers on a small machine) it blocks at once, and so does a process that has been
// quiet for kActiveWindow; its progress threads sleep until the peer writes, so idle it uses no
// CPU.
#include "common/transports.hpp"

#include "common/descriptor.hpp"
#include "common/event_queue.hpp"
#include "common/socket_link.hpp"
#include "common/staging.hpp"
#include "ipc/ipc_connection.hpp"
#include "ipc/ipc_link.hpp"
#include "ipc/ipc_shared.hpp"

#include <hetmesh/core/hex.hpp>
#include <hetmesh/core/log.hpp>
#include <hetmesh/core/spin.hpp>
#include <hetmesh/transport/selection.hpp>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <mutex>

namespace hetmesh::detail {
namespace {

// How long poll() spins for the next event before it blocks, and the window within which a
// returned event makes it spin: a busy connection's next notification is usually microseconds
// away, and a sleep and a wake-up cost the writer a system call and both sides a thread hop.
constexpr std::chrono::microseconds kSpin{100};
constexpr std::chrono::milliseconds kActiveWindow{2};
// Spin only while at least this share (/1024) of recent waits ended within kSpin.
constexpr int kHitsToSpin = 768;
// What a sleep and a wake-up add to a wait, roughly, on a small virtual machine.
constexpr std::chrono::microseconds kWakeSlack{50};

std::optional<IpcExport> try_ipc_export(const Device& device, void* base) {
  if (!device.has(HM_CAP_IPC)) return std::nullopt;
  PointerInfo info = device.query(base);
  if (info.kind != HM_MEM_DEVICE && info.kind != HM_MEM_PINNED_HOST) return std::nullopt;
  try {
    hm_ipc_handle handle = ipc_export(device, base);
    return IpcExport{
        device.plugin().name(), to_hex(handle.bytes),
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

}  // namespace

IpcRegion::IpcRegion(std::shared_ptr<IpcShared> shared, uint32_t id, const Device& device,
                     void* base, uint64_t size, std::optional<IpcExport> exported)
    : Region(device, base, size, path_of(exported, device, base)),
      shared_(std::move(shared)),
      id_(id),
      access_(device, base, size),
      registered_(base, size, fmt::format("ipc: region {} ({})", id, device.selector())) {
  nlohmann::json d = region_descriptor("ipc", shared_->id, id, size);
  if (exported) {
    d["plugin"] = exported->plugin;
    d["handle"] = exported->handle;
    d["offset"] = exported->offset;
  }
  descriptor_ = to_bytes(d);
}

bool IpcRegion::reachable_by(const Device& engine) const {
  return registered_.ensure(engine);
}

IpcRegion::~IpcRegion() {
  std::lock_guard lock(shared_->regions_mutex);
  shared_->regions.erase(id_);
}

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

std::vector<Device> IpcShared::copy_engine_devices() {
  std::vector<std::shared_ptr<IpcRegion>> live;  // examined after unlocking, as above
  {
    std::lock_guard lock(regions_mutex);
    for (auto& [region_id, weak] : regions)
      if (auto region = weak.lock()) live.push_back(std::move(region));
  }
  std::vector<Device> devices;
  for (const auto& region : live)
    if (!region->access().direct() &&
        std::none_of(devices.begin(), devices.end(), [&](const Device& d) {
          return d.plugin_ptr() == region->device().plugin_ptr();
        }))
      devices.push_back(region->device());
  return devices;
}

void IpcShared::add_link(std::shared_ptr<IpcLink> link) {
  std::lock_guard lock(links_mutex);
  links.push_back(std::move(link));
}

void IpcShared::remove_link(const IpcLink* link) {
  std::lock_guard lock(links_mutex);
  std::erase_if(links, [&](const std::shared_ptr<IpcLink>& l) { return l.get() == link; });
}

namespace {

class IpcTransport : public Transport {
 public:
  explicit IpcTransport(const TransportOptions& options)
      : slots_(options.staging_slots),
        slot_bytes_(options.staging_slot_bytes),
        shared_(make_shared_state()),
        listener_(SocketAddress{fmt::format("unix:@hetmesh-{}", shared_->id)}, shared_->id,
                  link_secret(options)) {}

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
    RingLink rings = exchange_rings(socket, peer_id, slots_, slot_bytes_, timeout);
    log(LogLevel::debug,
        "ipc: connected to {} at {} (staging rings: {} × {} bytes out, {} × {} in; message rings: "
        "{} bytes out, {} in)",
        peer_id, address, rings.outgoing.slots(), rings.outgoing.slot_bytes(),
        rings.incoming.slots(), rings.incoming.slot_bytes(), rings.messages_out.capacity(),
        rings.messages_in.capacity());
    auto link = std::make_shared<IpcLink>(next_connection_++, shared_, peer_id, std::move(socket),
                                          std::move(rings));
    return make_ipc_connection(shared_, std::move(link));
  }

  // Spins (when events came recently) reading the links' message rings directly and watching the
  // event queue, then hands the links back to their progress threads and blocks on the queue.
  size_t poll(std::vector<TransportEvent>& out, std::chrono::nanoseconds timeout) override {
    size_t before = out.size();
    auto start = Clock::now();
    Claims claims(*shared_);
    std::vector<Claim>& links = claims.links;
    for (Claim& c : links)
      c.held = c.link->claim();
    auto spin = timeout.count() > 0 && recently_active(start) && spinning_pays()
                    ? std::min<std::chrono::nanoseconds>(timeout, kSpin)
                    : std::chrono::nanoseconds(0);
    bool waited = false;
    auto spin_until = start + spin;
    for (int round = 0;; ++round) {
      // Queued events first: what a progress thread read before we claimed its link is older
      // than what its ring still holds.
      if (!shared_->events.empty()) shared_->events.poll(out, std::chrono::nanoseconds(0));
      for (Claim& c : links)
        if (c.held && c.link->has_messages()) c.link->read(out);
      if (out.size() > before || Clock::now() >= spin_until) break;
      waited = true;
      // A link whose progress thread was reading is read here from the next round on.
      if ((round & 15) == 15)
        for (Claim& c : links)
          if (!c.held) c.held = c.link->claim();
      cpu_relax();
    }
    claims.release(out, /*will_block=*/out.size() == before);
    if (out.size() == before) {
      waited = true;
      auto left = timeout - (Clock::now() - start);
      if (left.count() > 0) shared_->events.poll(out, left);
    }
    if (waited && timeout.count() > 0)
      record_wait(Clock::now() - start, out.size() > before, spin.count() > 0);
    size_t n = out.size() - before;
    if (n > 0)
      last_active_.store(Clock::now().time_since_epoch().count(), std::memory_order_relaxed);
    return n;
  }

 private:
  static std::shared_ptr<IpcShared> make_shared_state() {
    auto shared = std::make_shared<IpcShared>();
    shared->id = new_endpoint_id();
    shared->host = node_identity();
    return shared;
  }

  using Clock = std::chrono::steady_clock;
  struct Claim {
    std::shared_ptr<IpcLink> link;
    bool held = false;
  };

  // The live links during one poll, in a vector of this thread's that keeps its capacity between
  // polls; whatever happens, the reader roles taken go back at the end.
  struct Claims {
    std::vector<Claim>& links;
    explicit Claims(IpcShared& shared) : links(storage()) {
      std::lock_guard lock(shared.links_mutex);
      for (const auto& link : shared.links)
        links.push_back(Claim{link, false});
    }
    ~Claims() {
      for (Claim& c : links)
        if (c.held) c.link->unclaim(nullptr, true);  // only on an exception: to the queue
      links.clear();
    }
    Claims(const Claims&) = delete;
    Claims& operator=(const Claims&) = delete;
    void release(std::vector<TransportEvent>& out, bool will_block) {
      for (Claim& c : links)
        if (c.held) {
          c.held = false;
          c.link->unclaim(&out, will_block);
        }
      links.clear();
    }
    static std::vector<Claim>& storage() {
      thread_local std::vector<Claim> links;
      return links;
    }
  };

  // Whether spinning has been paying: most recent waits for an event ended within kSpin. Waits are
  // measured whether the poll spun or blocked, so a stream that speeds up is noticed, and a poller
  // whose events come further apart than kSpin (or whose peers are starved of CPU by pollers that
  // spin) stops burning its CPU on spins that end in a sleep anyway.
  bool spinning_pays() const { return wait_hits_.load(std::memory_order_relaxed) >= kHitsToSpin; }

  // Folds one wait into the running hit rate (1/8 per wait, in 1/1024ths). A wait that ended in a
  // sleep includes the wake-up, so it counts as a hit up to kWakeSlack later: without that slack,
  // a poller that stopped spinning would, by sleeping, make its waits too long to start again.
  void record_wait(Clock::duration waited, bool got_event, bool spun) {
    auto limit = spun ? kSpin : kSpin + kWakeSlack;
    int hit = got_event && waited <= limit ? 1024 : 0;
    int rate = wait_hits_.load(std::memory_order_relaxed);
    wait_hits_.store(rate + (hit - rate) / 8, std::memory_order_relaxed);
  }

  bool recently_active(Clock::time_point now) const {
    auto last = Clock::time_point(Clock::duration(last_active_.load(std::memory_order_relaxed)));
    return now - last < kActiveWindow;
  }

  uint32_t slots_;
  uint64_t slot_bytes_;
  std::shared_ptr<IpcShared> shared_;
  Listener listener_;
  std::atomic<ConnectionId> next_connection_{1};
  std::atomic<Clock::rep> last_active_{};  // when a poll last returned events
  std::atomic<int> wait_hits_{1024};       // share of recent waits that ended within kSpin, /1024
};

}  // namespace

std::unique_ptr<Transport> make_ipc_transport(const TransportOptions& options) {
  if (options.staging_slots < kMinRingSlots || options.staging_slots > kMaxRingSlots ||
      options.staging_slot_bytes < kMinSlotBytes || options.staging_slot_bytes > kMaxSlotBytes)
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("ipc: a staging ring of {} slots of {} bytes is outside {}..{} slots "
                            "of {}..{} bytes",
                            options.staging_slots, options.staging_slot_bytes, kMinRingSlots,
                            kMaxRingSlots, kMinSlotBytes, kMaxSlotBytes));
  return std::make_unique<IpcTransport>(options);
}

}  // namespace hetmesh::detail
