// The attention side of the AFD engine.
#include "caller_buffers.hpp"
#include "comm_thread.hpp"
#include "join.hpp"
#include "peer.hpp"
#include "peer_group.hpp"
#include "senders.hpp"
#include "side_band.hpp"
#include "wire.hpp"

#include <hetmesh/core/log.hpp>

#include <algorithm>
#include <cstring>
#include <exception>

namespace hetmesh::afd {

namespace {

// One round trip of a micro-batch in progress: an entry of the micro-batch's queue.
struct Pending {
  bool busy = false;  // pushed and not yet waited for (the entry's credit is taken)
  int posted = 0;     // F instances whose writes have started
  uint64_t sequence = 0;
  uint32_t tokens = 0;
  uint64_t tag = 0;
  ReadyWait ready;  // the engine's own event or flag for this slot, set by push_pull
  int settled = 0;  // F instances that answered or were lost
  // The sequence every F has settled, for wait's spin.
  std::atomic<uint64_t> completed{0};
  RoundTrip trip;
  std::vector<bool> from;  // [f]: answered, or lost before it answered
  std::string failure;     // the first F lost before it answered: the round trip failed
  // The application's buffers push_pull named (no region: the engine's slot).
  CallerBuffers::Found tokens_from, routing_from;
  std::vector<CallerBuffers::Found> results_into;  // [f]
};

// A micro-batch for one F's sender, or the next side-band message to it.
struct PostJob {
  int mb = 0;
  uint64_t sequence = 0;
  bool message = false;
};

}  // namespace

struct AttentionEngine::State final : PeerHandler {
  EngineSpec spec;
  Device device;
  std::unique_ptr<Transport> transport;
  Buffer a2f_send;                          // [mb] tokens then routing
  HostBuffer a2f_headers;                   // [mb][f]: each F's sender stamps its own copy
  Buffer f2a_receive;                       // [mb][f]
  HostBuffer f2a_headers;                   // [mb][f]
  std::optional<HostBuffer> arrival_flags;  // [mb] words, when the device has stream memops
  // One engine-owned event recorded on a caller's stream after each stream_wait (reused once
  // complete): the engine's end waits for them, so no stream still reads a flag it frees.
  std::vector<Event> stream_waits;
  std::optional<HostBuffer> ready_flags;  // [mb] words a compute stream writes, likewise
  std::vector<Event> ready_events;        // [mb][queue], recorded on the caller's stream
  PublishedRegions mine;
  std::shared_ptr<Region> a2f_send_region, a2f_header_region, f2a_receive_region;
  std::optional<CallerBuffers> caller;  // the application's buffers, once the transport is made
  MovedBytes moved;

  std::mutex mutex;
  std::condition_variable changed;
  // [mb][queue]: round trip `sequence` of micro-batch mb is entry(mb, sequence); up to
  // spec.queue_depth of them in flight, posted in order.
  std::vector<Pending> pending;
  std::vector<uint64_t> last_sequence;  // [mb]: the last one pushed
  // [f][id]: the caller's buffer of that registration number was announced to F f's incarnation
  // (a region frame), so its headers may name it.
  std::vector<std::vector<bool>> announced;
  SideBand side_band;  // messages to and from the F instances
  FirstFailure failure;
  // finish() or the destructor: the threads are stopped. Atomic for wait's spin.
  std::atomic<bool> closed{false};
  std::atomic<bool> failed{false};   // failure is set, for wait's spin
  SpinPolicy wait_spin;              // the waiting caller's
  std::unique_ptr<PeerGroup> peers;  // the F instances
  std::unique_ptr<CommThread> comm;
  std::vector<std::unique_ptr<PeerSender<PostJob>>> senders;  // [f]

  void close(ControlWord word);

  // A queue of 1..64 round trips per micro-batch; micro-batches fit a handle's low byte.
  static const EngineSpec& checked(const EngineSpec& s) {
    if (s.queue_depth < 1 || s.queue_depth > 64 || s.micro_batches < 1 || s.micro_batches > 255)
      throw Error(HM_ERR_INVALID_ARGUMENT,
                  fmt::format("engine spec: queue_depth {} (1..64) or micro_batches {} (1..255)",
                              s.queue_depth, s.micro_batches));
    check_topology(s);
    return s;
  }

  State(const EngineSpec& s, const Device& d)
      : spec(checked(s)),
        device(d),
        a2f_send(d.allocate(s.a2f_slot_bytes() * s.micro_batches)),
        a2f_headers(d, sizeof(WireHeader) * s.micro_batches * s.ffn),
        f2a_receive(d.allocate(s.f2a_slot_bytes() * s.micro_batches * s.ffn)),
        f2a_headers(d, sizeof(WireHeader) * s.micro_batches * s.ffn),
        pending(static_cast<size_t>(s.micro_batches * s.queue_depth)),
        last_sequence(static_cast<size_t>(s.micro_batches), 0),
        announced(static_cast<size_t>(s.ffn)),
        side_band(Role::attention, s.rank, Role::ffn, s.ffn) {}

  Pending& entry(int mb, uint64_t sequence) {
    return pending[static_cast<size_t>(mb * spec.queue_depth) +
                   static_cast<size_t>(sequence % static_cast<uint64_t>(spec.queue_depth))];
  }

  // F `f` is done with micro-batch mb's round trip before `sequence` (answered it or was lost, or
  // it was never pushed): its slot for mb is free for `sequence`. Caller holds mutex.
  bool previous_settled_locked(int mb, uint64_t sequence, int f) {
    if (sequence <= 1) return true;
    const Pending& previous = entry(mb, sequence - 1);
    return !previous.busy || previous.sequence != sequence - 1 ||
           previous.from[static_cast<size_t>(f)];
  }

  WireHeader* send_header(int mb, int f) {
    return reinterpret_cast<WireHeader*>(a2f_headers.data()) + mb * spec.ffn + f;
  }
  const WireHeader* receive_header(int mb, int f) {
    return reinterpret_cast<const WireHeader*>(f2a_headers.data()) + mb * spec.ffn + f;
  }
  uint64_t routing_offset() const { return uint64_t{spec.tokens} * spec.hidden * spec.a2f_bytes; }

  void on_failure(hm_status status, const std::string& reason) override {
    {
      std::lock_guard lock(mutex);
      if (!failure.set(status, reason)) return;
      failed.store(true, std::memory_order_release);
      release_arrival_flags_locked();
    }
    log(LogLevel::error, "attention {}: {}", spec.rank, reason);
    changed.notify_all();
  }

  // Raises micro-batch mb's arrival flag to `sequence` (cyclic: never lowers it, as a loss may
  // settle a queue's entries out of order). Caller holds mutex.
  void raise_arrival_flag_locked(int mb, uint64_t sequence) {
    if (!arrival_flags) return;
    std::atomic_ref<uint32_t> flag(reinterpret_cast<uint32_t*>(arrival_flags->data())[mb]);
    const auto value = static_cast<uint32_t>(sequence);
    if (static_cast<int32_t>(value - flag.load(std::memory_order_relaxed)) > 0)
      flag.store(value, std::memory_order_release);
  }

  // The engine failed or is closing: no round trip still pending will settle, so a device stream
  // waiting on one's arrival flag is let go (the host's wait() reports why). Caller holds mutex.
  void release_arrival_flags_locked() {
    for (const Pending& p : pending)
      if (p.busy) raise_arrival_flag_locked(p.trip.micro_batch, p.sequence);
  }

  // Micro-batch mb's round trip is settled by every F (answered or lost). Caller holds mutex.
  void complete(int mb, Pending& p, int64_t now) {
    p.trip.completed = now;
    p.completed.store(p.sequence, std::memory_order_release);
    // Set even for a failed round trip: a device stream waiting on the flag must not hang; the
    // host's wait() reports the failure.
    raise_arrival_flag_locked(mb, p.sequence);
  }

  // F `f` is lost: every round trip still waiting for its answer fails (once the other F
  // instances have answered).
  void on_lost_locked(int f, const std::string& reason) override {
    const int64_t now = now_ns();
    for (Pending& p : pending) {
      if (!p.busy || p.from[static_cast<size_t>(f)]) continue;
      p.from[static_cast<size_t>(f)] = true;
      if (p.failure.empty()) p.failure = reason;
      if (++p.settled == spec.ffn) complete(p.trip.micro_batch, p, now);
    }
    changed.notify_all();
  }

  void on_rejoined_locked(int f) override {
    side_band.restart_locked(f);
    announced[static_cast<size_t>(f)].clear();  // the new incarnation knows none of them
    changed.notify_all();
  }

  // An A's slots in a replaced F are the new process's own: nothing here to let go of.
  bool ready_to_replace_locked(int) override { return true; }

  void on_message(int f, const TransportEvent& e) override {
    if (e.type == TransportEvent::Type::notification) {
      const std::string from = peer_name(Role::ffn, f);
      check_slot(e.value, static_cast<uint32_t>(spec.micro_batches * spec.ffn), from);
      const int mb = static_cast<int>(e.value) / spec.ffn;
      bool now;
      {
        std::lock_guard lock(mutex);
        now = side_band.admit_locked(f, e.value, receive_header(mb, f)->messages);
      }
      if (now) on_result(f, e.value);
    } else if (auto body = message_body(e.payload)) {
      std::vector<uint32_t> released;
      {
        std::lock_guard lock(mutex);
        released = side_band.arrived_locked(f, *body);
      }
      changed.notify_all();
      for (uint32_t slot : released)
        on_result(f, slot);
    }
  }

  // F `f`'s sender: the next side-band message to it.
  void send_side_band(int f) {
    std::vector<uint8_t> frame;
    std::shared_ptr<const Link> link;
    {
      std::lock_guard lock(mutex);
      frame = side_band.take_frame_locked(f);
      const Peer& peer = peers->at(f);
      if (frame.empty() || failure.has() || peer.lost) return;
      link = peer.link;
    }
    try {
      link->connection->send_control(frame);
    } catch (const Error& e) {
      if (e.status() != kStatusPeerLost) rethrow_for_peer(e, Role::ffn, f);
    }
  }

  // Waits until F `f` is done with micro-batch mb's round trip before `sequence` (its slot is
  // free); false if the engine stops or fails first.
  bool wait_previous(int mb, uint64_t sequence, int f, const std::atomic<bool>& stopping) {
    std::unique_lock lock(mutex);
    while (!previous_settled_locked(mb, sequence, f)) {
      if (stopping.load(std::memory_order_acquire) || failure.has()) return false;
      changed.wait_for(lock, std::chrono::milliseconds(10));
    }
    return true;
  }

  // F `f`'s sender: once F is done with micro-batch mb's previous round trip and this one is
  // ready, its tokens, routing, then the header that notifies. The fields of the entry read here
  // were set by push_pull before the job was queued and stay put until every F has answered, which
  // needs this post first.
  void post(int f, const PostJob& job, const std::atomic<bool>& stopping) {
    const int mb = job.mb;
    Pending& p = entry(mb, job.sequence);
    try {
      if (job.message) return send_side_band(f);
      if (!wait_previous(mb, job.sequence, f, stopping)) return;
      if (!wait_ready(p.ready, stopping)) return;
      int64_t ready_at = now_ns();
      std::shared_ptr<const Link> link;
      uint32_t messages;
      const CallerBuffers::Found& reply = p.results_into[static_cast<size_t>(f)];
      bool announce = false;  // the reply buffer is new to this F: its region frame goes first
      {
        // A job for an F lost meanwhile has nothing to do: the loss settled its share.
        std::lock_guard lock(mutex);
        const Peer& peer = peers->at(f);
        if (failure.has() || peer.lost || !p.busy || p.sequence != job.sequence ||
            p.from[static_cast<size_t>(f)])
          return;
        link = peer.link;
        if (reply.id != 0) {
          std::vector<bool>& known = announced[static_cast<size_t>(f)];
          if (known.size() <= reply.id) known.resize(reply.id + 1, false);
          if (!known[reply.id]) {
            known[reply.id] = announce = true;
            side_band.note_sent_locked(f);  // counted, so the header waits for it at the F
          }
        }
        messages = side_band.sent_locked(f);
      }
      WireHeader* h = send_header(mb, f);
      *h = make_header(spec, peers->own_epoch(), MessageKind::a2f, mb, p.sequence, p.tokens,
                       uint64_t{p.tokens} * (uint64_t{spec.hidden} * spec.a2f_bytes +
                                             spec.routing_bytes_per_token()));
      h->tag = p.tag;
      h->messages = messages;
      h->reply_region = reply.id;
      h->reply_offset = reply.offset;
      h->stamps[kAttentionStart] = static_cast<uint64_t>(p.trip.attention_start);
      h->stamps[kPushStart] = static_cast<uint64_t>(p.trip.push_start);
      int64_t posted = now_ns();
      h->stamps[kPosted] = static_cast<uint64_t>(posted);
      {
        std::lock_guard lock(mutex);
        if (p.trip.ready == 0) p.trip.ready = ready_at;
        if (p.trip.posted == 0) p.trip.posted = posted;  // the first F's
        p.trip.ffn[static_cast<size_t>(f)].posted_at_a = posted;
        ++p.posted;
      }
      uint64_t slot = spec.a2f_slot_bytes();
      uint64_t token_bytes = uint64_t{p.tokens} * spec.hidden * spec.a2f_bytes;
      uint64_t routing_bytes = uint64_t{p.tokens} * spec.routing_bytes_per_token();
      // F's slot for (this A, mb).
      uint64_t remote_slot = static_cast<uint64_t>(spec.rank * spec.micro_batches + mb);
      try {
        Connection& c = *link->connection;
        if (announce) c.send_control(region_frame(reply.id, reply.region->describe()));
        const RemoteRegion& payload = link->region("a2f_payload");
        // From the application's buffers, or from the slot (where a full push's routing follows
        // its tokens: one write).
        const Region& tokens_src = p.tokens_from.region ? *p.tokens_from.region : *a2f_send_region;
        const uint64_t tokens_at = p.tokens_from.region ? p.tokens_from.offset : mb * slot;
        const Region& routing_src =
            p.routing_from.region ? *p.routing_from.region : *a2f_send_region;
        const uint64_t routing_at =
            p.routing_from.region ? p.routing_from.offset : mb * slot + routing_offset();
        if (token_bytes == 0) {  // an idle rank's empty push: the header alone
        } else if (!p.tokens_from.region && !p.routing_from.region &&
                   token_bytes == routing_offset()) {
          c.write(tokens_src, tokens_at, payload, remote_slot * slot, token_bytes + routing_bytes,
                  std::nullopt, 0);
        } else {
          c.write(tokens_src, tokens_at, payload, remote_slot * slot, token_bytes, std::nullopt, 0);
          c.write(routing_src, routing_at, payload, remote_slot * slot + routing_offset(),
                  routing_bytes, std::nullopt, 0);
        }
        moved.add(tokens_src, p.tokens_from.region != nullptr, token_bytes);
        moved.add(routing_src, p.routing_from.region != nullptr, routing_bytes);
        c.write(*a2f_header_region, (mb * spec.ffn + f) * sizeof(WireHeader),
                link->region("a2f_headers"), remote_slot * sizeof(WireHeader), sizeof(WireHeader),
                static_cast<uint32_t>(remote_slot), 0);
      } catch (const Error& e) {
        // The connection broke under the write: its peer_lost event, on the comm thread, settles
        // what this F owed.
        if (e.status() == kStatusPeerLost) return;
        rethrow_for_peer(e, Role::ffn, f);
      }
    } catch (const Error& e) {
      on_failure(e.status(), e.what());
    } catch (const std::exception& e) {
      on_failure(HM_ERR_INTERNAL, e.what());
    }
  }

  // F `f`'s answer in `slot` (checked against the slot table by on_message).
  void on_result(int f, uint32_t slot) {
    std::string from = peer_name(Role::ffn, f);
    int mb = static_cast<int>(slot) / spec.ffn;
    if (static_cast<int>(slot) % spec.ffn != f)
      throw Error(kStatusProtocolError, fmt::format("{} notified slot {}, which belongs to ffn {}",
                                                    from, slot, static_cast<int>(slot) % spec.ffn));
    WireHeader h = *receive_header(mb, f);
    SlotLimits limits{MessageKind::f2a,
                      static_cast<uint32_t>(spec.ffn),
                      static_cast<uint32_t>(spec.micro_batches),
                      spec.tokens,
                      spec.hidden,
                      spec.top_k,
                      spec.f2a_slot_bytes(),
                      uint64_t{spec.hidden} * spec.f2a_bytes};
    validate(h, limits, static_cast<uint32_t>(f), peers->at(f).link->epoch,
             static_cast<uint32_t>(mb), from.c_str());
    int64_t now = now_ns();
    {
      std::lock_guard lock(mutex);
      Pending& p = entry(mb, h.sequence);
      if (!p.busy || h.sequence != p.sequence || p.from[static_cast<size_t>(f)] ||
          h.tokens != p.tokens)
        throw Error(kStatusProtocolError,
                    fmt::format("{} answered micro-batch {} sequence {} ({} tokens), which A {}",
                                from, mb, h.sequence, h.tokens,
                                !p.busy || h.sequence != p.sequence ? "has not sent"
                                : p.from[static_cast<size_t>(f)]
                                    ? "had answered already"
                                    : fmt::format("sent with {} tokens", p.tokens)));
      p.from[static_cast<size_t>(f)] = true;
      auto& per = p.trip.ffn[static_cast<size_t>(f)];
      per.received_at_a = now;
      per.f_received = static_cast<int64_t>(h.stamps[kReceived]);
      per.f_batch_ready = static_cast<int64_t>(h.stamps[kBatchReady]);
      per.f_compute_start = static_cast<int64_t>(h.stamps[kComputeStart]);
      per.f_compute_end = static_cast<int64_t>(h.stamps[kComputeEnd]);
      per.f_posted = static_cast<int64_t>(h.stamps[kPosted]);
      const CallerBuffers::Found& into = p.results_into[static_cast<size_t>(f)];
      moved.add(into.region ? *into.region : *f2a_receive_region, into.region != nullptr,
                h.payload_bytes);
      if (++p.settled == spec.ffn) complete(mb, p, now);
    }
    // Also for a sender waiting for this F's answer before it posts the next round trip.
    changed.notify_all();
  }
};

AttentionEngine::AttentionEngine(const EngineSpec& spec, const Device& device, KeyValueStore& store)
    : state_(std::make_unique<State>(spec, device)) {
  State& s = *state_;
  s.spec.role = Role::attention;
  if (device.has(HM_CAP_STREAM_MEMOPS | HM_CAP_PINNED_HOST_MEMORY)) {
    s.arrival_flags.emplace(device, 4 * static_cast<uint64_t>(spec.micro_batches));
    s.ready_flags.emplace(device, 4 * static_cast<uint64_t>(spec.micro_batches));
    std::memset(s.ready_flags->data(), 0, s.ready_flags->size());
  }
  for (size_t i = 0; i < s.pending.size(); ++i)
    s.ready_events.push_back(device.create_event(HM_EVENT_DISABLE_TIMING));
  s.transport = Transport::create(transport_options(spec, device));
  s.caller.emplace(*s.transport, device, peer_name(Role::attention, spec.rank));
  s.a2f_send_region = s.transport->register_memory(device, s.a2f_send.data(), s.a2f_send.size());
  s.a2f_header_region =
      s.transport->register_memory(device, s.a2f_headers.data(), s.a2f_headers.size());
  s.f2a_receive_region = s.mine.regions["f2a_payload"] =
      s.transport->register_memory(device, s.f2a_receive.data(), s.f2a_receive.size());
  s.mine.regions["f2a_headers"] =
      s.transport->register_memory(device, s.f2a_headers.data(), s.f2a_headers.size());
  auto own_store = store.clone();  // the rejoin thread's: the caller's need not outlive the call
  s.peers = std::make_unique<PeerGroup>(
      s.spec, Role::ffn, *s.transport,
      join(s.spec, *s.transport, s.mine, store, Role::ffn, spec.ffn), s.mutex, s);
  for (size_t i = 0; i < s.pending.size(); ++i) {
    Pending& p = s.pending[i];
    p.from.assign(static_cast<size_t>(spec.ffn), false);
    p.results_into.resize(static_cast<size_t>(spec.ffn));
    p.trip.ffn.resize(static_cast<size_t>(spec.ffn));
    p.trip.micro_batch = static_cast<int>(i) / spec.queue_depth;
  }
  s.comm = std::make_unique<CommThread>(spec.comm_cpus, [&s] { s.peers->turn(); });
  s.peers->start_rejoin(std::move(own_store));
  s.senders =
      start_senders<PostJob>(s.spec, Role::ffn, spec.ffn, s.pending.size() + SideBand::kMaxQueued,
                             [&s](int f, const PostJob& job, const std::atomic<bool>& stopping) {
                               s.post(f, job, stopping);
                             });
  log(LogLevel::info, "attention {} (epoch {}): connected to {} ffn instance(s) over {}", spec.rank,
      s.peers->own_epoch(), spec.ffn, to_string(s.transport->kind()));
}

// Stops the engine's threads, then tells every F how this A ends: ControlWord::leave (done: its
// going is no failure) or ControlWord::quit (it ended after a failure: its Fs count it lost, and do
// not wait for a replacement of it either; a process that dies says nothing, and that one may be
// replaced).
void AttentionEngine::State::close(ControlWord word) {
  {
    std::lock_guard lock(mutex);
    if (closed) return;
    closed = true;
    release_arrival_flags_locked();
  }
  changed.notify_all();  // a wait() in another thread ends now, saying why
  for (auto& sender : senders)
    sender->stop();
  peers->stop_rejoin();
  comm->stop();
  for (const Peer& f : peers->all()) {
    try {
      if (!f.lost && f.link->connection->alive()) f.link->connection->send_control(encode(word));
    } catch (const Error&) {
    }
  }
}

AttentionEngine::~AttentionEngine() {
  // Without finish() this A did not say it was done: it ends as one that failed.
  state_->close(ControlWord::quit);
  // close() let every waiting stream go; each must pass its wait before the flags' memory goes. A
  // stream held by other work past the job's timeout keeps the flags: a leak, not a wild read.
  for (const Event& e : state_->stream_waits) {
    try {
      e.synchronize(state_->spec.timeout);
    } catch (const Error& error) {
      log(LogLevel::error,
          "attention {}: a stream that waits on an arrival flag did not get past it ({}); the "
          "flags' memory is left allocated",
          state_->spec.rank, error.what());
      new HostBuffer(std::move(*state_->arrival_flags));  // deliberately never freed
      break;
    }
  }
}

void AttentionEngine::finish() {
  State& s = *state_;
  bool failed;
  {
    std::lock_guard lock(s.mutex);
    failed = s.failure.has();
  }
  s.close(failed ? ControlWord::quit : ControlWord::leave);
  std::lock_guard lock(s.mutex);
  s.failure.throw_if_set();
}

void* AttentionEngine::tokens(int mb) const {
  return static_cast<uint8_t*>(state_->a2f_send.data()) + mb * state_->spec.a2f_slot_bytes();
}

void* AttentionEngine::routing(int mb) const {
  return static_cast<uint8_t*>(tokens(mb)) + state_->routing_offset();
}

void* AttentionEngine::result(int mb, int f) const {
  return static_cast<uint8_t*>(state_->f2a_receive.data()) +
         (mb * state_->spec.ffn + f) * state_->spec.f2a_slot_bytes();
}

void* AttentionEngine::ready_flag(int mb) const {
  if (!state_->ready_flags || mb < 0 || mb >= state_->spec.micro_batches) return nullptr;
  return state_->ready_flags->data() + 4 * mb;
}

void AttentionEngine::stream_wait(Handle handle, const Stream& stream) const {
  const State& s = *state_;
  const int mb = static_cast<int>(handle & 0xff);
  if (mb >= s.spec.micro_batches) throw Error(HM_ERR_INVALID_ARGUMENT, "not a push_pull handle");
  if (!s.arrival_flags)
    throw Error(HM_ERR_NOT_SUPPORTED,
                fmt::format("stream_wait: {} has no stream memory operations (wait() on the host)",
                            s.device.selector()));
  if (!(stream.device() == s.device))
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("stream_wait: a stream of {}, and this engine runs on {}",
                            stream.device().selector(), s.device.selector()));
  stream.wait_value32(arrival_flag(mb), static_cast<uint32_t>(handle >> 8), HM_WAIT_GEQ);
  std::lock_guard lock(state_->mutex);
  auto& waits = state_->stream_waits;
  auto done = std::find_if(waits.begin(), waits.end(), [](const Event& e) { return e.ready(); });
  if (done == waits.end())
    done = waits.emplace(waits.end(), s.device.create_event(HM_EVENT_DISABLE_TIMING));
  done->record(stream);
}

const void* AttentionEngine::arrival_flag(int mb) const {
  if (!state_->arrival_flags) return nullptr;
  return state_->arrival_flags->data() + 4 * mb;
}

const EngineSpec& AttentionEngine::spec() const {
  return state_->spec;
}

uint64_t AttentionEngine::epoch() const {
  return state_->peers->own_epoch();
}

AttentionEngine::Handle AttentionEngine::push_pull(int mb, uint32_t tokens, const Push& push) {
  State& s = *state_;
  const Ready& ready = push.ready;
  if (mb < 0 || mb >= s.spec.micro_batches)
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("micro-batch {} does not exist (0..{})", mb, s.spec.micro_batches - 1));
  if (tokens > s.spec.tokens)
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("{} tokens do not fit the slot (0..{})", tokens, s.spec.tokens));
  if (ready.flag && !s.ready_flags)
    throw Error(HM_ERR_NOT_SUPPORTED,
                "push_pull: a ready flag needs a device with stream memory operations");
  if (!push.results_into.empty() && push.results_into.size() != static_cast<size_t>(s.spec.ffn))
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("push_pull: {} result buffers for {} ffn instance(s) (one each, null "
                            "for an F's own result slot)",
                            push.results_into.size(), s.spec.ffn));
  uint64_t sequence;
  Pending* entry;
  {
    std::lock_guard lock(s.mutex);
    s.failure.throw_if_set();
    if (s.closed)
      throw Error(kStatusClosed,
                  fmt::format("attention {}: push_pull after finish()", s.spec.rank));
    for (const Peer& f : s.peers->all())
      if (f.lost && s.spec.sends(s.spec.rank, f.rank))
        throw Error(kStatusPeerLost,
                    fmt::format("attention {}: push_pull of micro-batch {}: {}; no replacement "
                                "has joined yet (wait_for_peers(), then push again, or drop it)",
                                s.spec.rank, mb, f.lost_reason));
    sequence = s.last_sequence[static_cast<size_t>(mb)] + 1;
    Pending& p = s.entry(mb, sequence);
    if (p.busy)
      throw Error(HM_ERR_INVALID_ARGUMENT,
                  fmt::format("micro-batch {} has {} round trip(s) in flight, the most its queue "
                              "holds (queue_depth): wait for sequence {} first",
                              mb, s.spec.queue_depth, p.sequence));
    // Reset in place: the vectors keep their size, so nothing is allocated.
    s.last_sequence[static_cast<size_t>(mb)] = sequence;
    p.busy = true;
    p.posted = 0;
    p.sequence = sequence;
    p.tokens = tokens;
    p.tag = push.tag;
    // An F this A does not send to (JobTopology::groups) counts as settled from the start.
    p.settled = 0;
    for (int f = 0; f < s.spec.ffn; ++f) {
      p.from[static_cast<size_t>(f)] = !s.spec.sends(s.spec.rank, f);
      p.settled += !s.spec.sends(s.spec.rank, f);
    }
    p.failure.clear();
    std::fill(p.trip.ffn.begin(), p.trip.ffn.end(), RoundTrip::PerFfn{});
    p.trip.sequence = sequence;
    p.trip.attention_start = push.attention_start_ns;
    p.trip.push_start = now_ns();
    p.trip.ready = p.trip.posted = p.trip.completed = p.trip.wait_returned = 0;
    entry = &p;
  }
  // The entry's event is free (its last record was waited for before its previous round trip
  // completed), and no sender reads p.ready before the jobs below are queued. Recording the event
  // is all the engine keeps of the caller's stream.
  Pending& p = *entry;
  Event& event = s.ready_events[static_cast<size_t>(&p - s.pending.data())];
  try {
    // The application's buffers, registered at first sight (the entry's Found values are reset
    // in place: nothing is allocated once each buffer is known).
    const uint64_t rows = tokens;
    auto found = [&](const void* data, uint64_t bytes, const char* what) {
      return data != nullptr && rows > 0 ? s.caller->find_or_register(data, bytes, what)
                                         : CallerBuffers::Found{};
    };
    p.tokens_from =
        found(push.tokens_from, rows * s.spec.hidden * s.spec.a2f_bytes, "push_pull's tokens");
    p.routing_from =
        found(push.routing_from, rows * s.spec.routing_bytes_per_token(), "push_pull's routing");
    for (size_t f = 0; f < p.results_into.size(); ++f)
      p.results_into[f] = push.results_into.empty()
                              ? CallerBuffers::Found{}
                              : found(push.results_into[f], rows * s.spec.hidden * s.spec.f2a_bytes,
                                      "push_pull's result buffer");
    if (ready.stream != nullptr) event.record(*ready.stream);
  } catch (const Error&) {
    std::lock_guard lock(s.mutex);
    p.busy = false;  // nothing was sent: the entry is free again
    s.last_sequence[static_cast<size_t>(mb)] = sequence - 1;
    throw;
  }
  p.ready = ReadyWait{ready.stream ? &event : nullptr,
                      ready.flag ? s.ready_flags->data() + 4 * mb : nullptr, ready.value};
  // Every F's sender waits for readiness itself and posts on its own: the writes to different F
  // instances run side by side.
  for (int f = 0; f < s.spec.ffn; ++f)
    if (s.spec.sends(s.spec.rank, f))
      s.senders[static_cast<size_t>(f)]->push(PostJob{mb, sequence});
  return (sequence << 8) | static_cast<uint64_t>(mb);
}

RoundTrip AttentionEngine::wait(Handle handle, std::chrono::milliseconds timeout) {
  State& s = *state_;
  int mb = static_cast<int>(handle & 0xff);
  uint64_t sequence = handle >> 8;
  if (mb >= s.spec.micro_batches) throw Error(HM_ERR_INVALID_ARGUMENT, "not a push_pull handle");
  Pending& p = s.entry(mb, sequence);
  auto ended = [&] {
    return Error(kStatusClosed,
                 fmt::format("attention {}: the engine was finished while waiting for micro-batch "
                             "{} (sequence {})",
                             s.spec.rank, mb, sequence));
  };
  {
    std::lock_guard lock(s.mutex);
    if (s.closed)
      throw Error(kStatusClosed, fmt::format("attention {}: wait after finish()", s.spec.rank));
    if (!p.busy || p.sequence != sequence)
      throw Error(HM_ERR_INVALID_ARGUMENT,
                  fmt::format("handle for micro-batch {} sequence {} was already waited for", mb,
                              sequence));
  }
  TimedWait measured(s.wait_spin);
  measured.spin([&] {
    return p.completed.load(std::memory_order_acquire) == sequence ||
           s.failed.load(std::memory_order_acquire) || s.closed.load(std::memory_order_acquire);
  });
  std::unique_lock lock(s.mutex);
  bool done = s.changed.wait_for(
      lock, timeout, [&] { return p.settled == s.spec.ffn || s.failure.has() || s.closed; });
  s.failure.throw_if_set();
  if (done && p.settled != s.spec.ffn) throw ended();
  if (done && !p.failure.empty()) {
    p.busy = false;  // every F settled: nothing of this round trip is in flight any more
    throw Error(kStatusPeerLost,
                fmt::format("attention {}: micro-batch {} (sequence {}) failed: {}; its slot is "
                            "free: push it again once wait_for_peers() is true, or drop it",
                            s.spec.rank, mb, sequence, p.failure));
  }
  if (!done) {
    // Not the engine's end: the round trip stays in flight, to be waited for again (or the F
    // named here is lost, and the wait says so).
    std::string missing;
    for (int f = 0; f < s.spec.ffn; ++f)
      if (!p.from[static_cast<size_t>(f)])
        missing += (missing.empty() ? "" : ", ") + peer_name(Role::ffn, f);
    throw Error(
        HM_ERR_TIMEOUT,
        fmt::format("attention {}: micro-batch {} (sequence {}): no answer from {} within "
                    "{} ms{}; it is still in flight: wait for it again",
                    s.spec.rank, mb, sequence, missing, timeout.count(),
                    p.posted > 0 ? "" : " (never posted: its readiness signal did not come)"));
  }
  p.busy = false;
  p.trip.wait_returned = now_ns();
  return p.trip;
}

bool AttentionEngine::wait_for_peers(std::chrono::milliseconds timeout) {
  State& s = *state_;
  std::unique_lock lock(s.mutex);
  bool all_in = s.changed.wait_for(lock, timeout, [&] {
    if (s.failure.has()) return true;
    for (const Peer& f : s.peers->all())
      if (f.lost) return false;
    return true;
  });
  s.failure.throw_if_set();
  return all_in;
}

void AttentionEngine::send_message(int f, std::span<const uint8_t> bytes) {
  State& s = *state_;
  if (f < 0 || f >= s.spec.ffn)
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("send_message: ffn {} does not exist (0..{})", f, s.spec.ffn - 1));
  {
    std::lock_guard lock(s.mutex);
    s.failure.throw_if_set();
    if (s.closed)
      throw Error(kStatusClosed,
                  fmt::format("attention {}: send_message after finish()", s.spec.rank));
    if (const Peer& peer = s.peers->at(f); peer.lost)
      throw Error(kStatusPeerLost,
                  fmt::format("attention {}: send_message: {}", s.spec.rank, peer.lost_reason));
    s.side_band.queue_locked(f, bytes);
  }
  s.senders[static_cast<size_t>(f)]->push(PostJob{0, 0, true});
}

std::optional<Message> AttentionEngine::receive_message(std::chrono::milliseconds timeout) {
  State& s = *state_;
  std::unique_lock lock(s.mutex);
  s.changed.wait_for(lock, timeout, [&] {
    return s.side_band.has_message_locked() || s.failure.has() || s.closed;
  });
  if (auto message = s.side_band.receive_locked()) return message;
  s.failure.throw_if_set();
  if (s.closed)
    throw Error(kStatusClosed,
                fmt::format("attention {}: receive_message after finish()", s.spec.rank));
  return std::nullopt;
}

bool AttentionEngine::register_buffer(const void* data, uint64_t bytes) {
  return state_->caller->find_or_register(data, bytes, "register_buffer's buffer").fresh;
}

DataCounters AttentionEngine::counters() const {
  return state_->moved.read(&*state_->caller);
}

std::vector<PeerStatus> AttentionEngine::peers() const {
  std::lock_guard lock(state_->mutex);
  return peer_status(Role::ffn, state_->peers->all());
}

PeerHistory AttentionEngine::peer_history() const {
  std::lock_guard lock(state_->mutex);
  return state_->peers->history_locked();
}

std::vector<std::pair<std::string, uint64_t>> AttentionEngine::registered() const {
  const State& s = *state_;
  return {{"a2f_send", s.a2f_send.size()},
          {"a2f_headers", s.a2f_headers.size()},
          {"f2a_receive", s.f2a_receive.size()},
          {"f2a_headers", s.f2a_headers.size()}};
}

}  // namespace hetmesh::afd
