// Pieces both engine roles use: host-side slot memory, publishing descriptors through the
// rendezvous store, connecting to every peer, and the comm thread.
#pragma once

#include "wire.hpp"

#include <hetmesh/afd/engine.hpp>
#include <hetmesh/core/membership.hpp>
#include <hetmesh/core/rendezvous.hpp>
#include <hetmesh/core/spin.hpp>

#include <fmt/format.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

namespace hetmesh::afd {

std::string peer_name(Role role, int rank);  // "attention 1", "ffn 0"

// This instance's registered regions, by name, as published for peers.
struct PublishedRegions {
  std::map<std::string, std::shared_ptr<Region>> regions;
  std::vector<uint8_t> encode() const;
};
std::map<std::string, std::vector<uint8_t>> decode_regions(const std::vector<uint8_t>& blob,
                                                           const std::string& from);

// One incarnation of a peer as this engine reaches it: its epoch, the connection to it and its
// regions imported on that connection. Immutable once made; replaced whole when the peer is.
struct Link {
  uint64_t epoch = 0;
  std::shared_ptr<Connection> connection;
  std::map<std::string, std::shared_ptr<RemoteRegion>> regions;
  const RemoteRegion& region(const std::string& name) const { return *regions.at(name); }
};

// A peer rank of an engine. Only the comm thread changes it, under the engine's mutex: the comm
// thread reads it freely, every other thread under that mutex (a sender keeps its own reference to
// the link it writes on, so a replacement never pulls a connection from under a write).
struct Peer {
  int rank = 0;
  std::shared_ptr<const Link> link;
  bool left = false;        // said "leave": done, its going is no failure
  bool lost = false;        // gone without "leave" (dead, hung, or replaced), until a replacement
  bool quit = false;        // lost because it said "quit": it ended after a failure of its own
  std::string lost_reason;  // "ffn 1 lost: ...", "ffn 1 hung: ...", while lost
};

// The first error an engine cannot go on after: every call reports it from then on. Under the
// engine's mutex.
class FirstFailure {
 public:
  // Keeps the first error only; returns whether this one was it.
  bool set(hm_status status, const std::string& reason) {
    if (has()) return false;
    status_ = status == HM_OK ? HM_ERR_INTERNAL : status;
    reason_ = reason;
    return true;
  }
  bool has() const { return status_ != HM_OK; }
  void throw_if_set() const {
    if (has()) throw Error(status_, reason_);
  }

 private:
  hm_status status_ = HM_OK;
  std::string reason_;
};

// What status() reports of `peers` (of `role`). Caller holds the engine's mutex.
std::vector<PeerStatus> peer_status(Role role, const std::vector<Peer>& peers);

// The region names and sizes a peer of `peer_role` must publish in a job of this shape: a peer
// started from another config is refused at connection time, not by a write out of range later.
std::map<std::string, uint64_t> expected_regions(const EngineSpec& spec, Role peer_role);

// Connects to epoch `epoch` of peer (`peer_role`, `rank`): fetches its endpoint and regions from
// the store, connects (both sides call connect) and imports its regions, checking them against
// `expected`.
std::shared_ptr<const Link> connect_peer(const EngineSpec& spec, Transport& transport,
                                         Membership& membership, Role peer_role, int rank,
                                         uint64_t epoch,
                                         const std::map<std::string, uint64_t>& expected);

// Publishes this instance (a new epoch of it) with its endpoint and regions, then connects to
// every rank of `peer_role` at its current epoch, in rank order (a global order, so symmetric
// connects never wait on each other in a cycle). Returns this instance's epoch and its peers.
struct Joined {
  uint64_t epoch = 0;
  std::vector<Peer> peers;
};
Joined join(const EngineSpec& spec, Transport& transport, const PublishedRegions& mine,
            KeyValueStore& store, Role peer_role, int peer_count);

// Signs of life between an engine and its peers, for a peer that hangs while no data is due (a
// SIGSTOPped process, a wedged host or driver): the comm thread sends every peer a heartbeat (the
// control message "hb") every quarter of spec.heartbeat, counts each message and notification
// from a peer as a sign of life (a local write completion is none), and reports a peer silent for
// spec.heartbeat; before a peer is first heard, spec.timeout more, since the job may still be
// joining. A peer that said "leave", or is lost, is not expected to speak. The comm thread's alone.
class Heartbeat {
 public:
  Heartbeat(const EngineSpec& spec, Role peer_role, size_t peers);
  void heard(int peer);
  // A new incarnation of `peer` joined: it gets the grace of one that has not spoken yet.
  void restart(int peer);
  struct Silent {
    int rank;
    std::string reason;  // "ffn 1 hung: nothing heard from it for 5003 ms (heartbeat_ms 5000)"
  };
  // Sends the heartbeats that are due, never waiting for a busy connection (a send that fails
  // is the transport's peer_lost to report), then returns the first peer silent too long.
  std::optional<Silent> tick(const std::vector<Peer>& peers);

 private:
  std::chrono::milliseconds timeout_, grace_;
  Role peer_role_;
  std::vector<Clock::time_point> last_heard_;  // [peer rank]
  std::vector<bool> heard_once_;
  Clock::time_point last_sent_;
};

// What an engine does about its peers; PeerGroup calls it on the comm thread.
class PeerHandler {
 public:
  virtual ~PeerHandler() = default;
  // A notification or control message from `rank`'s current incarnation.
  virtual void on_message(int rank, const TransportEvent& event) = 0;
  // `rank` is lost (dead, hung or replaced): Peer::lost is set, the engine's mutex is held. The
  // engine settles what that peer owed.
  virtual void on_lost_locked(int rank, const std::string& reason) = 0;
  // A replacement of `rank` is in: Peer::link is its link, Peer::lost and Peer::left still say
  // how the incarnation it replaced ended; the engine's mutex is held.
  virtual void on_rejoined_locked(int rank) = 0;
  // `rank` may be replaced now: nothing of its lost incarnation is still in use (the F's slots of
  // an A the application still holds). Asked by the rejoin thread, the engine's mutex held.
  virtual bool ready_to_replace_locked(int rank) = 0;
  // An error the engine cannot go on after (a protocol error, a local write that failed).
  virtual void on_failure(hm_status status, const std::string& reason) = 0;
  // Once per turn of the comm thread, after the transport's events: for work due by the clock.
  virtual void on_turn() {}
};

// An engine's peers, through their incarnations. The comm thread runs turn(): it polls the
// transport, hands each event of a peer's current link to the handler, drops those of links a
// replacement superseded (the old epoch's traffic is refused), keeps those of a link not yet
// installed until it is, reports lost and silent peers, and installs replacements. The rejoin
// thread follows the job's member log (MemberWatch) through a store client of its own: for a
// replacement of a peer it has the comm thread mark the old incarnation lost, waits until the
// engine can let it go, connects to the new one and hands its link to the comm thread.
class PeerGroup {
 public:
  PeerGroup(const EngineSpec& spec, Role peer_role, Transport& transport, Joined joined,
            std::mutex& mutex, PeerHandler& handler);
  ~PeerGroup();
  PeerGroup(const PeerGroup&) = delete;
  PeerGroup& operator=(const PeerGroup&) = delete;

  // Starts following the member log with `store` (the engine's own client).
  void start_rejoin(std::unique_ptr<KeyValueStore> store);
  // Stops the rejoin thread (a connect in progress ends within spec.timeout).
  void stop_rejoin();

  // One turn of the comm thread (2 ms of polling at most). Never throws: a fatal error goes to
  // the handler's on_failure, after which the thread idles in 1 ms turns.
  void turn();

  uint64_t own_epoch() const { return own_epoch_; }
  // The peers; see Peer for who may read what.
  std::vector<Peer>& all() { return peers_; }
  const std::vector<Peer>& all() const { return peers_; }
  Peer& at(int rank) { return peers_.at(static_cast<size_t>(rank)); }

  // The peers' changes so far, and the superseded incarnations' events dropped. Caller holds the
  // engine's mutex.
  PeerHistory history_locked() const;

  // Whether a start of `rank` newer than epoch `than` has claimed its epoch: a replacement is on
  // its way (or died joining), though the member log may not announce it yet. Asks the store;
  // any thread but the comm thread, without the engine's mutex. A store that cannot answer
  // counts as no (logged).
  bool newer_epoch_claimed(int rank, uint64_t than);

 private:
  struct Member {
    int rank;
    uint64_t epoch;
  };
  // A change the rejoin thread hands to the comm thread.
  struct Change {
    int rank;
    uint64_t epoch;
    std::shared_ptr<const Link> link;  // null: mark the incarnation before `epoch` lost
  };
  void lose(int rank, const std::string& reason, bool quit = false);  // on the comm thread
  void record_locked(PeerChange change);
  void apply_changes();
  void handle(const TransportEvent& event);
  void rejoin_loop(std::unique_ptr<KeyValueStore> store);
  void replace(Membership& membership, const Incarnation& who);

  const EngineSpec& spec_;
  Role peer_role_;
  Transport& transport_;
  uint64_t own_epoch_;
  std::vector<Peer> peers_;
  std::mutex& mutex_;
  PeerHandler& handler_;
  std::map<std::string, uint64_t> expected_;
  // The comm thread's:
  std::map<ConnectionId, Member> members_;
  std::vector<TransportEvent> events_, early_;  // early_: of links not installed yet
  Heartbeat heartbeat_;
  std::atomic<uint64_t> stale_{0};
  // Under mutex_:
  std::vector<Change> changes_;
  std::deque<PeerChange> history_;    // the latest kMaxHistory
  std::vector<uint64_t> superseded_;  // [rank]: the comm thread marked every epoch below lost
  // The rejoin thread's:
  std::vector<uint64_t> known_;  // [rank]: the newest epoch seen
  std::atomic<bool> stopping_{false};
  std::thread rejoin_;
  // newer_epoch_claimed's client of the store, its own (the rejoin thread blocks in its reads).
  std::mutex ask_mutex_;
  std::unique_ptr<KeyValueStore> ask_store_;
};

// The transport's options for an engine on `device`: spec.transport, with the job's timeout
// bounding every send as it bounds every wait (a peer that stops reading fails the send; nothing
// blocks forever), and an "auto" RDMA device resolved to the NIC nearest the device (topology.hpp;
// the first active one where the topology does not say).
TransportOptions transport_options(const EngineSpec& spec, const Device& device);

// Pins `thread` to `cpu`; logs a warning if that fails.
void pin_thread(std::thread& thread, int cpu, const char* what);

// A thread that runs `step` until stopped: the engine's comm loop, which polls the transport.
// Pinned to spec.comm_cpus[0] if given.
class CommThread {
 public:
  CommThread(const std::vector<int>& cpus, std::function<void()> step);
  ~CommThread();
  void stop();

 private:
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

// One peer's writes, run in order on a thread of their own, so that the writes to different
// peers proceed side by side and a slow peer delays only its own. Jobs are small structs in a
// ring sized at construction (the slot credits bound how many can be queued), so pushing
// allocates nothing. `run` gets each job and the stop flag (to bound any wait it does); it must
// not throw.
template <typename Job>
class PeerSender {
 public:
  using Run = std::function<void(const Job&, const std::atomic<bool>& stopping)>;

  PeerSender(size_t capacity, std::string name, int cpu, Run run)
      : name_(std::move(name)), run_(std::move(run)), ring_(capacity) {
    thread_ = std::thread([this] { loop(); });
    if (cpu >= 0) pin_thread(thread_, cpu, "an AFD sender thread");
  }
  ~PeerSender() { stop(); }
  PeerSender(const PeerSender&) = delete;
  PeerSender& operator=(const PeerSender&) = delete;

  // Queues a job; throws Error(INTERNAL) if the ring is full (a credit was not respected).
  void push(const Job& job) {
    bool wake;
    {
      std::lock_guard lock(mutex_);
      if (tail_ - head_ == ring_.size())
        throw Error(HM_ERR_INTERNAL,
                    fmt::format("{}: more than {} writes queued", name_, ring_.size()));
      ring_[tail_ % ring_.size()] = job;
      ++tail_;
      pushed_.store(tail_, std::memory_order_release);
      wake = sleeping_;
    }
    if (wake) wake_.notify_one();
  }

  // Stops after the job in progress; queued jobs are dropped.
  void stop() {
    {
      std::lock_guard lock(mutex_);
      stopping_.store(true, std::memory_order_release);
    }
    wake_.notify_one();
    if (thread_.joinable()) thread_.join();
  }

 private:
  void loop() {
    for (;;) {
      Job job;
      {
        std::unique_lock lock(mutex_);
        if (head_ == tail_ && !stopping_.load(std::memory_order_relaxed)) {
          lock.unlock();
          TimedWait wait(spin_);
          wait.spin([&] { return pushed_.load(std::memory_order_acquire) != head_; });
          lock.lock();
          while (head_ == tail_ && !stopping_.load(std::memory_order_relaxed)) {
            sleeping_ = true;
            wake_.wait(lock);
            sleeping_ = false;
          }
        }
        if (stopping_.load(std::memory_order_relaxed)) return;
        job = ring_[head_ % ring_.size()];
        ++head_;
      }
      run_(job, stopping_);
    }
  }

  std::string name_;
  Run run_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::vector<Job> ring_;
  uint64_t head_ = 0, tail_ = 0;     // under mutex_
  std::atomic<uint64_t> pushed_{0};  // tail_, read without the lock while spinning
  bool sleeping_ = false;            // under mutex_
  std::atomic<bool> stopping_{false};
  SpinPolicy spin_;  // the thread's own
  std::thread thread_;
};

// What a sender waits for before it posts: an event the engine owns (recorded on the caller's
// stream during push_pull or respond), or a word the engine owns reaching `value`; neither: ready.
struct ReadyWait {
  const Event* event = nullptr;
  const void* flag = nullptr;
  uint32_t value = 0;
};

// Waits until `ready` holds (an event completed, a flag reached its value; at once for neither).
// Returns false if `stopping` was set first. Throws Error if the event reports a failure.
bool wait_ready(const ReadyWait& ready, const std::atomic<bool>& stopping);

// The CPU for sender `index` (0-based) of an engine: comm_cpus[1 + index], wrapping around;
// -1 (unpinned) without comm_cpus.
int sender_cpu(const std::vector<int>& comm_cpus, size_t index);

// A sender per peer of `peer_role` (`peers` of them), named "attention 0 to ffn 1", pinned as
// sender_cpu() says, each running `run(peer, job, stopping)`.
template <typename Job, typename Run>
std::vector<std::unique_ptr<PeerSender<Job>>> start_senders(const EngineSpec& spec, Role peer_role,
                                                            int peers, Run run) {
  std::vector<std::unique_ptr<PeerSender<Job>>> senders;
  for (int peer = 0; peer < peers; ++peer)
    senders.push_back(std::make_unique<PeerSender<Job>>(
        static_cast<size_t>(spec.micro_batches),
        fmt::format("{} to {}", peer_name(spec.role, spec.rank), peer_name(peer_role, peer)),
        sender_cpu(spec.comm_cpus, static_cast<size_t>(peer)),
        [run, peer](const Job& job, const std::atomic<bool>& stopping) {
          run(peer, job, stopping);
        }));
  return senders;
}

// Rethrows a failed write to `peer` with the peer's name: "ffn 1 lost: ..." for a lost peer.
[[noreturn]] void rethrow_for_peer(const Error& e, Role role, int rank);

// The header of a message from this instance (spec.role, spec.rank, `epoch`) in micro-batch slot
// `mb`, stamps and tag zero.
inline WireHeader make_header(const EngineSpec& spec, uint64_t epoch, MessageKind kind, int mb,
                              uint64_t sequence, uint32_t tokens, uint64_t payload_bytes) {
  WireHeader h{};
  h.magic = kWireMagic;
  h.version = kWireVersion;
  h.kind = static_cast<uint16_t>(kind);
  h.source = static_cast<uint32_t>(spec.rank);
  h.epoch = static_cast<uint32_t>(epoch);
  h.micro_batch = static_cast<uint32_t>(mb);
  h.sequence = sequence;
  h.tokens = tokens;
  h.hidden = spec.hidden;
  h.top_k = spec.top_k;
  h.payload_bytes = payload_bytes;
  return h;
}

// Checks a notification's slot index against `limit`; throws a protocol error otherwise.
void check_slot(uint32_t slot, uint32_t limit, const std::string& from);

}  // namespace hetmesh::afd
