// The attention side of the AFD engine.
#include "caller_buffers.hpp"
#include "comm_thread.hpp"
#include "device_trigger.hpp"
#include "engine_metrics.hpp"
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
  bool busy = false;    // pushed and not yet waited for (the entry's credit is taken)
  bool device = false;  // rung by a stream (arm_device): settling it raises mb's done flag
  int posted = 0;       // F instances whose writes have started
  uint64_t sequence = 0;
  uint32_t tokens = 0;
  uint32_t result_rows = 0;  // of each F's answer
  uint64_t tag = 0;
  ReadyWait ready;  // the engine's own event or flag for this slot, set by push_pull
  int settled = 0;  // F instances that answered or were lost
  // The sequence every F has settled, for wait's spin.
  std::atomic<uint64_t> completed{0};
  RoundTrip trip;
  std::vector<bool> from;  // [f]: answered, or lost before it answered
  std::string failure;     // the first F lost before it answered: the round trip failed
  // Per A2F tensor: the rows sent, and the application's buffer push_pull named (no region: the
  // engine's slot); where the rows land in each F's row spaces (the push's row, or unset: this A's
  // window at each F).
  std::array<uint32_t, kMaxA2fTensors> rows{};
  std::array<CallerBuffers::Found, kMaxA2fTensors> sources;
  std::optional<uint32_t> row_offset;
  std::vector<CallerBuffers::Found> results_into;  // [f]
};

// Where an F wants an A's rows of a micro-batch, as it last said (a landing frame): its layout's
// number and, per A2F tensor, its registration (null: its own row spaces) and offset there.
struct Landing {
  uint32_t id = 0;
  std::array<std::shared_ptr<RemoteRegion>, kMaxA2fTensors> regions;
  std::array<uint64_t, kMaxA2fTensors> offsets{};
};

// A micro-batch for one F's sender, or the next side-band message to it.
struct PostJob {
  int mb = 0;
  uint64_t sequence = 0;
  bool message = false;
};

// What a micro-batch armed for its device sends at each ring (AttentionEngine::arm_device): the
// push, with its tensors and result buffers held here.
struct Armed {
  std::vector<PushTensor> tensors;
  std::vector<void*> results_into;
  PushOptions push;
};

}  // namespace

struct AttentionEngine::State final : PeerHandler {
  EngineSpec spec;
  uint32_t wire_layout;  // job_layout(spec), once
  Device device;
  EngineMetrics metrics;  // stopped serving first, by ~AttentionEngine
  std::unique_ptr<Transport> transport;
  Buffer a2f_send;                          // [mb][tensor][tokens rows]
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
  // "push_pull's tokens", "push_pull's router_logits": what a refused buffer is called.
  std::array<std::string, kMaxA2fTensors> source_names;
  MovedBytes moved;

  std::mutex mutex;
  std::condition_variable changed;
  // [mb][queue]: round trip `sequence` of micro-batch mb is entry(mb, sequence); up to
  // spec.queue_depth of them in flight, posted in order.
  std::vector<Pending> pending;
  std::vector<uint64_t> last_sequence;  // [mb]: the last one pushed
  // The caller's buffers announced to each F's incarnation (region frames), so its headers may
  // name them; the F's receive buffers it announced to this A, and where it wants each
  // micro-batch's rows ([f][mb]).
  AnnouncedRegions announced;
  PeerRegions ffn_regions;
  std::vector<Landing> landings;
  SideBand side_band;  // messages to and from the F instances
  FirstFailure failure;
  // finish() or the destructor: the threads are stopped. Atomic for wait's spin.
  std::atomic<bool> closed{false};
  std::atomic<bool> failed{false};   // failure is set, for wait's spin
  SpinPolicy wait_spin;              // the waiting caller's
  std::unique_ptr<PeerGroup> peers;  // the F instances
  std::unique_ptr<CommThread> comm;
  std::vector<std::unique_ptr<PeerSender<PostJob>>> senders;  // [f]
  // The device-triggered mode, when the device has stream memory operations: [mb] doorbells a
  // stream rings with layout x kDoorbellTokens + tokens + 1 and done flags the engine raises; per
  // micro-batch, what each layout sends (none: not armed) and the sequence of the round trip the
  // device has in flight (0: none), both under mutex.
  std::optional<DeviceWords> doorbells, done_flags;
  std::vector<std::vector<std::shared_ptr<const Armed>>> armed;  // [mb][layout]
  std::vector<uint64_t> device_in_flight;
  std::atomic<int> device_rounds{0};  // of them, not 0: for the doorbell thread's spin
  DeviceTripLog device_log;
  // Started by the first arm_device; declared last, so it is stopped before anything it uses
  // goes. It answers rings after the engine's end too (at once, as failed), until destroyed.
  std::unique_ptr<DoorbellThread> doorbell_thread;

  void close(ControlWord word);
  AttentionEngine::Handle push(int mb, uint32_t tokens, const PushOptions& push, bool rung);
  void check_push_shape(const PushOptions& push, const char* what) const;
  Turn take_doorbells();

  // A queue of 1..64 round trips per micro-batch; micro-batches fit a handle's low byte.
  static const EngineSpec& checked(const EngineSpec& s) {
    if (s.queue_depth < 1 || s.queue_depth > 64 || s.micro_batches < 1 || s.micro_batches > 255)
      throw Error(HM_ERR_INVALID_ARGUMENT,
                  fmt::format("engine spec: queue_depth {} (1..64) or micro_batches {} (1..255)",
                              s.queue_depth, s.micro_batches));
    check_shape(s);
    return s;
  }

  template <typename Make>
  auto allocation(const char* what, Make make) {
    return engine_allocation(Role::attention, spec.rank, what, make);
  }

  State(const EngineSpec& s, const Device& d)
      : spec(checked(s)),
        wire_layout(job_layout(spec)),
        device(d),
        metrics(spec, d),
        a2f_send(allocation("A2F send slots",
                            [&] { return d.allocate(s.a2f_slot_bytes() * s.micro_batches); })),
        a2f_headers(allocation(
            "A2F headers",
            [&] { return HostBuffer(d, sizeof(WireHeader) * s.micro_batches * s.ffn); })),
        f2a_receive(
            allocation("F2A result slots",
                       [&] { return d.allocate(s.f2a_slot_bytes() * s.micro_batches * s.ffn); })),
        f2a_headers(allocation(
            "F2A headers",
            [&] { return HostBuffer(d, sizeof(WireHeader) * s.micro_batches * s.ffn); })),
        pending(static_cast<size_t>(s.micro_batches * s.queue_depth)),
        last_sequence(static_cast<size_t>(s.micro_batches), 0),
        announced(s.ffn),
        ffn_regions(Role::ffn, s.ffn),
        landings(static_cast<size_t>(s.ffn * s.micro_batches)),
        side_band(Role::attention, s.rank, Role::ffn, s.ffn),
        armed(static_cast<size_t>(s.micro_batches)),
        device_in_flight(static_cast<size_t>(s.micro_batches), 0) {
    for (int t = 0; t < s.a2f_tensors(); ++t)
      source_names[static_cast<size_t>(t)] = fmt::format("push_pull's {}", s.a2f_tensor_name(t));
  }

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
  Landing& landing(int f, int mb) {
    return landings[static_cast<size_t>(f * spec.micro_batches + mb)];
  }

  void on_failure(hm_status status, const std::string& reason) override {
    {
      std::lock_guard lock(mutex);
      if (!failure.set(status, reason)) return;
      metrics.error(status);
      failed.store(true, std::memory_order_release);
      let_pending_streams_go_locked();
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

  // The engine failed or is closing: no round trip still pending will settle, so every stream
  // waiting on one goes on: its arrival flag is raised, and a round trip the device rang is settled
  // as failed (the host's wait() and device_trips() report why). Caller holds mutex.
  void let_pending_streams_go_locked() {
    for (Pending& p : pending) {
      if (!p.busy) continue;
      raise_arrival_flag_locked(p.trip.micro_batch, p.sequence);
      if (p.device)
        settle_device_locked(p, failure.has()
                                    ? failure.reason()
                                    : fmt::format("attention {} was finished", spec.rank));
    }
  }

  // A round trip the device rang has settled (every F answered, or `why_failed` says why not): its
  // entry is free and the stream waiting on the done flag goes on. Caller holds mutex.
  void settle_device_locked(Pending& p, const std::string& why_failed) {
    const int mb = p.trip.micro_batch;
    p.device = false;
    p.busy = false;
    device_in_flight[static_cast<size_t>(mb)] = 0;
    device_rounds.fetch_sub(1, std::memory_order_relaxed);
    if (why_failed.empty())
      device_log.completed();
    else
      device_log.failed(
          fmt::format("micro-batch {} (sequence {}): {}", mb, p.sequence, why_failed));
    done_flags->store(mb, 1);
  }

  // Micro-batch mb's round trip is settled by every F (answered or lost). Caller holds mutex.
  void complete(int mb, Pending& p, int64_t now) {
    p.trip.completed = now;
    p.completed.store(p.sequence, std::memory_order_release);
    if (p.failure.empty())
      metrics.round_trip(p.trip);
    else
      metrics.error(kStatusPeerLost);
    // Set even for a failed round trip: a device stream waiting on the flag must not hang; the
    // host's wait() reports the failure.
    raise_arrival_flag_locked(mb, p.sequence);
    if (p.device) settle_device_locked(p, p.failure);
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
    // The new incarnation knows none of this A's buffers, and says anew where it wants rows.
    announced.clear_locked(f);
    ffn_regions.clear_locked(f);
    for (int mb = 0; mb < spec.micro_batches; ++mb)
      landing(f, mb) = Landing{};
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
    } else if (auto region = region_of(e.payload)) {
      // A receive buffer of the F's.
      for (uint32_t slot :
           receive_region(ffn_regions, side_band, mutex, f, *peers->at(f).link, *region))
        on_result(f, slot);
    } else if (auto frame = landing_of(e.payload)) {
      std::vector<uint32_t> released;
      {
        std::lock_guard lock(mutex);
        on_landing_locked(f, *frame);
        released = side_band.counted_locked(f);
      }
      for (uint32_t slot : released)
        on_result(f, slot);
    }
  }

  // F `f` wants this A's rows of a micro-batch in buffers of its own from now on: each one it
  // announced, with room for the F's whole row space of that tensor. Caller holds mutex.
  void on_landing_locked(int f, const LandingFrame& frame) {
    const std::string from = peer_name(Role::ffn, f);
    auto bad = [&](const std::string& what) {
      throw Error(kStatusProtocolError, fmt::format("{}: refused landing: {}", from, what));
    };
    if (frame.micro_batch >= static_cast<uint32_t>(spec.micro_batches))
      bad(fmt::format("micro-batch {} (0..{})", frame.micro_batch, spec.micro_batches - 1));
    Landing next;
    next.id = frame.landing;
    for (int t = 0; t < kMaxA2fTensors; ++t) {
      const auto i = static_cast<size_t>(t);
      if (frame.region[i] == 0) continue;
      const uint64_t bytes = spec.ffn_rows(f) * spec.a2f_row_bytes(t);
      std::shared_ptr<RemoteRegion> region = ffn_regions.find_locked(f, frame.region[i]);
      if (t >= spec.a2f_tensors() || bytes == 0)
        bad(fmt::format("a buffer for tensor {}, which this job does not send", t));
      if (region == nullptr) bad(fmt::format("its buffer {}, never announced", frame.region[i]));
      if (region->size() < bytes || frame.offset[i] > region->size() - bytes)
        bad(fmt::format(
            "{} bytes of its buffer {} at offset {} for {}'s rows, which it holds {} "
            "bytes",
            bytes, frame.region[i], frame.offset[i], spec.a2f_tensor_name(t), region->size()));
      next.regions[i] = std::move(region);
      next.offsets[i] = frame.offset[i];
    }
    landing(f, static_cast<int>(frame.micro_batch)) = std::move(next);
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
  // ready, each tensor's rows, then the header that notifies. The fields of the entry read here
  // were set by push_pull before the job was queued and stay put until every F has answered, which
  // needs this post first.
  void post(int f, const PostJob& job, const std::atomic<bool>& stopping) {
    const int mb = job.mb;
    Pending& p = entry(mb, job.sequence);
    try {
      if (job.message) return send_next_frame(*this, f, Role::ffn);
      if (!wait_previous(mb, job.sequence, f, stopping)) return;
      if (!wait_ready(p.ready, stopping)) return;
      int64_t ready_at = now_ns();
      std::shared_ptr<const Link> link;
      uint32_t messages;
      const CallerBuffers::Found& reply = p.results_into[static_cast<size_t>(f)];
      bool announce = false;  // the reply buffer is new to this F: its region frame goes first
      Landing to;             // where the F wants the rows (copied: a landing frame may come)
      {
        // A job for an F lost meanwhile has nothing to do: the loss settled its share.
        std::lock_guard lock(mutex);
        const Peer& peer = peers->at(f);
        if (failure.has() || peer.lost || !p.busy || p.sequence != job.sequence ||
            p.from[static_cast<size_t>(f)])
          return;
        link = peer.link;
        if (reply.id != 0 && announced.first_locked(f, reply.id)) {
          announce = true;
          side_band.note_sent_locked(f);  // counted, so the header waits for it at the F
        }
        messages = side_band.sent_locked(f);
        to = landing(f, mb);
      }
      uint64_t payload = 0;
      for (int t = 0; t < spec.a2f_tensors(); ++t)
        payload += uint64_t{p.rows[static_cast<size_t>(t)]} * spec.a2f_row_bytes(t);
      WireHeader* h = send_header(mb, f);
      *h = make_header(spec, wire_layout, peers->own_epoch(), MessageKind::a2f, mb, p.sequence,
                       p.tokens, payload);
      h->tag = p.tag;
      h->messages = messages;
      h->reply_region = reply.id;
      h->reply_offset = reply.offset;
      const uint32_t row_offset =
          p.row_offset.value_or(static_cast<uint32_t>(spec.window_of(spec.rank, f)) * spec.tokens);
      h->row_offset = row_offset;
      h->landing = to.id;
      h->result_rows = p.result_rows;
      std::copy(p.rows.begin(), p.rows.end(), h->rows);
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
      // F's header slot for (this A, mb).
      const uint64_t remote_slot = static_cast<uint64_t>(spec.rank * spec.micro_batches + mb);
      try {
        Connection& c = *link->connection;
        if (announce) c.send_control(region_frame(reply.id, reply.region->describe()));
        for (int t = 0; t < spec.a2f_tensors(); ++t) {
          const auto i = static_cast<size_t>(t);
          const uint64_t row_bytes = spec.a2f_row_bytes(t);
          const uint64_t bytes = uint64_t{p.rows[i]} * row_bytes;
          if (bytes == 0) continue;  // an idle rank's empty push is the header alone
          // From the application's buffer or the slot, into the F's buffer or its row space.
          const CallerBuffers::Found& source = p.sources[i];
          const Region& from = source.region ? *source.region : *a2f_send_region;
          const uint64_t from_at =
              source.region ? source.offset
                            : mb * spec.a2f_slot_bytes() + spec.a2f_tensor_offset(spec.tokens, t);
          const RemoteRegion& into = to.regions[i] ? *to.regions[i] : link->region("a2f_payload");
          const uint64_t into_at = to.regions[i] ? to.offsets[i] + uint64_t{row_offset} * row_bytes
                                                 : ffn_input_offset(spec, f, mb, t, row_offset);
          c.write(from, from_at, into, into_at, bytes, std::nullopt, 0,
                  /*more=*/true);  // the header follows
          moved.add(from, source.region != nullptr, bytes);
        }
        c.write(*a2f_header_region, (mb * spec.ffn + f) * sizeof(WireHeader),
                link->region("a2f_headers"), remote_slot * sizeof(WireHeader), sizeof(WireHeader),
                static_cast<uint32_t>(remote_slot), 0);
        metrics.sent(f, payload + sizeof(WireHeader));
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
    validate(h, spec, wire_layout, MessageKind::f2a, static_cast<uint32_t>(f),
             peers->at(f).link->epoch, static_cast<uint32_t>(mb), from.c_str());
    int64_t now = now_ns();
    {
      std::lock_guard lock(mutex);
      Pending& p = entry(mb, h.sequence);
      if (!p.busy || h.sequence != p.sequence || p.from[static_cast<size_t>(f)] ||
          h.tokens != p.result_rows)
        throw Error(kStatusProtocolError,
                    fmt::format("{} answered micro-batch {} sequence {} ({} rows), which A {}",
                                from, mb, h.sequence, h.tokens,
                                !p.busy || h.sequence != p.sequence ? "has not sent"
                                : p.from[static_cast<size_t>(f)]
                                    ? "had answered already"
                                    : fmt::format("asked {} rows of", p.result_rows)));
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
      metrics.received(f, h.payload_bytes + sizeof(WireHeader));
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
    s.doorbells.emplace(device, spec.micro_batches);
    s.done_flags.emplace(device, spec.micro_batches);
  }
  for (size_t i = 0; i < s.pending.size(); ++i)
    s.ready_events.push_back(device.create_event(HM_EVENT_DISABLE_TIMING));
  s.transport = Transport::create(transport_options(spec, device));
  s.metrics.connect(s.transport->kind());
  s.metrics.serve(s.spec.transport.secret ? &*s.spec.transport.secret : nullptr);
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
      join(s.spec, *s.transport, s.mine, store, Role::ffn, spec.ffn), s.mutex, s, s.metrics);
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
  s.metrics.read_with([this] { return metrics_reading(*this); });
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
    let_pending_streams_go_locked();
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
  state_->metrics.stop();  // no scrape reads the engine from here on
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

void* AttentionEngine::tensor(int mb, int tensor) const {
  const EngineSpec& spec = state_->spec;
  if (mb < 0 || mb >= spec.micro_batches || tensor < 0 || tensor >= spec.a2f_tensors() ||
      spec.a2f_row_bytes(tensor) == 0)
    return nullptr;
  return static_cast<uint8_t*>(state_->a2f_send.data()) + mb * spec.a2f_slot_bytes() +
         spec.a2f_tensor_offset(spec.tokens, tensor);
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
  check_trigger_stream(s.device, s.arrival_flags.has_value(), stream, "stream_wait",
                       "wait() on the host");
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
  return state_->push(mb, tokens, push, /*rung=*/false);
}

// What of a push does not depend on its tokens: checked at each push_pull, and once at arm_device
// (so a bad armed push is refused there, not at each ring of its doorbell).
void AttentionEngine::State::check_push_shape(const PushOptions& push, const char* what) const {
  if (push.ready.flag && !ready_flags)
    throw Error(HM_ERR_NOT_SUPPORTED,
                fmt::format("{}: a ready flag needs a device with stream memory operations", what));
  if (!push.results_into.empty() && push.results_into.size() != static_cast<size_t>(spec.ffn))
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("{}: {} result buffers for {} ffn instance(s) (one each, null "
                            "for an F's own result slot)",
                            what, push.results_into.size(), spec.ffn));
  // An answer buffer is one F's: two Fs' partial results in one would overwrite each other, and
  // the tensor sent answered in place by several would be overwritten before each had read it.
  int answering = 0;
  for (int f = 0; f < spec.ffn; ++f)
    answering += spec.sends(spec.rank, f);
  const void* sent = push.tensors.empty() ? nullptr : push.tensors[kTokensTensor].from;
  for (size_t f = 0; f < push.results_into.size(); ++f) {
    if (push.results_into[f] == nullptr) continue;
    const bool shared =
        std::find(push.results_into.begin() + static_cast<long>(f) + 1, push.results_into.end(),
                  push.results_into[f]) != push.results_into.end();
    if (shared || (answering > 1 && push.results_into[f] == sent))
      throw Error(HM_ERR_INVALID_ARGUMENT,
                  fmt::format("{}: ffn {}'s result buffer is {}: each F answers into a "
                              "buffer of its own",
                              what, f,
                              shared ? "another F's too" : "the tokens sent, which other Fs read"));
  }
  if (!push.tensors.empty() && push.tensors.size() != static_cast<size_t>(spec.a2f_tensors()))
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("{}: {} tensors for the job's {} (tokens, routing{}: one each)", what,
                            push.tensors.size(), spec.a2f_tensors(),
                            spec.a2f_extra.empty() ? "" : ", then its extra tensors"));
}

AttentionEngine::Handle AttentionEngine::State::push(int mb, uint32_t tokens,
                                                     const PushOptions& push, bool rung) {
  State& s = *this;
  const ReadySignal& ready = push.ready;
  check_micro_batch(mb, s.spec.micro_batches, "push_pull");
  if (tokens > s.spec.tokens)
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("{} tokens do not fit the slot (0..{})", tokens, s.spec.tokens));
  s.check_push_shape(push, "push_pull");
  // Each tensor's rows: `tokens` unless its entry says (the tokens always `tokens`; none of a
  // tensor of no bytes, the routing of a job without top_k), every one within a window.
  std::array<uint32_t, kMaxA2fTensors> rows{};
  uint32_t most = 0;
  for (int t = 0; t < s.spec.a2f_tensors(); ++t) {
    const auto i = static_cast<size_t>(t);
    const bool given = !push.tensors.empty() && push.tensors[i].rows.has_value();
    const uint32_t asked = given ? *push.tensors[i].rows : tokens;
    rows[i] = s.spec.a2f_row_bytes(t) == 0 ? 0 : asked;
    if ((t == kTokensTensor && asked != tokens) || rows[i] > s.spec.tokens ||
        (given && asked != 0 && s.spec.a2f_row_bytes(t) == 0))
      throw Error(
          HM_ERR_INVALID_ARGUMENT,
          fmt::format("push_pull: {} rows of {} ({})", asked, s.spec.a2f_tensor_name(t),
                      t == kTokensTensor             ? fmt::format("it sends the push's {}", tokens)
                      : s.spec.a2f_row_bytes(t) == 0 ? std::string("the job has none: top_k is 0")
                                                     : fmt::format("0..{}", s.spec.tokens)));
    most = std::max(most, rows[i]);
  }
  const uint32_t result_rows = push.result_rows.value_or(tokens);
  if (result_rows > s.spec.tokens)
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("push_pull: an answer of {} rows (result_rows: 0..{})", result_rows,
                            s.spec.tokens));
  // The answer comes from the F's output rows at the same offset.
  most = std::max(most, result_rows);
  // An eager F serves each part alone, into output rows at the part's offset: offsets that move
  // from step to step would land one A's rows on another's still being answered.
  if (push.row_offset && s.spec.gather == Gather::eager)
    throw Error(HM_ERR_INVALID_ARGUMENT,
                "push_pull: row_offset needs gather = \"all\" (an eager F serves each A's part "
                "alone, at its own window)");
  // The rows fit each F's row spaces, at the push's row or at this A's window there.
  for (int f = 0; f < s.spec.ffn; ++f) {
    if (!s.spec.sends(s.spec.rank, f)) continue;
    const uint32_t row_offset = push.row_offset.value_or(
        static_cast<uint32_t>(s.spec.window_of(s.spec.rank, f)) * s.spec.tokens);
    if (uint64_t{row_offset} + most > s.spec.ffn_rows(f))
      throw Error(HM_ERR_INVALID_ARGUMENT,
                  fmt::format("push_pull: rows {}..{} at row_offset {}: ffn {}'s row spaces of a "
                              "micro-batch hold {} rows ({} As x {} tokens)",
                              row_offset, uint64_t{row_offset} + most, row_offset, f,
                              s.spec.ffn_rows(f), s.spec.attention_of(f), s.spec.tokens));
  }
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
    if (!rung && !s.armed[static_cast<size_t>(mb)].empty())
      throw Error(HM_ERR_INVALID_ARGUMENT,
                  fmt::format("push_pull: micro-batch {} is armed for its device (arm_device): a "
                              "stream rings its round trips",
                              mb));
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
    p.device = rung;
    if (rung) {
      s.device_in_flight[static_cast<size_t>(mb)] = sequence;
      s.device_rounds.fetch_add(1, std::memory_order_relaxed);
    }
    p.posted = 0;
    p.sequence = sequence;
    p.tokens = tokens;
    p.result_rows = result_rows;
    p.tag = push.tag;
    // An F this A does not send to (groups, map) counts as settled from the start.
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
    auto found = [&](const void* data, uint64_t bytes, const char* what) {
      return data != nullptr && bytes > 0 ? s.caller->find_or_register(data, bytes, what)
                                          : CallerBuffers::Found{};
    };
    p.rows = rows;
    p.row_offset = push.row_offset;
    for (int t = 0; t < kMaxA2fTensors; ++t) {
      const auto i = static_cast<size_t>(t);
      p.sources[i] = push.tensors.empty() || t >= s.spec.a2f_tensors()
                         ? CallerBuffers::Found{}
                         : found(push.tensors[i].from, uint64_t{rows[i]} * s.spec.a2f_row_bytes(t),
                                 s.source_names[i].c_str());
    }
    for (size_t f = 0; f < p.results_into.size(); ++f)
      p.results_into[f] =
          push.results_into.empty()
              ? CallerBuffers::Found{}
              : found(push.results_into[f], uint64_t{result_rows} * s.spec.f2a_bytes_per_token(),
                      "push_pull's result buffer");
    if (ready.stream != nullptr) event.record(*ready.stream);
  } catch (const Error&) {
    std::lock_guard lock(s.mutex);
    p.busy = false;  // nothing was sent: the entry is free again
    p.device = false;
    if (rung) {
      s.device_in_flight[static_cast<size_t>(mb)] = 0;
      s.device_rounds.fetch_sub(1, std::memory_order_relaxed);
    }
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

// The doorbell thread's turn: each ring of an armed micro-batch with no round trip of the device in
// flight is taken (cleared) and sent; a ring that cannot be sent (the engine ended, an F lost, a
// micro-batch not armed) is answered at once as failed, so the stream waiting next goes on.
Turn AttentionEngine::State::take_doorbells() {
  bool took = false;
  for (int mb = 0; mb < spec.micro_batches; ++mb) {
    const uint32_t ring = doorbells->load(mb);
    if (ring == 0) continue;
    // A job of 2^20 - 1 tokens or more has layout 0 alone, and its ring is tokens + 1.
    const bool split = spec.tokens + 1 < kDoorbellTokens;
    const uint32_t layout = split ? ring / kDoorbellTokens : 0;
    const uint32_t tokens = (split ? ring % kDoorbellTokens : ring) - 1;
    std::shared_ptr<const Armed> arm;
    {
      std::lock_guard lock(mutex);
      // Rung again before its wait: the ring waits for the round trip in flight.
      if (device_in_flight[static_cast<size_t>(mb)] != 0) continue;
      const auto& layouts = armed[static_cast<size_t>(mb)];
      if (layout < layouts.size()) arm = layouts[layout];
    }
    doorbells->store(mb, 0);
    took = true;
    try {
      if (!arm)
        throw Error(HM_ERR_INVALID_ARGUMENT,
                    fmt::format("its doorbell rang for layout {}, which was not armed (arm_device)",
                                layout));
      push(mb, tokens, arm->push, /*rung=*/true);
      device_log.rung();
    } catch (const std::exception& e) {
      device_log.ring_failed(fmt::format("micro-batch {}: not sent: {}", mb, e.what()));
      done_flags->store(mb, 1);
    }
  }
  // The engine's mutex only once it has ended: a thread spinning on it every turn starved the comm
  // thread (no heartbeat went out: on the H200 every peer of a 2A2F job saw the others hung).
  if (failed.load(std::memory_order_acquire) || closed.load(std::memory_order_acquire)) {
    std::lock_guard lock(mutex);
    if (failure.has())
      device_log.ended(failure.reason());
    else if (closed)
      device_log.ended(fmt::format("attention {} was finished", spec.rank));
  }
  // A round trip in flight: its stream rings again a few microseconds after it settles.
  return took                                                ? Turn::worked
         : device_rounds.load(std::memory_order_relaxed) > 0 ? Turn::expecting
                                                             : Turn::idle;
}

void AttentionEngine::arm_device(int mb, const Push& push, int layout) {
  State& s = *state_;
  if (!s.done_flags)
    throw Error(HM_ERR_NOT_SUPPORTED,
                fmt::format("arm_device: {} has no stream memory operations (push_pull and wait "
                            "on the host)",
                            s.device.selector()));
  check_micro_batch(mb, s.spec.micro_batches, "arm_device");
  if (layout < 0 || layout >= kMaxDeviceLayouts ||
      (layout > 0 && s.spec.tokens + 1 >= kDoorbellTokens))
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("arm_device: layout {} (0..{}{})", layout, kMaxDeviceLayouts - 1,
                            s.spec.tokens + 1 >= kDoorbellTokens
                                ? fmt::format(", and only 0 for a job of {} tokens", s.spec.tokens)
                                : ""));
  if (push.ready.stream != nullptr || push.ready.flag)
    throw Error(HM_ERR_INVALID_ARGUMENT,
                "arm_device: a push with a ready signal (the doorbell's ring is the readiness)");
  s.check_push_shape(push, "arm_device");
  auto arm = std::make_shared<Armed>();
  arm->tensors.assign(push.tensors.begin(), push.tensors.end());
  arm->results_into.assign(push.results_into.begin(), push.results_into.end());
  arm->push = push;
  arm->push.tensors = arm->tensors;
  arm->push.results_into = arm->results_into;
  std::lock_guard lock(s.mutex);
  s.failure.throw_if_set();
  if (s.closed)
    throw Error(kStatusClosed, fmt::format("attention {}: arm_device after finish()", s.spec.rank));
  auto& layouts = s.armed[static_cast<size_t>(mb)];
  if (s.last_sequence[static_cast<size_t>(mb)] != 0 && layouts.empty())
    for (int q = 0; q < s.spec.queue_depth; ++q)
      if (s.pending[static_cast<size_t>(mb * s.spec.queue_depth + q)].busy)
        throw Error(HM_ERR_INVALID_ARGUMENT,
                    fmt::format("arm_device: micro-batch {} has a round trip of push_pull in "
                                "flight: wait for it first",
                                mb));
  if (layouts.size() <= static_cast<size_t>(layout))
    layouts.resize(static_cast<size_t>(layout) + 1);
  layouts[static_cast<size_t>(layout)] = std::move(arm);
  if (!s.doorbell_thread)
    s.doorbell_thread = std::make_unique<DoorbellThread>(
        "hm-doorbells", sender_cpu(s.spec.comm_cpus, static_cast<size_t>(s.spec.ffn)),
        [&s] { return s.take_doorbells(); });
}

void AttentionEngine::enqueue_push_pull(int mb, uint32_t tokens, const Stream& stream, int layout) {
  State& s = *state_;
  check_trigger_stream(s.device, s.done_flags.has_value(), stream, "enqueue_push_pull",
                       "push_pull and wait on the host");
  if (mb < 0 || mb >= s.spec.micro_batches || tokens > s.spec.tokens)
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("enqueue_push_pull: micro-batch {} (0..{}) with {} tokens (0..{})", mb,
                            s.spec.micro_batches - 1, tokens, s.spec.tokens));
  {
    std::lock_guard lock(s.mutex);
    const auto& layouts = s.armed[static_cast<size_t>(mb)];
    if (layout < 0 || static_cast<size_t>(layout) >= layouts.size() ||
        !layouts[static_cast<size_t>(layout)])
      throw Error(HM_ERR_INVALID_ARGUMENT,
                  fmt::format("enqueue_push_pull: micro-batch {} is not armed{} (arm_device)", mb,
                              layout == 0 ? "" : fmt::format(" with layout {}", layout)));
  }
  stream.write_value32(s.doorbells->at(mb),
                       static_cast<uint32_t>(layout) * kDoorbellTokens + tokens + 1);
}

void AttentionEngine::enqueue_wait(int mb, const Stream& stream) {
  State& s = *state_;
  check_trigger_stream(s.device, s.done_flags.has_value(), stream, "enqueue_wait",
                       "push_pull and wait on the host");
  check_micro_batch(mb, s.spec.micro_batches, "enqueue_wait");
  enqueue_flag_wait(stream, *s.done_flags, mb);
}

void* AttentionEngine::doorbell(int mb) const {
  const State& s = *state_;
  if (!s.doorbells || mb < 0 || mb >= s.spec.micro_batches) return nullptr;
  return s.doorbells->at(mb);
}

const void* AttentionEngine::done_flag(int mb) const {
  const State& s = *state_;
  if (!s.done_flags || mb < 0 || mb >= s.spec.micro_batches) return nullptr;
  return s.done_flags->at(mb);
}

DeviceTrips AttentionEngine::device_trips() {
  return state_->device_log.take();
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
    s.metrics.error(HM_ERR_TIMEOUT);
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
  return receive_next_message(*state_, timeout);
}

RegisteredBuffer AttentionEngine::register_buffer(const void* data, uint64_t bytes) {
  const CallerBuffers::Found found =
      state_->caller->find_or_register(data, bytes, "register_buffer's buffer");
  return {static_cast<const uint8_t*>(data) - found.offset, found.size, found.fresh};
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

std::string AttentionEngine::metrics_text() const {
  return state_->metrics.render();
}

std::string AttentionEngine::metrics_address() const {
  return state_->metrics.address();
}

}  // namespace hetmesh::afd
