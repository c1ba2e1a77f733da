// Pieces both engine roles use: host-side slot memory, publishing descriptors through the
// rendezvous store, connecting to every peer, and the comm thread.
#pragma once

#include "wire.hpp"

#include <hetmesh/afd/engine.hpp>
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

const char* role_name(Role role);
std::string peer_name(Role role, int rank);  // "attention 1", "ffn 0"

// Host memory for headers and flags: pinned on the device when it has pinned memory (stream
// memory operations need that), plain host memory otherwise.
class HostSlots {
 public:
  HostSlots(const Device& device, uint64_t bytes);
  uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  bool pinned() const { return static_cast<bool>(pinned_); }

 private:
  Buffer pinned_;
  std::vector<uint8_t> plain_;
  uint8_t* data_;
  uint64_t size_;
};

// This instance's registered regions, by name, as published for peers.
struct PublishedRegions {
  std::map<std::string, std::shared_ptr<Region>> regions;
  std::vector<uint8_t> encode() const;
};
std::map<std::string, std::vector<uint8_t>> decode_regions(const std::vector<uint8_t>& blob,
                                                           const std::string& from);

struct Peer {
  int rank = 0;
  std::shared_ptr<Connection> connection;
  std::map<std::string, std::shared_ptr<RemoteRegion>> regions;
  bool left = false;  // said "leave": done, its going is no failure
  bool lost = false;  // gone without "leave"; an F serves on without it
};

// Publishes this instance's endpoint and regions, then connects to every rank of `peer_role` in
// rank order (a global order, so symmetric connects never wait on each other in a cycle).
std::vector<Peer> join(const EngineSpec& spec, Transport& transport, const PublishedRegions& mine,
                       KeyValueStore& store, Role peer_role, int peer_count);

// Which peer each connection leads to: connection id -> the peer's rank.
std::map<ConnectionId, int> rank_by_connection(const std::vector<Peer>& peers);

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

// One turn of an engine's comm thread: polls the transport (2 ms at most), notes messages and
// notifications as signs of life from their peer, hands each event to `handle` except
// write_done, of which only a failure matters (fatal, unless its peer is gone), then sends
// heartbeats and hands a silent peer to `silent` (an A fails, an F contains it). An exception
// ends the turn and goes to `fail` (the engine's first fatal error); the thread then idles in
// 1 ms turns.
template <typename Handle, typename OnSilent, typename Fail>
void comm_turn(Transport& transport, std::vector<TransportEvent>& events, Heartbeat& heartbeat,
               const std::vector<Peer>& peers, const std::map<ConnectionId, int>& rank_of,
               Handle&& handle, OnSilent&& silent, Fail&& fail) {
  try {
    events.clear();
    transport.poll(events, std::chrono::milliseconds(2));
    for (const auto& e : events) {
      auto peer = rank_of.find(e.connection);
      if (peer != rank_of.end() &&
          (e.type == TransportEvent::Type::notification || e.type == TransportEvent::Type::control))
        heartbeat.heard(peer->second);
      if (e.type != TransportEvent::Type::write_done) {
        handle(e);
      } else if (e.status != HM_OK) {
        // A write that failed because its peer is gone is that peer's peer_lost event's to
        // judge (an F contains a lost A); any other failed write is fatal.
        bool peer_gone = e.status == kStatusPeerLost ||
                         (peer != rank_of.end() &&
                          !peers.at(static_cast<size_t>(peer->second)).connection->alive());
        if (!peer_gone) throw Error(e.status, "a write failed: " + e.message);
      }
    }
    if (auto quiet = heartbeat.tick(peers)) silent(*quiet);
  } catch (const std::exception& e) {
    fail(e.what());
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// The transport's options for an engine: spec.transport, with the job's timeout bounding every
// send as it bounds every wait (a peer that stops reading fails the send; nothing blocks forever).
inline TransportOptions transport_options(const EngineSpec& spec) {
  TransportOptions options = spec.transport;
  options.io_timeout = spec.timeout;
  return options;
}

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

// The header of a message from this instance (spec.role, spec.rank) in micro-batch slot `mb`,
// stamps zero.
inline WireHeader make_header(const EngineSpec& spec, MessageKind kind, int mb, uint64_t sequence,
                              uint32_t tokens, uint64_t payload_bytes) {
  WireHeader h{};
  h.magic = kWireMagic;
  h.version = kWireVersion;
  h.kind = static_cast<uint16_t>(kind);
  h.source = static_cast<uint32_t>(spec.rank);
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
