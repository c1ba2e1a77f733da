// An engine's peers through their incarnations: the comm thread's turn and the rejoin thread
// (peer_group.hpp, PeerGroup).
#include "peer_group.hpp"

#include "wire.hpp"

#include <hetmesh/core/log.hpp>
#include <hetmesh/core/thread.hpp>

namespace hetmesh::afd {

namespace {

// How long the rejoin thread's wait on the member log lasts before it looks at its stop flag: what
// an engine's destruction may wait for it.
constexpr std::chrono::milliseconds kWatchSlice{20};
// Events of a link not installed yet that the comm thread keeps (the credits bound a real peer's to
// a few per micro-batch); beyond it the oldest go.
constexpr size_t kMaxEarlyEvents = 4096;
// Peer changes kept for PeerHistory: a job whose peers come and go for days keeps the latest.
constexpr size_t kMaxHistory = 1024;

}  // namespace

PeerGroup::PeerGroup(const EngineSpec& spec, Role peer_role, Transport& transport, Joined joined,
                     std::mutex& mutex, PeerHandler& handler, EngineMetrics& metrics)
    : spec_(spec),
      peer_role_(peer_role),
      transport_(transport),
      own_epoch_(joined.epoch),
      peers_(std::move(joined.peers)),
      mutex_(mutex),
      handler_(handler),
      metrics_(metrics),
      heartbeat_(spec, peer_role, peers_.size()),
      superseded_(peers_.size(), 0),
      known_(peers_.size(), 0) {
  for (const Peer& peer : peers_) {
    members_[peer.link->connection->id()] = {peer.rank, peer.link->epoch};
    known_[static_cast<size_t>(peer.rank)] = peer.link->epoch;
  }
}

PeerGroup::~PeerGroup() {
  stop_rejoin();
}

void PeerGroup::start_rejoin(std::unique_ptr<KeyValueStore> store) {
  ask_store_ = store->clone();
  rejoin_ = start_thread(
      "hm-rejoin", [this, store = std::move(store)]() mutable { rejoin_loop(std::move(store)); });
}

void PeerGroup::stop_rejoin() {
  stopping_.store(true, std::memory_order_release);
  if (rejoin_.joinable()) rejoin_.join();
}

void PeerGroup::record_locked(PeerChange change) {
  if (change.state == PeerStatus::State::lost)
    metrics_.peer_lost(change.rank);
  else
    metrics_.peer_joined(change.rank);
  if (history_.size() == kMaxHistory) history_.pop_front();
  history_.push_back(std::move(change));
}

PeerHistory PeerGroup::history_locked() const {
  return {{history_.begin(), history_.end()}, stale_.load(std::memory_order_relaxed)};
}

bool PeerGroup::newer_epoch_claimed(int rank, uint64_t than) {
  std::lock_guard lock(ask_mutex_);
  if (!ask_store_) return false;
  try {
    Membership membership(*ask_store_, spec_.job, to_string(spec_.role), spec_.rank);
    return membership.claimed_epoch(to_string(peer_role_), rank) > than;
  } catch (const std::exception& e) {
    log(LogLevel::warn, "{}: cannot ask the store whether {} is being replaced: {}",
        peer_name(spec_.role, spec_.rank), peer_name(peer_role_, rank), e.what());
    return false;
  }
}

void PeerGroup::turn() {
  try {
    apply_changes();
    events_.clear();
    transport_.poll(events_, std::chrono::milliseconds(2));
    for (const auto& e : events_)
      handle(e);
    handler_.on_turn();
    if (auto quiet = heartbeat_.tick(peers_)) lose(quiet->rank, quiet->reason);
  } catch (const Error& e) {
    handler_.on_failure(e.status(), e.what());
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  } catch (const std::exception& e) {
    handler_.on_failure(HM_ERR_INTERNAL, e.what());
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void PeerGroup::handle(const TransportEvent& e) {
  auto member = members_.find(e.connection);
  if (member == members_.end()) {  // a replacement's link, connected but not installed yet
    if (early_.size() == kMaxEarlyEvents) early_.erase(early_.begin());
    early_.push_back(e);
    return;
  }
  Peer& peer = at(member->second.rank);
  if (member->second.epoch != peer.link->epoch) {  // a superseded incarnation's: refused
    stale_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  using Type = TransportEvent::Type;
  switch (e.type) {
    case Type::notification:
    case Type::control:
      heartbeat_.heard(peer.rank);
      if (e.type == Type::control && decode_control(e.payload) == ControlWord::quit) {
        lose(peer.rank,
             fmt::format("{} quit: it ended after a failure of its own",
                         peer_name(peer_role_, peer.rank)),
             /*quit=*/true);
        break;
      }
      if (!peer.lost) handler_.on_message(peer.rank, e);
      break;
    case Type::peer_lost:
      lose(peer.rank, fmt::format("{} lost: {}", peer_name(peer_role_, peer.rank), e.message));
      break;
    case Type::write_done:
      // A write that failed because its peer is gone is that peer's peer_lost event's to judge;
      // any other failed write is fatal.
      if (e.status != HM_OK && e.status != kStatusPeerLost && !peer.lost &&
          peer.link->connection->alive())
        throw Error(e.status, fmt::format("a write to {} failed: {}",
                                          peer_name(peer_role_, peer.rank), e.message));
      break;
  }
}

void PeerGroup::lose(int rank, const std::string& reason, bool quit) {
  {
    std::lock_guard lock(mutex_);
    Peer& peer = at(rank);
    if (peer.left || peer.lost) return;
    peer.lost = true;
    peer.quit = quit;
    peer.lost_reason = reason;
    handler_.on_lost_locked(rank, reason);
    record_locked({now_ns(), peer_role_, rank, peer.link->epoch, PeerStatus::State::lost, reason});
  }
  log(LogLevel::warn, "{}: {}", peer_name(spec_.role, spec_.rank), reason);
}

void PeerGroup::apply_changes() {
  std::vector<Change> changes;
  {
    std::lock_guard lock(mutex_);
    if (changes_.empty()) return;
    changes.swap(changes_);
  }
  for (Change& change : changes) {
    Peer& peer = at(change.rank);
    if (!change.link) {  // the rejoin thread saw a newer incarnation: the current one is over
      if (peer.link->epoch < change.epoch)
        lose(change.rank,
             fmt::format("{} (epoch {}) was replaced by epoch {}",
                         peer_name(peer_role_, change.rank), peer.link->epoch, change.epoch));
      std::lock_guard lock(mutex_);
      superseded_[static_cast<size_t>(change.rank)] = change.epoch;
      continue;
    }
    const ConnectionId id = change.link->connection->id();
    {
      std::lock_guard lock(mutex_);
      peer.link = std::move(change.link);
      handler_.on_rejoined_locked(change.rank);
      peer.lost = peer.left = peer.quit = false;
      peer.lost_reason.clear();
      record_locked({now_ns(), peer_role_, change.rank, change.epoch, PeerStatus::State::live, {}});
    }
    members_[id] = {change.rank, change.epoch};
    heartbeat_.restart(change.rank);
    log(LogLevel::info, "{}: {} rejoined (epoch {})", peer_name(spec_.role, spec_.rank),
        peer_name(peer_role_, change.rank), change.epoch);
    // What the new incarnation sent before it was installed, in order.
    std::vector<TransportEvent> held;
    std::erase_if(early_, [&](TransportEvent& e) {
      if (e.connection != id) return false;
      held.push_back(std::move(e));
      return true;
    });
    for (const auto& e : held)
      handle(e);
  }
}

void PeerGroup::rejoin_loop(std::unique_ptr<KeyValueStore> store) {
  Membership membership(*store, spec_.job, to_string(spec_.role), spec_.rank);
  MemberWatch watch(*store, spec_.job, spec_.join_deadline());
  bool store_lost = false;
  while (!stopping_.load(std::memory_order_acquire)) {
    std::optional<Incarnation> who;
    try {
      who = watch.next(kWatchSlice);
      store_lost = false;
    } catch (const Error& e) {
      // Without the store no replacement can join; the running job goes on regardless.
      if (!store_lost)
        log(LogLevel::warn, "{}: cannot follow the job's members, so no replacement can join: {}",
            peer_name(spec_.role, spec_.rank), e.what());
      store_lost = true;
      for (int i = 0; i < 50 && !stopping_.load(std::memory_order_acquire); ++i)
        std::this_thread::sleep_for(kWatchSlice);
      continue;
    }
    if (!who || who->role != to_string(peer_role_)) continue;
    if (who->rank >= static_cast<int>(known_.size())) {
      log(LogLevel::warn, "{}: the member log announces {} {}, which this job does not have",
          peer_name(spec_.role, spec_.rank), who->role, who->rank);
      continue;
    }
    if (who->epoch <= known_[static_cast<size_t>(who->rank)]) continue;  // not newer
    known_[static_cast<size_t>(who->rank)] = who->epoch;
    try {
      replace(membership, *who);
    } catch (const std::exception& e) {
      log(LogLevel::warn, "{}: {} (epoch {}) could not rejoin: {}",
          peer_name(spec_.role, spec_.rank), peer_name(peer_role_, who->rank), who->epoch,
          e.what());
    }
  }
}

void PeerGroup::replace(Membership& membership, const Incarnation& who) {
  {
    std::lock_guard lock(mutex_);
    changes_.push_back({who.rank, who.epoch, nullptr});
  }
  // Until the old incarnation is marked lost and the engine lets go of what it held, bounded so
  // that the replacement's own connect (spec.join_deadline()) still finds this side.
  const auto deadline = Clock::now() + spec_.join_deadline() / 2;
  for (;;) {
    {
      std::lock_guard lock(mutex_);
      if (superseded_[static_cast<size_t>(who.rank)] >= who.epoch &&
          handler_.ready_to_replace_locked(who.rank))
        break;
    }
    if (stopping_.load(std::memory_order_acquire)) return;
    if (Clock::now() > deadline) {
      log(LogLevel::warn,
          "{}: {} still held parts of its lost incarnation after {} ms; replacing "
          "it regardless",
          peer_name(spec_.role, spec_.rank), peer_name(peer_role_, who.rank),
          (spec_.join_deadline() / 2).count());
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  auto link = connect_peer(spec_, transport_, membership, peer_role_, who.rank, who.epoch);
  std::lock_guard lock(mutex_);
  changes_.push_back({who.rank, who.epoch, std::move(link)});
}

}  // namespace hetmesh::afd
