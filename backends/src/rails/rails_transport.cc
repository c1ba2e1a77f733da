// A transport over several NICs (TransportOptions::rails): one transport of the configured kind
// per NIC, a connection of each to the peer's of the same index, and the striping of rails_link.hpp
// over them. Each rail has two threads: a sender that makes the rail's writes and acknowledgements
// one after another (a tcp write blocks until its bytes are sent, so rails move at once only from
// threads of their own), and a poller that takes the rail's events and acts on them under the
// core's mutex; the user's events go to one queue that poll() reads. One more thread, the
// reviver, connects failed rails again after their cooldown. The core is shared by the
// transport and its connections, so a connection that outlives the transport fails cleanly. No
// rail's connection is closed (its destructor joins threads) with the mutex held: what is dropped
// under it waits in `closing_` until the lock is let go.
#include "common/event_queue.hpp"
#include "common/transports.hpp"
#include "rails/rails_link.hpp"
#include "rails/rails_wire.hpp"

#include <hetmesh/core/log.hpp>
#include <hetmesh/core/thread.hpp>

#include <fmt/format.h>

#include <arpa/inet.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <random>
#include <set>
#include <thread>

namespace hetmesh::detail {

RailsRegion::RailsRegion(const Device& device, void* base, uint64_t size,
                         std::vector<std::shared_ptr<Region>> rails)
    : Region(device, base, size, rails.front()->path(), rails.front()->path_reason()),
      rails_(std::move(rails)) {}

RegionDescriptor RailsRegion::describe() const {
  std::vector<std::vector<uint8_t>> parts;
  for (const auto& r : rails_)
    parts.push_back(r->describe());
  return pack_rails(parts);
}

namespace {

using namespace std::chrono_literals;

// Events of a rail's connection that came before the connection was known here (a peer's first
// control message can beat connect()'s return), kept to be handled in order once it is; at most
// this many bytes of them a rail (beyond, they are dropped, said once).
constexpr size_t kMaxOrphanBytes = 1 << 20;
// What an early event counts against it: its bytes, and a fixed share for the event itself (a
// notification has no bytes, and a flood of them must not grow without bound).
size_t orphan_cost(const TransportEvent& e) {
  return 64 + e.payload.size() + e.message.size();
}
constexpr auto kPollSlice = 50ms;   // how soon a poller sees the transport end
constexpr auto kMoveCheck = 100ms;  // how soon a move of the lead past its deadline is seen

// A numeric IPv4 or IPv6 address (a fabric rail's name is one, or a domain's).
bool is_ip_address(const std::string& name) {
  in6_addr bytes;
  std::string bare = name.size() > 2 && name.front() == '[' && name.back() == ']'
                         ? name.substr(1, name.size() - 2)
                         : name;
  return inet_pton(AF_INET, bare.c_str(), &bytes) == 1 ||
         inet_pton(AF_INET6, bare.c_str(), &bytes) == 1;
}

class RailsCore : public std::enable_shared_from_this<RailsCore> {
 public:
  explicit RailsCore(const TransportOptions& options);
  ~RailsCore() { stop(); }
  // Ends and joins the rails' threads; every connection is lost from then on.
  void stop();

  TransportKind kind() const { return options_.kind; }
  EndpointDescriptor endpoint() const;
  std::shared_ptr<Region> register_memory(const Device& device, void* ptr, uint64_t size);
  std::shared_ptr<Connection> connect(const EndpointDescriptor& peer,
                                      std::chrono::milliseconds timeout);
  size_t poll(std::vector<TransportEvent>& out, std::chrono::nanoseconds timeout) {
    return events_.poll(out, timeout);
  }

  // For RailsConnection.
  bool alive(const RailsLink& link);
  std::shared_ptr<RemoteRegion> import_region(RailsLink& link, const RegionDescriptor& d);
  void write(const std::shared_ptr<RailsLink>& link, const Region& src, uint64_t src_offset,
             const RemoteRegion& dst, uint64_t dst_offset, uint64_t length,
             std::optional<uint32_t> notify, uint64_t cookie);
  // The user's control message, on the lead: sent now where nothing of the user's waits to go
  // before it, else queued there. false: !may_wait and the lead's connection was busy.
  bool send_control(RailsLink& link, std::span<const uint8_t> message, bool may_wait);
  void drop(RailsLink& link);

 private:
  struct RailThreads {
    std::deque<std::pair<std::weak_ptr<RailsLink>, RailsPost>> queue;
    std::condition_variable ready;
    std::thread sender, poller;
    bool broken = false;  // its transport's poll failed: no connection of it is tried again
  };
  // A rail of a link to connect again, once `at` comes.
  struct Revival {
    std::weak_ptr<RailsLink> link;
    size_t rail;
    std::chrono::steady_clock::time_point at;
  };
  using Lock = std::unique_lock<std::mutex>;

  void send_loop(size_t rail);
  void poll_loop(size_t rail);
  void revive_loop();
  // Moves of the lead the peer has not answered within io_timeout: the lead moves on (or, with no
  // rail left, the link is lost). Mutex held.
  void check_moves();
  // Lets go of the lock, then of the rails' connections dropped under it (close_outside: and
  // takes the lock again).
  void unlock_and_close(Lock& lock);
  void close_outside(Lock& lock);
  // The rest run with mutex_ held.
  void handle(size_t rail, TransportEvent& event);
  // A control message of the layer's on `rail` (false: malformed, and the rail was taken down).
  // A control message that came on `rail`: the layer's own (handled here), or the user's, whose
  // rails header it strips. True if `event` is the user's, to be passed up.
  bool layer_message(RailsLink& link, size_t rail, TransportEvent& event);
  void acknowledged(RailsLink& link, size_t rail, uint64_t landed, uint64_t controls);
  // The user's control messages up to `passed_up` reached the peer's user: not sent again.
  void trim_controls(RailsLink& link, uint64_t passed_up);
  void rail_down(RailsLink& link, size_t rail, const std::string& why);
  // The lead failed (rail_down): its pieces not acknowledged wait for the peer's count, and the
  // lowest rail still up leads from now, once the peer answered; with none, the link is lost.
  void lead_down(RailsLink& link, size_t rail, const std::string& why);
  // The peer moved its lead to `rail` / answered ours: what it passed up so far.
  void peer_moved(RailsLink& link, size_t rail, uint64_t move);
  void moved(RailsLink& link, size_t rail, uint64_t move, uint64_t notes, uint64_t controls);
  // A piece goes on the lead now (behind what is queued there).
  void send_on_lead(RailsLink& link, uint64_t piece);
  // A copy of a piece that has not landed goes again on the lead; the original is settled as done.
  void send_again(RailsLink& link, uint64_t piece);
  // A new connection of a rail that was down takes stripes from now on.
  void rail_back(RailsLink& link, size_t rail, std::shared_ptr<Connection> connection);
  // The peer's region on a rail's connection of now, imported there if not yet; null where the
  // rail is down or the import failed.
  std::shared_ptr<const RemoteRegion> remote_on(RailsLink& link, const RailsRemoteRegion& region,
                                                size_t rail);
  // The events of a rail's connection that came before it was known here, handled now.
  void adopt_orphans(size_t rail, ConnectionId child);
  // A rail's connection no link has any more: its late events are dropped, early ones forgotten.
  void retire(size_t rail, ConnectionId child);
  // Tries the rail again after its cooldown, which doubles for the try after; answers the wait.
  std::chrono::milliseconds schedule_revival(RailsLink& link, size_t rail);
  // Fails every open write with `why`; with `tell`, the user hears peer_lost (else the user
  // dropped the connection).
  void lose(RailsLink& link, const std::string& why, bool tell);
  void complete(RailsLink& link, uint64_t piece, hm_status status, const std::string& message);
  void sent(RailsLink& link, size_t rail, uint64_t piece, hm_status status,
            const std::string& message);
  void release_held(RailsLink& link);
  void emit_done(RailsLink& link);
  void enqueue(size_t rail, RailsLink& link, RailsPost post, bool first = false);
  uint64_t add_piece(RailsLink& link, RailsPiece piece);
  void close_rail(RailsLink& link, size_t rail);
  void forget(RailsLink& link);

  TransportOptions options_;
  std::vector<std::unique_ptr<Transport>> rails_;
  EventQueue events_;
  std::atomic<ConnectionId> next_id_{1};

  std::mutex mutex_;                                 // everything below, and every RailsLink
  std::minstd_rand jitter_{std::random_device{}()};  // of the waits between a rail's tries
  std::map<std::pair<size_t, ConnectionId>, std::weak_ptr<RailsLink>> by_child_;
  std::vector<std::shared_ptr<RailsLink>> links_;      // every connection not dropped
  std::vector<std::vector<TransportEvent>> orphans_;   // per rail
  std::vector<size_t> orphan_bytes_;                   // per rail
  std::set<std::pair<size_t, ConnectionId>> retired_;  // rails' connections of links gone
  std::vector<std::shared_ptr<Connection>> closing_;   // closed once the lock is let go
  std::vector<std::unique_ptr<RailThreads>> threads_;
  std::vector<Revival> revivals_;
  std::multiset<EndpointDescriptor> connecting_;  // peers a connect() is under way to
  std::condition_variable revive_ready_;
  std::thread reviver_;
  bool stopping_ = false;
};

class RailsConnection final : public Connection {
 public:
  RailsConnection(std::shared_ptr<RailsCore> core, std::shared_ptr<RailsLink> link)
      : Connection(link->id), core_(std::move(core)), link_(std::move(link)) {}
  ~RailsConnection() override { core_->drop(*link_); }
  bool alive() const override { return core_->alive(*link_); }
  std::shared_ptr<RemoteRegion> import_region(const RegionDescriptor& descriptor) override {
    return core_->import_region(*link_, descriptor);
  }
  using Connection::write;  // the overload without `more`
  void write(const Region& src, uint64_t src_offset, const RemoteRegion& dst, uint64_t dst_offset,
             uint64_t length, std::optional<uint32_t> notify, uint64_t cookie,
             bool /*more: each notification goes at once*/) override {
    core_->write(link_, src, src_offset, dst, dst_offset, length, notify, cookie);
  }
  void send_control(std::span<const uint8_t> message) override {
    core_->send_control(*link_, message, /*may_wait=*/true);
  }
  bool try_send_control(std::span<const uint8_t> message) override {
    return core_->send_control(*link_, message, /*may_wait=*/false);
  }

 private:
  std::shared_ptr<RailsCore> core_;
  std::shared_ptr<RailsLink> link_;
};

class RailsTransport final : public Transport {
 public:
  explicit RailsTransport(const TransportOptions& options)
      : core_(std::make_shared<RailsCore>(options)) {}
  ~RailsTransport() override { core_->stop(); }
  TransportKind kind() const override { return core_->kind(); }
  EndpointDescriptor endpoint() const override { return core_->endpoint(); }
  std::shared_ptr<Region> register_memory(const Device& device, void* ptr, uint64_t size) override {
    return core_->register_memory(device, ptr, size);
  }
  std::shared_ptr<Connection> connect(const EndpointDescriptor& peer,
                                      std::chrono::milliseconds timeout) override {
    return core_->connect(peer, timeout);
  }
  size_t poll(std::vector<TransportEvent>& out, std::chrono::nanoseconds timeout) override {
    return core_->poll(out, timeout);
  }

 private:
  std::shared_ptr<RailsCore> core_;
};

RailsCore::RailsCore(const TransportOptions& options) : options_(options) {
  if (options.kind == TransportKind::ipc)
    throw Error(HM_ERR_INVALID_ARGUMENT,
                "rails: the ipc transport takes no NIC (rails are for tcp, verbs and fabric)");
  if (options.rails.size() > kMaxRails)
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("rails: {} NICs named, at most {}", options.rails.size(), kMaxRails));
  for (size_t r = 0; r < options.rails.size(); ++r) {
    TransportOptions one = options;
    one.rails.clear();
    if (options.kind == TransportKind::tcp)
      one.listen_host = options.rails[r];
    else if (options.kind == TransportKind::verbs)
      one.rdma_device = options.rails[r];
    else if (is_ip_address(options.rails[r]))  // fabric: an address, or a domain's name
      one.listen_host = options.rails[r];
    else
      one.fabric_domain = options.rails[r];
    try {
      rails_.push_back(Transport::create(one));
    } catch (const Error& e) {
      throw Error(e.status(),
                  fmt::format("rails: rail {} ({}): {}", r, options.rails[r], e.what()));
    }
  }
  orphans_.resize(rails_.size());
  orphan_bytes_.resize(rails_.size());
  for (size_t r = 0; r < rails_.size(); ++r)
    threads_.push_back(std::make_unique<RailThreads>());
  try {
    for (size_t r = 0; r < rails_.size(); ++r) {
      threads_[r]->sender = start_thread("hm-rail-send", [this, r] { send_loop(r); });
      threads_[r]->poller = start_thread("hm-rail-poll", [this, r] { poll_loop(r); });
    }
    reviver_ = start_thread("hm-rail-revive", [this] { revive_loop(); });
  } catch (...) {
    stop();
    throw;
  }
}

void RailsCore::stop() {
  {
    Lock lock(mutex_);
    if (stopping_) return;
    stopping_ = true;
    for (auto& t : threads_)
      t->ready.notify_all();
    revive_ready_.notify_all();
  }
  for (auto& t : threads_) {
    if (t->sender.joinable()) t->sender.join();
    if (t->poller.joinable()) t->poller.join();
  }
  if (reviver_.joinable()) reviver_.join();
  Lock lock(mutex_);
  for (const auto& link : std::vector<std::shared_ptr<RailsLink>>(links_))
    lose(*link, "rails: the transport ended", /*tell=*/false);
  unlock_and_close(lock);
}

void RailsCore::unlock_and_close(Lock& lock) {
  std::vector<std::shared_ptr<Connection>> closing;
  closing.swap(closing_);
  lock.unlock();
  closing.clear();
}

EndpointDescriptor RailsCore::endpoint() const {
  std::vector<std::vector<uint8_t>> parts;
  for (const auto& r : rails_)
    parts.push_back(r->endpoint());
  return pack_rails(parts);
}

std::shared_ptr<Region> RailsCore::register_memory(const Device& device, void* ptr, uint64_t size) {
  std::vector<std::shared_ptr<Region>> parts;
  for (size_t r = 0; r < rails_.size(); ++r) {
    try {
      parts.push_back(rails_[r]->register_memory(device, ptr, size));
    } catch (const Error& e) {
      throw Error(e.status(),
                  fmt::format("rails: rail {} ({}): {}", r, options_.rails[r], e.what()));
    }
  }
  return std::make_shared<RailsRegion>(device, ptr, size, std::move(parts));
}

std::shared_ptr<Connection> RailsCore::connect(const EndpointDescriptor& peer,
                                               std::chrono::milliseconds timeout) {
  std::vector<std::vector<uint8_t>> parts = unpack_rails(peer, "endpoint");
  if (parts.size() != rails_.size())
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("rails: the peer has {} rails and this instance {} (every instance "
                            "of a job names as many NICs)",
                            parts.size(), rails_.size()));
  auto link = std::make_shared<RailsLink>();
  link->id = next_id_++;
  link->peer = peer;
  link->peer_parts = parts;
  {
    Lock lock(mutex_);
    connecting_.insert(peer);
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  // In rail order on both sides, so that each rail's two ends meet.
  for (size_t r = 0; r < rails_.size(); ++r) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    RailsLink::Rail rail;
    rail.name = options_.rails[r];
    try {
      rail.connection = rails_[r]->connect(parts[r], std::max(left, 1ms));
    } catch (const Error& e) {
      Lock lock(mutex_);
      for (size_t done = 0; done < link->rails.size(); ++done)  // their late events are no one's
        retire(done, link->rails[done].connection->id());
      connecting_.erase(connecting_.find(peer));
      lock.unlock();
      throw Error(e.status(), fmt::format("rails: rail {} ({}): {}", r, rail.name, e.what()));
    }
    link->rails.push_back(std::move(rail));
  }
  Lock lock(mutex_);
  connecting_.erase(connecting_.find(peer));
  if (stopping_) throw Error(kStatusPeerLost, "rails: connect: the transport ended");
  links_.push_back(link);
  std::vector<ConnectionId> ids;
  for (size_t r = 0; r < rails_.size(); ++r) {
    ids.push_back(link->rails[r].connection->id());
    by_child_[{r, ids[r]}] = link;
  }
  // What came before now, in order (handling it may take rails down, or the whole link).
  for (size_t r = 0; r < rails_.size(); ++r)
    adopt_orphans(r, ids[r]);
  unlock_and_close(lock);
  return std::make_shared<RailsConnection>(shared_from_this(), link);
}

void RailsCore::retire(size_t r, ConnectionId child) {
  retired_.insert({r, child});
  std::erase_if(orphans_[r], [&](const TransportEvent& e) {
    if (e.connection != child) return false;
    orphan_bytes_[r] -= orphan_cost(e);
    return true;
  });
}

void RailsCore::adopt_orphans(size_t r, ConnectionId child) {
  std::vector<TransportEvent> early;
  std::erase_if(orphans_[r], [&](TransportEvent& e) {
    if (e.connection != child) return false;
    orphan_bytes_[r] -= orphan_cost(e);
    early.push_back(std::move(e));
    return true;
  });
  for (auto& e : early)
    handle(r, e);
}

bool RailsCore::alive(const RailsLink& link) {
  Lock lock(mutex_);
  return !link.lost;
}

std::shared_ptr<RemoteRegion> RailsCore::import_region(RailsLink& link, const RegionDescriptor& d) {
  std::vector<std::vector<uint8_t>> parts = unpack_rails(d, "region");
  Lock lock(mutex_);
  if (parts.size() != link.rails.size())
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("rails: a region of {} rails on a connection of {}", parts.size(),
                            link.rails.size()));
  if (link.lost) throw Error(kStatusPeerLost, "rails: import_region: the peer is lost");
  std::vector<RailsRemoteRegion::Imported> remote(parts.size());
  std::optional<uint64_t> size;
  for (size_t r = 0; r < parts.size(); ++r) {
    if (!link.rails[r].connection) continue;  // down: imported if it comes back
    remote[r] = {link.rails[r].generation, link.rails[r].connection->import_region(parts[r])};
    if (!size) size = remote[r].remote->size();
    if (remote[r].remote->size() != *size)
      throw Error(HM_ERR_INVALID_ARGUMENT,
                  fmt::format("rails: the peer's region is {} bytes on one rail and {} on rail {}",
                              *size, remote[r].remote->size(), r));
  }
  if (!size) throw Error(kStatusPeerLost, "rails: import_region: every rail is down");
  return std::make_shared<RailsRemoteRegion>(*size, std::move(parts), std::move(remote));
}

std::shared_ptr<const RemoteRegion> RailsCore::remote_on(RailsLink& link,
                                                         const RailsRemoteRegion& region,
                                                         size_t r) {
  auto& rail = link.rails[r];
  if (!rail.connection || !rail.ready) return nullptr;
  auto& imported = region.rails[r];
  if (imported.generation == rail.generation && (imported.remote || imported.failed))
    return imported.remote;
  imported = {rail.generation, nullptr, true};  // said once a generation
  try {
    auto remote = rail.connection->import_region(region.parts[r]);
    if (remote->size() != region.size())
      throw Error(HM_ERR_INVALID_ARGUMENT,
                  fmt::format("the peer's region is {} bytes on another rail and {} here",
                              region.size(), remote->size()));
    imported = {rail.generation, std::move(remote), false};
    return imported.remote;
  } catch (const std::exception& e) {
    log(LogLevel::warn,
        "rails: connection {}: rail {} ({}): a region of the peer's: {}; its "
        "writes take the other rails",
        link.id, r, rail.name, e.what());
    return nullptr;
  }
}

uint64_t RailsCore::add_piece(RailsLink& link, RailsPiece piece) {
  const uint64_t id = link.next_piece++;
  ++link.writes[piece.write - link.first_write].open;
  link.pieces.emplace(id, std::move(piece));
  return id;
}

void RailsCore::write(const std::shared_ptr<RailsLink>& link, const Region& src,
                      uint64_t src_offset, const RemoteRegion& dst, uint64_t dst_offset,
                      uint64_t length, std::optional<uint32_t> notify, uint64_t cookie) {
  const auto* source = dynamic_cast<const RailsRegion*>(&src);
  const auto* target = dynamic_cast<const RailsRemoteRegion*>(&dst);
  if (source == nullptr || target == nullptr)
    throw Error(HM_ERR_INVALID_ARGUMENT, "write: regions were not made by this rails transport");
  if (notify && (*notify & kStripeNote) != 0)
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("write: notification {:#x}: over rails a notification is below 2^31 "
                            "(the top bit is the rails layer's own)",
                            *notify));
  check_write_range("source", src_offset, length, src.size());
  check_write_range("destination", dst_offset, length, dst.size());
  Lock lock(mutex_);
  if (link->lost) throw Error(kStatusPeerLost, "write: the peer is lost");
  const uint64_t write = link->first_write + link->writes.size();
  link->writes.push_back({cookie});
  std::shared_ptr<const RailsRegion> from = source->shared_from_this();
  std::shared_ptr<const RailsRemoteRegion> into = target->shared_from_this();
  auto piece = [&](uint64_t at, uint64_t n) {
    RailsPiece p{write, link->lead, from, src_offset + at, into, nullptr, dst_offset + at, n};
    return p;
  };
  // The other rails' stripes; the lead keeps the rest.
  std::vector<std::pair<size_t, std::shared_ptr<const RemoteRegion>>> others;
  if (length >= kStripeMin)
    for (size_t r = 0; r < link->rails.size(); ++r)
      if (r != link->lead)
        if (auto remote = remote_on(*link, *target, r)) others.emplace_back(r, std::move(remote));
  uint64_t at = 0;
  if (!others.empty()) {
    const uint64_t ways = others.size() + 1;
    const uint64_t stripe = (length / ways + kStripeAlign - 1) / kStripeAlign * kStripeAlign;
    for (auto& [r, remote] : others) {
      if (at + stripe >= length) break;
      RailsPiece p = piece(at, stripe);
      p.rail = r;
      p.dst_rail = std::move(remote);
      const uint64_t id = add_piece(*link, std::move(p));
      ++link->rails[r].issued;
      link->rails[r].unacked.push_back(id);
      enqueue(r, *link, {RailsPost::Kind::piece, id});
      at += stripe;
    }
  }
  // The lead's part, behind any piece held there. Its notification waits for every stripe of
  // another rail issued before it (this write's among them); its bytes before the notifying tail
  // need not.
  bool unacked = false;
  for (size_t r = 0; r < link->rails.size(); ++r)
    unacked = unacked || (r != link->lead && link->rails[r].connection &&
                          link->rails[r].acked < link->rails[r].issued);
  uint64_t tail = length - at;
  if (notify && unacked) {
    tail = std::min(kNotifyTail, length - at);
    if (length - at > tail) link->held.push_back(add_piece(*link, piece(at, length - at - tail)));
  }
  RailsPiece last = piece(length - tail, tail);
  if (notify) {
    last.notify = *notify;  // numbered when it first goes (send_on_lead)
    if (unacked)
      for (const auto& rail : link->rails)
        last.fence.push_back(rail.issued);
  }
  link->held.push_back(add_piece(*link, std::move(last)));
  release_held(*link);
  unlock_and_close(lock);
}

bool RailsCore::send_control(RailsLink& link, std::span<const uint8_t> message, bool may_wait) {
  if (message.size() > Connection::kMaxControlBytes - kRailsHeader)
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("control message of {} bytes exceeds {} (over rails)", message.size(),
                            Connection::kMaxControlBytes - kRailsHeader));
  // In their numbers' order: one sender at a time (a try does not wait for another).
  std::unique_lock in_order(link.sending, std::defer_lock);
  if (may_wait)
    in_order.lock();
  else if (!in_order.try_lock())
    return false;
  Lock lock(mutex_);
  if (link.lost) throw Error(kStatusPeerLost, "send_control: the peer is lost");
  if (link.control_log.size() >= kMaxControlLog ||
      link.control_log_bytes + message.size() > kMaxControlLogBytes) {
    lose(link,
         fmt::format("rails: the peer acknowledged none of the last {} control messages ({} "
                     "bytes)",
                     link.control_log.size(), link.control_log_bytes),
         /*tell=*/true);
    unlock_and_close(lock);
    throw Error(kStatusPeerLost, "send_control: the peer is lost");
  }
  const bool behind = link.moving || link.controls_queued > 0 || !link.rails[link.lead].connection;
  if (behind && !may_wait) {  // a try does not wait behind others
    unlock_and_close(lock);
    return false;
  }
  // Kept until acknowledged, so it goes again after a move of the lead.
  const uint64_t seq = ++link.controls_numbered;
  link.control_log.push_back({seq, std::vector<uint8_t>(message.begin(), message.end())});
  link.control_log_bytes += message.size();
  const size_t lead = link.lead;
  const uint64_t epoch = link.control_epoch;
  if (behind) {
    // Behind what waits to go before it, for the lead's sender; it returns once it went, as a
    // direct send does (or the lead moved, or the link was lost, or io_timeout passed: it goes
    // later, in order).
    ++link.controls_queued;
    enqueue(lead, link, {RailsPost::Kind::control, 0, seq, epoch});
    link.controls_sent.wait_for(lock, options_.io_timeout, [&] {
      return link.lost || stopping_ || link.control_epoch != epoch || link.controls_queued == 0;
    });
    unlock_and_close(lock);
    return true;
  }
  std::shared_ptr<Connection> connection = link.rails[lead].connection;
  const uint64_t generation = link.rails[lead].generation;
  lock.unlock();
  const std::vector<uint8_t> framed = rails_message(RailsMessage::user, {seq}, message);
  bool sent = true;
  std::string failure;
  try {
    if (may_wait)
      connection->send_control(framed);
    else
      sent = connection->try_send_control(framed);
  } catch (const std::exception& e) {
    failure = e.what();
  }
  connection.reset();
  lock.lock();
  if (!sent && failure.empty() && link.control_epoch == epoch && !link.control_log.empty() &&
      link.control_log.back().seq == seq) {
    // Not sent, not queued again by a move meanwhile, and nothing numbered after it (`sending` is
    // held): as if never asked.
    link.control_log.pop_back();
    link.control_log_bytes -= message.size();
    --link.controls_numbered;
    unlock_and_close(lock);
    return false;
  }
  // A failed send takes the lead down; the message goes again on the next.
  if (!failure.empty() && link.lead == lead && link.rails[lead].generation == generation)
    rail_down(link, lead, failure);
  unlock_and_close(lock);
  return true;
}

void RailsCore::drop(RailsLink& link) {
  Lock lock(mutex_);
  lose(link, "the connection was closed", /*tell=*/false);
  unlock_and_close(lock);
}

void RailsCore::close_rail(RailsLink& link, size_t r) {
  if (auto& connection = link.rails[r].connection) {
    retire(r, connection->id());
    by_child_.erase({r, connection->id()});
    closing_.push_back(std::move(connection));
  }
}

void RailsCore::forget(RailsLink& link) {
  for (size_t r = 0; r < link.rails.size(); ++r)
    close_rail(link, r);
  std::erase_if(links_, [&](const auto& l) { return l.get() == &link; });
}

void RailsCore::enqueue(size_t rail, RailsLink& link, RailsPost post, bool first) {
  post.generation = link.rails[rail].generation;
  auto& t = *threads_[rail];
  if (first)
    t.queue.emplace_front(link.weak_from_this(), post);
  else
    t.queue.emplace_back(link.weak_from_this(), post);
  t.ready.notify_one();
}

void RailsCore::send_loop(size_t r) {
  auto& t = *threads_[r];
  Lock lock(mutex_);
  for (;;) {
    t.ready.wait(lock, [&] { return stopping_ || !t.queue.empty(); });
    if (stopping_) return;
    auto [weak, post] = std::move(t.queue.front());
    t.queue.pop_front();
    auto link = weak.lock();
    if (link && post.kind == RailsPost::Kind::lead_ack && link->lead_ack_rail == r &&
        link->lead_ack_generation == post.generation)
      link->lead_ack_queued = false;  // sent now, or dropped: the next move is answered anew
    // Re-routed, or gone; or queued for a connection of the rail since replaced (its pieces went
    // elsewhere or wait for the peer's count, its messages were of that connection).
    if (!link || link->lost || !link->rails[r].connection ||
        post.generation != link->rails[r].generation)
      continue;
    // A control message queued before a move goes again after it; one queued while moving waits
    // for the peer's answer (the log keeps it).
    if (post.kind == RailsPost::Kind::control &&
        (post.epoch != link->control_epoch || link->moving))
      continue;
    std::shared_ptr<Connection> connection = link->rails[r].connection;
    auto& rail = link->rails[r];
    hm_status status = HM_OK;
    std::string message;
    if (post.kind != RailsPost::Kind::piece) {
      std::vector<uint8_t> bytes;
      switch (post.kind) {
        case RailsPost::Kind::acknowledge:
          rail.ack_queued = false;
          bytes = rails_message(RailsMessage::acknowledge, {rail.landed, link->controls_delivered});
          break;
        case RailsPost::Kind::lead:
          bytes = rails_message(RailsMessage::lead, {link->moves});
          break;
        case RailsPost::Kind::lead_ack:
          bytes = rails_message(RailsMessage::lead_ack, {link->peer_moves, link->notes_delivered,
                                                         link->controls_delivered});
          break;
        case RailsPost::Kind::control: {
          // Not yet acknowledged (else done).
          auto c = std::lower_bound(
              link->control_log.begin(), link->control_log.end(), post.control,
              [](const RailsLink::Control& x, uint64_t seq) { return x.seq < seq; });
          if (c == link->control_log.end() || c->seq != post.control) {
            --link->controls_queued;
            link->controls_sent.notify_all();
            continue;
          }
          bytes = rails_message(RailsMessage::user, {c->seq}, c->payload);
          break;
        }
        case RailsPost::Kind::piece:
          break;
      }
      const uint64_t generation = rail.generation;
      lock.unlock();
      try {
        connection->send_control(bytes);
      } catch (const std::exception& e) {
        message = e.what();
        status = HM_ERR_BACKEND;
      }
      connection.reset();
      lock.lock();
      // Sent: a direct send may go from now (none overtakes it).
      if (post.kind == RailsPost::Kind::control && post.epoch == link->control_epoch) {
        --link->controls_queued;
        link->controls_sent.notify_all();
      }
      // (A connection that failed after the rail came back on a new one is not the rail's.)
      if (status != HM_OK && link->rails[r].generation == generation) rail_down(*link, r, message);
      close_outside(lock);
      continue;
    }
    auto p = link->pieces.find(post.piece);
    if (p == link->pieces.end() || p->second.rail != r || p->second.abandoned) continue;
    p->second.writing = true;
    ++rail.posted;
    const uint64_t generation = rail.generation;
    {
      // Its own references to the regions: they live until the write returns, and the last one
      // goes here, outside the lock.
      const RailsPiece piece = p->second;
      lock.unlock();
      try {
        connection->write(piece.src->rail(r), piece.src_offset, *piece.dst_rail, piece.dst_offset,
                          piece.length, piece.notify, post.piece);
      } catch (const std::exception& e) {
        const auto* error = dynamic_cast<const Error*>(&e);
        status = error ? error->status() : HM_ERR_BACKEND;
        message = e.what();
      }
    }
    connection.reset();
    lock.lock();
    // (A write on a connection since replaced failed with it: its piece went elsewhere already.)
    sent(*link, r, post.piece, link->rails[r].generation == generation ? status : HM_OK, message);
    close_outside(lock);
  }
}

void RailsCore::close_outside(Lock& lock) {
  if (closing_.empty()) return;
  unlock_and_close(lock);
  lock.lock();
}

void RailsCore::poll_loop(size_t r) {
  std::vector<TransportEvent> batch;
  for (;;) {
    batch.clear();
    try {
      rails_[r]->poll(batch, kPollSlice);
    } catch (const std::exception& e) {
      // The rail's events stop here: every connection's rail goes down with it.
      Lock lock(mutex_);
      log(LogLevel::error, "rails: rail {} ({}): poll: {}; the rail is taken out", r,
          options_.rails[r], e.what());
      threads_[r]->broken = true;
      for (const auto& link : std::vector<std::shared_ptr<RailsLink>>(links_))
        rail_down(*link, r, fmt::format("poll: {}", e.what()));
      unlock_and_close(lock);
      return;
    }
    Lock lock(mutex_);
    if (stopping_) return;
    for (auto& e : batch)
      handle(r, e);
    unlock_and_close(lock);
  }
}

void RailsCore::handle(size_t r, TransportEvent& e) {
  auto it = by_child_.find({r, e.connection});
  if (it == by_child_.end()) {
    if (retired_.contains({r, e.connection})) {
      if (e.type == TransportEvent::Type::peer_lost) retired_.erase({r, e.connection});
      return;
    }
    const size_t bytes = orphan_cost(e);
    if (orphan_bytes_[r] + bytes > kMaxOrphanBytes) {
      log(LogLevel::error,
          "rails: rail {} ({}): dropped an event of a connection not yet made ({} bytes of them "
          "wait already)",
          r, options_.rails[r], orphan_bytes_[r]);
      return;
    }
    orphan_bytes_[r] += bytes;
    orphans_[r].push_back(std::move(e));
    return;
  }
  std::shared_ptr<RailsLink> link = it->second.lock();
  if (!link) {
    by_child_.erase(it);
    return;
  }
  auto& rail = link->rails[r];
  if (link->lost || !rail.connection) return;  // its writes went elsewhere or failed already
  switch (e.type) {
    case TransportEvent::Type::write_done: {
      auto p = link->pieces.find(e.cookie);
      if (p == link->pieces.end() || p->second.rail != r) return;  // sent again elsewhere
      // Done once acknowledged; a failed one takes its rail down, and goes again elsewhere.
      if (e.status != HM_OK) rail_down(*link, r, e.message);
      return;
    }
    case TransportEvent::Type::notification:
      if ((e.value & kStripeNote) == 0 && r != link->peer_lead) {
        rail_down(*link, r,
                  fmt::format("a notification of the user's came on it, and the peer's lead is "
                              "rail {}",
                              link->peer_lead));
        return;
      }
      ++rail.landed;  // acknowledged, ahead of this end's own writes on the rail
      if (!rail.ack_queued) {
        rail.ack_queued = true;
        enqueue(r, *link, {RailsPost::Kind::acknowledge}, /*first=*/true);
      }
      if ((e.value & kStripeNote) != 0) return;  // the layer's own, never passed up
      ++link->notes_delivered;
      break;
    case TransportEvent::Type::control:
      if (!layer_message(*link, r, e)) return;
      break;
    case TransportEvent::Type::peer_lost: {
      // The peer's end (its process gone, or done) closes every rail: once no other is open, that
      // is the connection's loss, not a rail's.
      bool others = false;
      for (size_t i = 0; i < link->rails.size(); ++i)
        others =
            others || (i != r && link->rails[i].connection && link->rails[i].connection->alive());
      if (others)
        rail_down(*link, r, e.message);
      else
        lose(*link, fmt::format("rails: rail {} ({}): {}", r, rail.name, e.message),
             /*tell=*/true);
      return;
    }
  }
  e.connection = link->id;  // the user's notification or control message
  events_.push(std::move(e));
}

bool RailsCore::layer_message(RailsLink& link, size_t r, TransportEvent& e) {
  auto& rail = link.rails[r];
  uint64_t counts[3] = {0, 0, 0};
  const std::optional<RailsMessage> kind = parse_rails_message(e.payload, counts);
  if (!kind) {
    rail_down(link, r,
              fmt::format("a control message of {} bytes that is not the rails layer's "
                          "(kind {})",
                          e.payload.size(), e.payload.empty() ? -1 : int{e.payload[0]}));
    return false;
  }
  if (!rail.ready) {
    rail.ready = true;
    log(LogLevel::warn,
        "rails: connection {}: rail {} ({}) is back after {} ms and takes stripes again", link.id,
        r, rail.name,
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                              rail.down_since)
            .count());
  }
  switch (*kind) {
    case RailsMessage::acknowledge:
      acknowledged(link, r, counts[0], counts[1]);
      release_held(link);
      return false;
    case RailsMessage::lead:
      peer_moved(link, r, counts[0]);
      return false;
    case RailsMessage::lead_ack:
      moved(link, r, counts[0], counts[1], counts[2]);
      return false;
    case RailsMessage::user:
      break;
  }
  const uint64_t seq = counts[0];
  if (r != link.peer_lead || seq > link.controls_delivered + 1) {
    rail_down(link, r,
              fmt::format("the peer's control message {} came on it (its lead is rail {}, and {} "
                          "came before)",
                          seq, link.peer_lead, link.controls_delivered));
    return false;
  }
  if (!rail.ack_queued) {  // so the peer lets go of it
    rail.ack_queued = true;
    enqueue(r, link, {RailsPost::Kind::acknowledge}, /*first=*/true);
  }
  if (seq <= link.controls_delivered) return false;  // sent again after a move: passed up already
  ++link.controls_delivered;
  e.payload.erase(e.payload.begin(), e.payload.begin() + kRailsHeader);
  return true;
}

void RailsCore::acknowledged(RailsLink& link, size_t r, uint64_t count, uint64_t controls) {
  auto& rail = link.rails[r];
  if (count < rail.acked || count > rail.posted || controls > link.controls_numbered) {
    rail_down(link, r,
              fmt::format("the peer acknowledged {} pieces of the {} sent, and {} control "
                          "messages of {}",
                          count, rail.posted, controls, link.controls_numbered));
    return;
  }
  if (count > rail.acked) rail.cooldown = kCooldown;  // it carries bytes: a failure is new
  for (; rail.acked < count; ++rail.acked) {
    const uint64_t id = rail.unacked.front();
    rail.unacked.pop_front();
    complete(link, id, HM_OK, "");
  }
  trim_controls(link, controls);
}

void RailsCore::trim_controls(RailsLink& link, uint64_t passed_up) {
  while (!link.control_log.empty() && link.control_log.front().seq <= passed_up) {
    link.control_log_bytes -= link.control_log.front().payload.size();
    link.control_log.pop_front();
  }
}

void RailsCore::rail_down(RailsLink& link, size_t r, const std::string& why) {
  auto& rail = link.rails[r];
  if (!rail.connection) return;
  if (r == link.lead) {
    lead_down(link, r, why);
    return;
  }
  const bool again = !stopping_ && !threads_[r]->broken;
  const auto wait = again ? schedule_revival(link, r) : std::chrono::milliseconds(0);
  log(LogLevel::warn,
      "rails: connection {}: rail {} ({}) is down: {}; {} piece(s) not acknowledged go again on "
      "rail {}{}",
      link.id, r, rail.name, why, rail.unacked.size(), link.lead,
      again ? fmt::format(", and the rail is tried again in {} ms", wait.count())
            : std::string(", and the rail takes no more writes"));
  close_rail(link, r);
  rail.down_since = std::chrono::steady_clock::now();
  const std::deque<uint64_t> unacked = std::move(rail.unacked);
  rail.unacked.clear();
  rail.acked = rail.posted = rail.issued;
  // Before any notification held there: release_held sends those behind them.
  for (uint64_t id : unacked)
    send_again(link, id);
  release_held(link);
}

void RailsCore::lead_down(RailsLink& link, size_t r, const std::string& why) {
  auto& rail = link.rails[r];
  const bool again = !stopping_ && !threads_[r]->broken;
  close_rail(link, r);
  rail.down_since = std::chrono::steady_clock::now();
  // Its pieces not acknowledged wait for the peer's count of what it passed up (moved()).
  link.stranded.insert(link.stranded.end(), rail.unacked.begin(), rail.unacked.end());
  rail.unacked.clear();
  rail.acked = rail.posted = rail.issued;
  // The lowest rail up, one the peer was heard on first (one just connected again leads too: the
  // peer adopts what comes on it early).
  size_t next = link.rails.size();
  for (size_t i = 0; i < link.rails.size() && next == link.rails.size(); ++i)
    if (link.rails[i].connection && link.rails[i].ready) next = i;
  for (size_t i = 0; i < link.rails.size() && next == link.rails.size(); ++i)
    if (link.rails[i].connection) next = i;
  if (next == link.rails.size()) {
    const std::string lost =
        fmt::format("rails: every rail is down (the last, rail {} ({}): {})", r, rail.name, why);
    log(LogLevel::warn, "rails: connection {}: {}", link.id, lost);
    lose(link, lost, /*tell=*/true);
    return;
  }
  const auto wait = again ? schedule_revival(link, r) : std::chrono::milliseconds(0);
  log(LogLevel::warn,
      "rails: connection {}: rail {} ({}) is down: {}; rail {} ({}) carries the notifications "
      "from now, and {} piece(s) not acknowledged go again there unless the peer has them{}",
      link.id, r, rail.name, why, next, link.rails[next].name, link.stranded.size(),
      again ? fmt::format("; the rail is tried again in {} ms", wait.count())
            : std::string("; the rail takes no more writes"));
  link.lead = next;
  link.moving = true;
  link.move_deadline = std::chrono::steady_clock::now() + options_.io_timeout;
  ++link.moves;
  ++link.control_epoch;  // what was queued goes again after the move, in order
  link.controls_queued = 0;
  link.controls_sent.notify_all();
  enqueue(next, link, {RailsPost::Kind::lead}, /*first=*/true);
}

void RailsCore::peer_moved(RailsLink& link, size_t r, uint64_t move) {
  if (move <= link.peer_moves) return;  // an older move, late on its rail
  link.peer_moves = move;
  // Nothing more of the old lead's is passed up from now (its connection is retired here), so
  // the counts the answer carries are final for it.
  if (r != link.peer_lead && link.rails[link.peer_lead].connection)
    rail_down(link, link.peer_lead, fmt::format("the peer moved its lead to rail {}", r));
  if (link.lost || !link.rails[r].connection) return;
  link.peer_lead = r;
  if (link.lead_ack_queued && link.lead_ack_rail == r &&
      link.lead_ack_generation == link.rails[r].generation)
    return;  // the one queued there answers with the counts of when it goes
  link.lead_ack_queued = true;
  link.lead_ack_rail = r;
  link.lead_ack_generation = link.rails[r].generation;
  enqueue(r, link, {RailsPost::Kind::lead_ack}, /*first=*/true);
}

void RailsCore::moved(RailsLink& link, size_t r, uint64_t move, uint64_t notes, uint64_t controls) {
  // An answer to a move since overtaken by another is not this one's.
  if (!link.moving || r != link.lead || move != link.moves) return;
  if (notes > link.notes_sent || controls > link.controls_numbered) {
    rail_down(link, r,
              fmt::format("the peer passed up {} notifications of the {} sent and {} control "
                          "messages of {}",
                          notes, link.notes_sent, controls, link.controls_numbered));
    return;
  }
  link.moving = false;
  // The old leads' pieces in the order they went: up to the last notification the peer passed
  // up they have landed, the rest go again, the user's notifications among them numbered on.
  link.notes_sent = notes;
  const std::deque<uint64_t> stranded = std::move(link.stranded);
  link.stranded.clear();
  for (uint64_t id : stranded) {
    auto p = link.pieces.find(id);
    if (p == link.pieces.end()) continue;
    if (p->second.mark <= notes)
      complete(link, id, HM_OK, "");
    else
      send_again(link, id);
  }
  trim_controls(link, controls);
  ++link.control_epoch;  // those queued while moving go now, in order with those sent again
  link.controls_queued = 0;
  link.controls_sent.notify_all();
  for (const auto& c : link.control_log) {
    ++link.controls_queued;
    enqueue(r, link, {RailsPost::Kind::control, 0, c.seq, link.control_epoch});
  }
  log(LogLevel::info,
      "rails: connection {}: the peer answered on rail {}: {} piece(s) and {} "
      "control message(s) go again",
      link.id, r, stranded.size(), link.control_log.size());
  release_held(link);
}

void RailsCore::send_on_lead(RailsLink& link, uint64_t id) {
  RailsPiece& p = link.pieces.at(id);
  const size_t lead = link.lead;
  const bool users = (p.notify & kStripeNote) == 0;
  p.rail = lead;
  p.dst_rail = remote_on(link, *p.dst, lead);
  if (!p.dst_rail) {
    const std::string why =
        fmt::format("rails: rail {} ({}): the peer's region could not be imported there", lead,
                    link.rails[lead].name);
    if (users && p.user_seq != 0) {  // numbered: the peer's count would no longer match
      lose(link, why, /*tell=*/true);
      return;
    }
    complete(link, id, HM_ERR_BACKEND, why);
    return;
  }
  if (users) {
    if (p.user_seq == 0) p.user_seq = ++link.notes_numbered;
    p.mark = p.user_seq;
    link.notes_sent = std::max(link.notes_sent, p.user_seq);
  } else {
    p.mark = link.notes_sent + 1;
  }
  ++link.rails[lead].issued;
  link.rails[lead].unacked.push_back(id);
  enqueue(lead, link, {RailsPost::Kind::piece, id});
}

void RailsCore::send_again(RailsLink& link, uint64_t id) {
  auto p = link.pieces.find(id);
  if (p == link.pieces.end()) return;
  RailsPiece again = p->second;
  again.fence.clear();
  again.mark = UINT64_MAX;
  again.writing = again.abandoned = false;
  again.abandoned_status = HM_OK;
  again.abandoned_message.clear();
  const uint64_t id_again = add_piece(link, std::move(again));
  // The original is settled as done (after its copy counts, so its write stays open), once its
  // sender is back where it is inside the write (it may still read the memory).
  complete(link, id, HM_OK, "");
  if (link.moving) {  // the lead takes it once the peer answered (its user notification waits)
    link.stranded.push_back(id_again);
    return;
  }
  send_on_lead(link, id_again);
}

std::chrono::milliseconds RailsCore::schedule_revival(RailsLink& link, size_t r) {
  auto& rail = link.rails[r];
  // Both ends try on their own, each try a window of kReviveWindow: with equal waits, two ends
  // whose windows missed each other once would miss each other at every try after. So every wait
  // but the first is drawn from [cooldown / 2, cooldown * 3 / 2).
  auto wait = rail.cooldown;
  if (rail.cooldown > kCooldown)
    wait = rail.cooldown / 2 + std::chrono::milliseconds(std::uniform_int_distribution<int64_t>(
                                   0, rail.cooldown.count() - 1)(jitter_));
  revivals_.push_back({link.weak_from_this(), r, std::chrono::steady_clock::now() + wait});
  rail.cooldown = std::min(rail.cooldown * 2, kCooldownMost);
  revive_ready_.notify_one();
  return wait;
}

void RailsCore::revive_loop() {
  Lock lock(mutex_);
  while (!stopping_) {
    check_moves();
    close_outside(lock);
    // Awake at least every kMoveCheck, for the moves' deadlines.
    const auto soon = std::chrono::steady_clock::now() + kMoveCheck;
    auto due = std::min_element(revivals_.begin(), revivals_.end(),
                                [](const Revival& x, const Revival& y) { return x.at < y.at; });
    if (due == revivals_.end()) {
      revive_ready_.wait_until(lock, soon);
      continue;
    }
    if (due->at > std::chrono::steady_clock::now()) {
      revive_ready_.wait_until(lock, std::min(due->at, soon));
      continue;
    }
    const size_t r = due->rail;
    std::shared_ptr<RailsLink> link = due->link.lock();
    revivals_.erase(due);
    if (!link || link->lost || link->rails[r].connection || threads_[r]->broken) continue;
    // Each end connects its rail again on its own; with two connections to one peer, the two ends
    // could pair one's rail with the other's, so such a rail stays down.
    if (connecting_.contains(link->peer) ||
        std::count_if(links_.begin(), links_.end(),
                      [&](const auto& l) { return l->peer == link->peer; }) > 1) {
      log(LogLevel::warn,
          "rails: connection {}: rail {} ({}) is not tried again: another connection to the same "
          "peer could take its place",
          link->id, r, link->rails[r].name);
      continue;
    }
    const std::vector<uint8_t> part = link->peer_parts[r];
    lock.unlock();
    std::shared_ptr<Connection> connection;
    std::string why;
    try {
      connection = rails_[r]->connect(part, kReviveWindow);
    } catch (const std::exception& e) {
      why = e.what();
    }
    lock.lock();
    auto& rail = link->rails[r];
    const bool wanted = !stopping_ && !link->lost && !rail.connection && !threads_[r]->broken;
    if (connection && wanted) {
      rail_back(*link, r, std::move(connection));
    } else if (connection) {
      retire(r, connection->id());
      closing_.push_back(std::move(connection));
    } else if (wanted) {
      const auto wait = schedule_revival(*link, r);
      log(LogLevel::info,
          "rails: connection {}: rail {} ({}) is not back yet ({}); next try in {} ms", link->id, r,
          rail.name, why, wait.count());
    }
    link.reset();
    close_outside(lock);
  }
}

void RailsCore::check_moves() {
  const auto now = std::chrono::steady_clock::now();
  for (const auto& link : std::vector<std::shared_ptr<RailsLink>>(links_))
    if (link->moving && !link->lost && now >= link->move_deadline)
      lead_down(*link, link->lead,
                fmt::format("the peer did not answer the move of the lead within {} ms",
                            options_.io_timeout.count()));
}

void RailsCore::rail_back(RailsLink& link, size_t r, std::shared_ptr<Connection> connection) {
  auto& rail = link.rails[r];
  const ConnectionId child = connection->id();
  rail.connection = std::move(connection);
  ++rail.generation;
  rail.issued = rail.posted = rail.acked = rail.landed = 0;
  // Not striped over until the peer is heard on it; the peer hears this end at once.
  rail.ready = false;
  rail.ack_queued = true;
  enqueue(r, link, {RailsPost::Kind::acknowledge});
  // Fences on this rail were of the connection before: every stripe they waited for went again on
  // the lead, ahead of them.
  for (uint64_t id : link.held) {
    auto p = link.pieces.find(id);
    if (p != link.pieces.end() && r < p->second.fence.size()) p->second.fence[r] = 0;
  }
  by_child_[{r, child}] = link.weak_from_this();
  log(LogLevel::info,
      "rails: connection {}: rail {} ({}) is connected again; striped over once the peer is heard "
      "on it",
      link.id, r, rail.name);
  adopt_orphans(r, child);
}

void RailsCore::lose(RailsLink& link, const std::string& why, bool tell) {
  if (link.lost) return;
  link.lost = true;
  if (tell) {
    TransportEvent lost{TransportEvent::Type::peer_lost, link.id};
    lost.message = why;
    events_.push(std::move(lost));
  }
  std::vector<uint64_t> open;
  for (const auto& [id, _] : link.pieces)
    open.push_back(id);
  for (uint64_t id : open)
    complete(link, id, kStatusPeerLost, why);
  link.held.clear();
  link.stranded.clear();
  link.control_log.clear();
  link.control_log_bytes = 0;
  link.controls_sent.notify_all();
  forget(link);
}

void RailsCore::complete(RailsLink& link, uint64_t piece, hm_status status,
                         const std::string& message) {
  auto p = link.pieces.find(piece);
  if (p == link.pieces.end()) return;
  if (p->second.writing) {  // settled by sent() once the sender is back
    if (!p->second.abandoned || p->second.abandoned_status == HM_OK) {
      p->second.abandoned_status = status;
      p->second.abandoned_message = message;
    }
    p->second.abandoned = true;
    return;
  }
  auto& w = link.writes[p->second.write - link.first_write];
  link.pieces.erase(p);
  if (status != HM_OK && w.status == HM_OK) {
    w.status = status;
    w.message = message;
  }
  --w.open;
  emit_done(link);
}

void RailsCore::sent(RailsLink& link, size_t r, uint64_t piece, hm_status status,
                     const std::string& message) {
  auto p = link.pieces.find(piece);
  if (p == link.pieces.end()) return;
  p->second.writing = false;
  if (p->second.abandoned) {
    const hm_status settled = p->second.abandoned_status;
    const std::string why = p->second.abandoned_message;
    complete(link, piece, settled, why);
    return;
  }
  if (status == HM_OK) return;  // done by the peer's acknowledgement
  rail_down(link, r, message);
}

void RailsCore::release_held(RailsLink& link) {
  while (!link.moving && !link.lost && !link.held.empty()) {
    const uint64_t id = link.held.front();
    auto p = link.pieces.find(id);
    if (p != link.pieces.end()) {
      const auto& fence = p->second.fence;
      for (size_t r = 0; r < fence.size(); ++r)
        if (r != link.lead && link.rails[r].connection && link.rails[r].acked < fence[r]) return;
    }
    link.held.pop_front();
    if (p != link.pieces.end()) send_on_lead(link, id);
  }
}

void RailsCore::emit_done(RailsLink& link) {
  while (!link.writes.empty() && link.writes.front().open == 0) {
    auto& w = link.writes.front();
    TransportEvent done{TransportEvent::Type::write_done, link.id};
    done.cookie = w.cookie;
    done.status = w.status;
    done.message = std::move(w.message);
    events_.push(std::move(done));
    link.writes.pop_front();
    ++link.first_write;
  }
}

}  // namespace

std::unique_ptr<Transport> make_rails_transport(const TransportOptions& options) {
  return std::make_unique<RailsTransport>(options);
}

}  // namespace hetmesh::detail
