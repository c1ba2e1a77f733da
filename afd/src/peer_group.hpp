// An engine's peers through their incarnations (PeerGroup): the comm thread's turn, lost and
// silent peers (Heartbeat), and the rejoin thread that connects to a replacement.
#pragma once

#include "engine_metrics.hpp"
#include "join.hpp"
#include "peer.hpp"

#include <hetmesh/afd/engine.hpp>
#include <hetmesh/core/membership.hpp>
#include <hetmesh/core/rendezvous.hpp>

#include <atomic>
#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace hetmesh::afd {

// Signs of life between an engine and its peers, for a peer that hangs while no data is due (a
// SIGSTOPped process, a wedged host or driver): the comm thread sends every peer a heartbeat (the
// ControlWord::heartbeat) every quarter of spec.heartbeat, counts each message and notification
// from a peer as a sign of life (a local write completion is none), and reports a peer silent for
// spec.heartbeat; before a peer is first heard, spec.timeout more, since the job may still be
// joining. A peer that left, or is lost, is not expected to speak. The comm thread's alone.
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
  // Counts the peers' losses and rejoins into `metrics`.
  PeerGroup(const EngineSpec& spec, Role peer_role, Transport& transport, Joined joined,
            std::mutex& mutex, PeerHandler& handler, EngineMetrics& metrics);
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
  EngineMetrics& metrics_;
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

}  // namespace hetmesh::afd
