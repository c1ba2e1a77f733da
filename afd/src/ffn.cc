// The FFN side of the AFD engine.
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

namespace hetmesh::afd {

namespace {

// What arrived in one (A, micro-batch) slot.
struct Arrival {
  uint64_t sequence = 0;    // last sequence seen in this slot
  bool waiting = false;     // arrived, not yet handed out by get_batch
  bool responding = false;  // handed out, not yet answered (the slot's credit is taken)
  bool queued = false;      // respond() was called for it; its sender has yet to post
  uint32_t tokens = 0;
  uint32_t result_rows = 0;  // of the answer the A asked for
  uint64_t tag = 0;
  int64_t received = 0;
  int64_t batch_ready = 0;
  // Where its rows are: from this row of the row spaces, in the layout of receive buffers of this
  // number (0: the engine's own), each tensor's count.
  uint32_t row_offset = 0;
  uint32_t landing = 0;
  std::array<uint32_t, kMaxA2fTensors> rows{};
  // Where the answer goes: the A's registration of this number (0: its result slot), and where
  // it comes from: the application's buffer respond() found in the part (none: the slot).
  uint32_t reply_region = 0;
  uint64_t reply_offset = 0;
  CallerBuffers::Found output;
};

// One A's part of a micro-batch, for that A's sender.
struct RespondJob {
  int mb = 0;
  uint64_t epoch = 0;  // the A's incarnation the part came from
  uint64_t sequence = 0;
  uint32_t rows = 0;         // of the answer
  bool after_event = false;  // wait for the slot's ready event (recorded by respond)
  int64_t compute_start = 0;
  int64_t compute_end = 0;
  bool message = false;  // instead: the next side-band message to this A
};

// A layout of the application's receive buffers for a micro-batch (FfnEngine::receive_into): per
// A2F tensor, the registration of its buffer and where it starts (none: the engine's row space).
struct ReceiveLayout {
  std::array<CallerBuffers::Found, kMaxA2fTensors> found;
  std::array<uint8_t*, kMaxA2fTensors> data{};
};

}  // namespace

struct FfnEngine::State final : PeerHandler {
  EngineSpec spec;
  uint32_t wire_layout;  // job_layout(spec), once
  Device device;
  EngineMetrics metrics;  // stopped serving first, by ~FfnEngine
  std::unique_ptr<Transport> transport;
  Buffer a2f_receive;               // [mb][tensor][ffn_rows rows]: the input row spaces
  HostBuffer a2f_headers;           // [a][mb]
  Buffer f2a_send;                  // [mb][ffn_rows rows]: the output row spaces
  HostBuffer f2a_headers;           // [a][mb]
  std::vector<Event> ready_events;  // [a][mb], recorded on the caller's stream by respond
  PublishedRegions mine;
  std::shared_ptr<Region> f2a_send_region, f2a_header_region, a2f_receive_region;
  std::optional<CallerBuffers> caller;  // the application's buffers, once the transport is made
  MovedBytes moved;
  // The As' result buffers they announced (region frames), imported on their current links; the
  // receive buffers of this F's announced to each A's incarnation.
  PeerRegions a_regions;
  AnnouncedRegions announced;
  // [mb][landing - 1]: the layouts of receive buffers each micro-batch had, and [mb] the one its
  // As are told of (0: the engine's row spaces).
  std::vector<std::vector<ReceiveLayout>> layouts;
  std::vector<uint32_t> current_layout;
  static constexpr size_t kMaxLayouts = 64;  // per micro-batch

  std::mutex mutex;
  std::condition_variable changed;
  std::vector<Arrival> arrivals;  // [a][mb]
  std::deque<Batch> ready_batches;
  std::atomic<int> waiting_parts{0};  // arrivals waiting (changed under mutex), for on_turn
  int gone = 0;  // attention instances that left or were lost: no more parts from them
  int left = 0;  // of them, those that said ControlWord::leave
  FirstFailure failure;
  bool closed = false;            // finish() or the destructor: the threads are stopped
  SideBand side_band;             // messages to and from the A instances
  std::vector<std::string> lost;  // "attention 1 lost: ...", for FfnEngine::lost_attention
  // ready_batches is not empty, or failure is set: for get_batch's spin.
  std::atomic<bool> news{false};
  SpinPolicy get_spin;               // the caller's of get_batch
  std::unique_ptr<PeerGroup> peers;  // the A instances
  std::unique_ptr<CommThread> comm;
  std::vector<std::unique_ptr<PeerSender<RespondJob>>> senders;  // [a]
  // The device-triggered mode (serve_device), when the device has stream memory operations: [mb]
  // batch flags the engine raises and respond doorbells a stream rings; the batch of each
  // micro-batch held for the device until its doorbell rings (under mutex).
  std::optional<DeviceWords> batch_flags, respond_doorbells;
  bool device_mode = false;   // under mutex
  bool host_batches = false;  // get_batch handed one out, under mutex
  std::vector<std::optional<Batch>> device_held;
  // The doorbell thread's: turns since it last took the mutex, and why the job is over for this
  // F (empty while it serves).
  int turns_since_look = 0;
  std::string device_over;
  std::atomic<int> held_batches{0};  // device_held's, for its spin
  DeviceTripLog device_log;
  // Declared last: stopped before anything it uses goes. It raises the flags after the engine's
  // end too, until destroyed.
  std::unique_ptr<DoorbellThread> doorbell_thread;

  void respond_batch(const Batch& batch, const Stream* after, int64_t compute_start_ns);
  Turn serve_doorbells();

  template <typename Make>
  auto allocation(const char* what, Make make) {
    return engine_allocation(Role::ffn, spec.rank, what, make);
  }

  State(const EngineSpec& s, const Device& d)
      : spec((check_shape(s), s)),
        wire_layout(job_layout(spec)),
        device(d),
        metrics(spec, d),
        a2f_receive(allocation(
            "A2F row spaces",
            [&] { return d.allocate(s.a2f_block_bytes(s.ffn_rows(s.rank)) * s.micro_batches); })),
        a2f_headers(allocation(
            "A2F headers",
            [&] { return HostBuffer(d, sizeof(WireHeader) * s.attention * s.micro_batches); })),
        f2a_send(allocation("output row spaces",
                            [&] {
                              return d.allocate(s.ffn_rows(s.rank) * s.f2a_bytes_per_token() *
                                                s.micro_batches);
                            })),
        f2a_headers(allocation(
            "F2A headers",
            [&] { return HostBuffer(d, sizeof(WireHeader) * s.attention * s.micro_batches); })),
        a_regions(Role::attention, s.attention),
        announced(s.attention),
        layouts(static_cast<size_t>(s.micro_batches)),
        current_layout(static_cast<size_t>(s.micro_batches), 0),
        arrivals(static_cast<size_t>(s.attention * s.micro_batches)),
        side_band(Role::ffn, s.rank, Role::attention, s.attention),
        device_held(static_cast<size_t>(s.micro_batches)) {
    for (size_t i = 0; i < arrivals.size(); ++i)
      ready_events.push_back(d.create_event(HM_EVENT_DISABLE_TIMING));
  }

  void close() {
    {
      std::lock_guard lock(mutex);
      if (closed) return;
      closed = true;
      news.store(true, std::memory_order_release);
    }
    changed.notify_all();  // a get_batch() in another thread ends now, saying why
    for (auto& sender : senders)
      sender->stop();
    peers->stop_rejoin();
    comm->stop();
  }

  size_t slot(int a, int mb) const { return static_cast<size_t>(a * spec.micro_batches + mb); }

  // Row `row` of micro-batch mb's output row space, and of A2F tensor `tensor`'s input rows in
  // the layout `landing` (0: the engine's row spaces).
  uint8_t* output_rows(int mb, uint64_t row) const {
    return static_cast<uint8_t*>(f2a_send.data()) + ffn_output_offset(spec, spec.rank, mb, row);
  }
  uint8_t* input_rows(int mb, int tensor, uint32_t landing, uint64_t row) const {
    if (spec.a2f_row_bytes(tensor) == 0) return nullptr;
    uint8_t* buffer =
        landing == 0
            ? nullptr
            : layouts[static_cast<size_t>(mb)][landing - 1].data[static_cast<size_t>(tensor)];
    if (buffer == nullptr)
      return static_cast<uint8_t*>(a2f_receive.data()) +
             ffn_input_offset(spec, spec.rank, mb, tensor, row);
    return buffer + row * spec.a2f_row_bytes(tensor);
  }

  // A's part of micro-batch mb as it arrived. Caller holds mutex.
  Batch::FromAttention part(int a, int mb) {
    const Arrival& arrival = arrivals[slot(a, mb)];
    Batch::FromAttention part;
    part.rank = a;
    part.epoch = peers->at(a).link->epoch;
    part.sequence = arrival.sequence;
    part.tag = arrival.tag;
    part.tokens = arrival.tokens;
    part.result_rows = arrival.result_rows;
    part.row_offset = arrival.row_offset;
    for (int t = 0; t < spec.a2f_tensors(); ++t) {
      part.inputs[static_cast<size_t>(t)] = input_rows(mb, t, arrival.landing, arrival.row_offset);
      part.rows[static_cast<size_t>(t)] = arrival.rows[static_cast<size_t>(t)];
    }
    part.output = output_rows(mb, arrival.row_offset);
    return part;
  }

  // A batch whose parts lie back to back from row 0, in one layout: one tensor of each kind.
  // Caller holds mutex.
  void mark_packed(Batch& batch) const {
    uint32_t next = 0;
    for (const Batch::FromAttention& part : batch.parts) {
      const Arrival& arrival = arrivals[slot(part.rank, batch.micro_batch)];
      if (part.row_offset != next ||
          arrival.landing != arrivals[slot(batch.parts[0].rank, batch.micro_batch)].landing)
        return;
      next += part.tokens;
    }
    // Every tensor in all parts or in none (a dense layer's router logits).
    for (int t = 0; t < spec.a2f_tensors(); ++t) {
      const auto i = static_cast<size_t>(t);
      bool all = true, none = true;
      for (const Batch::FromAttention& part : batch.parts) {
        all = all && part.rows[i] == part.tokens;
        none = none && part.rows[i] == 0;
      }
      if (!all && !none) return;
    }
    batch.packed = !batch.parts.empty();
    batch.packed_rows = next;
  }

  void on_failure(hm_status status, const std::string& reason) override {
    {
      std::lock_guard lock(mutex);
      if (!failure.set(status, reason)) return;
      metrics.error(status);
      news.store(true, std::memory_order_release);
    }
    log(LogLevel::error, "ffn {}: {}", spec.rank, reason);
    changed.notify_all();
  }

  // Every A is gone, at least one cleanly: get_batch's end, unless a lost one is being replaced.
  // Caller holds mutex.
  bool all_done() const { return gone == spec.attention && left > 0; }

  // Every A was lost, each saying ControlWord::quit: none of them is to be replaced. Caller holds
  // mutex.
  bool every_one_quit() const {
    if (gone != spec.attention || left != 0) return false;
    for (const Peer& peer : peers->all())
      if (peer.lost && !peer.quit) return false;
    return true;
  }

  // The part came from an incarnation of its A that was replaced since. Caller holds mutex.
  bool replaced(const Batch::FromAttention& part) const {
    return part.epoch != peers->at(part.rank).link->epoch;
  }

  // Attention `a` may still send parts. Caller holds mutex.
  bool in_job(int a) const {
    const Peer& peer = peers->at(a);
    return !peer.left && !peer.lost;
  }

  // A's waiting part of micro-batch mb, now handed out (its credit taken until answered). Caller
  // holds mutex.
  Batch::FromAttention hand_out(int a, int mb, int64_t now) {
    Arrival& arrival = arrivals[slot(a, mb)];
    arrival.waiting = false;
    waiting_parts.fetch_sub(1, std::memory_order_relaxed);
    arrival.responding = true;
    arrival.batch_ready = now;
    return part(a, mb);
  }

  // Hands out complete micro-batches (gather all) or single parts (eager); with `overdue`, the
  // parts of mb that are waiting, complete or not. Caller holds mutex.
  void release_batches(int mb, bool overdue = false) {
    int64_t now = now_ns();
    if (spec.gather == Gather::eager) {
      for (int a = 0; a < spec.attention; ++a) {
        if (!arrivals[slot(a, mb)].waiting) continue;
        metrics.batch(arrivals[slot(a, mb)].received, now, false);
        ready_batches.push_back(Batch{mb, {hand_out(a, mb, now)}, now});
        mark_packed(ready_batches.back());
        news.store(true, std::memory_order_release);
      }
      return;
    }
    // Complete when every attention instance still in the job has sent its part: one that left
    // or was lost sends no more, and the live ones are served without it.
    bool any = false;
    for (int a = 0; a < spec.attention; ++a) {
      if (arrivals[slot(a, mb)].waiting)
        any = true;
      else if (!in_job(a) || !spec.sends(a, spec.rank) || overdue)
        continue;
      else
        return;
    }
    if (!any) return;
    int64_t first = now;
    for (int a = 0; a < spec.attention; ++a)
      if (arrivals[slot(a, mb)].waiting) first = std::min(first, arrivals[slot(a, mb)].received);
    metrics.batch(first, now, overdue);
    Batch batch{mb, {}, now};
    for (int a = 0; a < spec.attention; ++a) {
      if (!arrivals[slot(a, mb)].waiting) continue;
      metrics.part_lag(a, arrivals[slot(a, mb)].received - first);
      batch.parts.push_back(hand_out(a, mb, now));
    }
    mark_packed(batch);
    ready_batches.push_back(std::move(batch));
    news.store(true, std::memory_order_release);
  }

  // A `a`'s part in `slot` (checked against the slot table by on_message).
  void on_request(int a, uint32_t slot_index) {
    std::string from = peer_name(Role::attention, a);
    int mb = static_cast<int>(slot_index) % spec.micro_batches;
    if (static_cast<int>(slot_index) / spec.micro_batches != a)
      throw Error(kStatusProtocolError,
                  fmt::format("{} notified slot {}, which belongs to attention {}", from,
                              slot_index, static_cast<int>(slot_index) / spec.micro_batches));
    WireHeader h = reinterpret_cast<const WireHeader*>(a2f_headers.data())[slot(a, mb)];
    validate(h, spec, wire_layout, MessageKind::a2f, static_cast<uint32_t>(a),
             peers->at(a).link->epoch, static_cast<uint32_t>(mb), from.c_str());
    if (!spec.sends(a, spec.rank))
      throw Error(
          kStatusProtocolError,
          fmt::format("{} sent ffn {} a part, which the job's topology ({}) does not map "
                      "to it",
                      from, spec.rank, spec.topology == JobTopology::all ? "all" : "groups"));
    std::lock_guard lock(mutex);
    if (h.reply_region != 0) {
      // A buffer of the A's own that it announced, with room for the whole answer.
      std::shared_ptr<RemoteRegion> region = a_regions.find_locked(a, h.reply_region);
      const uint64_t answer = uint64_t{h.result_rows} * spec.f2a_bytes_per_token();
      if (region == nullptr || region->size() < answer || h.reply_offset > region->size() - answer)
        throw Error(
            kStatusProtocolError,
            fmt::format("{}: refused header: answer to its buffer {} at offset {} ({} "
                        "bytes), {}",
                        from, h.reply_region, h.reply_offset, answer,
                        region == nullptr ? "which it never announced"
                                          : fmt::format("which holds {} bytes", region->size())));
    }
    if (h.landing > layouts[static_cast<size_t>(mb)].size())
      throw Error(kStatusProtocolError,
                  fmt::format("{}: refused header: landing {} of micro-batch {}, which this F "
                              "never announced",
                              from, h.landing, mb));
    Arrival& arrival = arrivals[slot(a, mb)];
    // Sequences go up by one per slot; a new incarnation of this F (sequence 0 here) takes up
    // where the A's count is.
    if (arrival.waiting || arrival.responding || h.sequence <= arrival.sequence ||
        (arrival.sequence != 0 && h.sequence != arrival.sequence + 1))
      throw Error(kStatusProtocolError,
                  fmt::format("{} sent micro-batch {} sequence {}, but its slot {} (last sequence "
                              "{})",
                              from, mb, h.sequence,
                              arrival.waiting || arrival.responding ? "is still in use"
                                                                    : "expects the next one",
                              arrival.sequence));
    // Its rows must not lie over a part of another A that this F still holds unanswered (waiting,
    // or handed out and not yet given to respond()): the bytes have landed, and that part's are
    // gone. A part respond() took is done with its inputs (its answer waits for the compute).
    const uint64_t begin = h.row_offset, end = begin + std::max(header_rows(h), h.result_rows);
    for (int b = 0; b < spec.attention && end > begin; ++b) {
      const Arrival& other = arrivals[slot(b, mb)];
      if (b == a || !(other.waiting || (other.responding && !other.queued))) continue;
      const uint64_t other_end =
          other.row_offset +
          uint64_t{
              std::max(*std::max_element(other.rows.begin(), other.rows.end()), other.result_rows)};
      if (other_end > other.row_offset && begin < other_end && other.row_offset < end)
        throw Error(kStatusProtocolError,
                    fmt::format("{} pushed micro-batch {} at rows {}..{}, over the rows {}..{} "
                                "of {}'s part that this F still holds (row offsets that overlap "
                                "across steps: every A must push each step, at offsets agreed "
                                "for that step)",
                                from, mb, begin, end, other.row_offset, other_end,
                                peer_name(Role::attention, b)));
    }
    arrival.sequence = h.sequence;
    arrival.tokens = h.tokens;
    arrival.result_rows = h.result_rows;
    arrival.tag = h.tag;
    arrival.row_offset = h.row_offset;
    arrival.landing = h.landing;
    std::copy(std::begin(h.rows), std::end(h.rows), arrival.rows.begin());
    uint64_t payload = 0;
    for (int t = 0; t < spec.a2f_tensors(); ++t) {
      const CallerBuffers::Found* into =
          h.landing == 0
              ? nullptr
              : &layouts[static_cast<size_t>(mb)][h.landing - 1].found[static_cast<size_t>(t)];
      const bool application = into != nullptr && into->region != nullptr;
      moved.add(application ? *into->region : *a2f_receive_region, application,
                uint64_t{h.rows[t]} * spec.a2f_row_bytes(t));
      payload += uint64_t{h.rows[t]} * spec.a2f_row_bytes(t);
    }
    metrics.received(a, payload + sizeof(WireHeader));
    arrival.reply_region = h.reply_region;
    arrival.reply_offset = h.reply_offset;
    arrival.received = now_ns();
    arrival.waiting = true;
    waiting_parts.fetch_add(1, std::memory_order_relaxed);
    release_batches(mb);
    changed.notify_all();
  }

  // A `a`'s sender: once the outputs are ready, the part's outputs, then the header that
  // notifies. Each part goes out as soon as its own A's sender gets to it.
  void respond_to(int a, const RespondJob& job, const std::atomic<bool>& stopping) {
    const int mb = job.mb;
    const size_t s = slot(a, mb);
    try {
      if (job.message) return send_next_frame(*this, a, Role::attention);
      if (!wait_ready(ReadyWait{job.after_event ? &ready_events[s] : nullptr}, stopping)) return;
      // The compute ends when its stream's work is seen done, not when respond() queued it (a
      // device's kernels run after their enqueue returns).
      const int64_t compute_end = job.after_event ? now_ns() : job.compute_end;
      WireHeader* h = reinterpret_cast<WireHeader*>(f2a_headers.data()) + s;
      int64_t received, batch_ready;
      uint32_t messages;
      std::shared_ptr<const Link> link;
      std::shared_ptr<RemoteRegion> reply;  // the A's buffer, or none: its result slot
      uint64_t reply_offset = 0;
      CallerBuffers::Found output;
      uint32_t row_offset;
      {
        std::lock_guard lock(mutex);
        if (failure.has()) return;
        const Peer& peer = peers->at(a);
        if (peer.link->epoch != job.epoch) return;  // replaced: the slot is the new one's
        if (peer.lost) {                            // nobody to answer: free the slot
          arrivals[s].responding = arrivals[s].queued = false;
          return;
        }
        received = arrivals[s].received;
        batch_ready = arrivals[s].batch_ready;
        if (arrivals[s].reply_region != 0) {
          reply = a_regions.find_locked(a, arrivals[s].reply_region);
          reply_offset = arrivals[s].reply_offset;
        }
        output = arrivals[s].output;
        row_offset = arrivals[s].row_offset;
        messages = side_band.sent_locked(a);
        link = peer.link;
      }
      *h = make_header(spec, wire_layout, peers->own_epoch(), MessageKind::f2a, mb, job.sequence,
                       job.rows, uint64_t{job.rows} * spec.f2a_bytes_per_token());
      h->messages = messages;
      h->stamps[kReceived] = static_cast<uint64_t>(received);
      h->stamps[kBatchReady] = static_cast<uint64_t>(batch_ready);
      h->stamps[kComputeStart] = static_cast<uint64_t>(job.compute_start);
      h->stamps[kComputeEnd] = static_cast<uint64_t>(compute_end);
      h->stamps[kPosted] = static_cast<uint64_t>(now_ns());
      // A's slot for (mb, this F).
      uint64_t remote_slot = static_cast<uint64_t>(mb * spec.ffn + spec.rank);
      try {
        if (h->payload_bytes > 0) {  // an empty part's answer is the header alone
          const Region& from = output.region ? *output.region : *f2a_send_region;
          link->connection->write(
              from,
              output.region ? output.offset : ffn_output_offset(spec, spec.rank, mb, row_offset),
              reply ? *reply : link->region("f2a_payload"),
              reply ? reply_offset : remote_slot * spec.f2a_slot_bytes(), h->payload_bytes,
              std::nullopt, 0, /*more=*/true);  // the header follows
          moved.add(from, output.region != nullptr, h->payload_bytes);
        }
        {
          // The credit goes back before the notifying write: once A sees it, A may send this
          // slot's next sequence at once, and the comm thread must find the slot free.
          std::lock_guard lock(mutex);
          arrivals[s].responding = false;
          arrivals[s].queued = false;
        }
        link->connection->write(*f2a_header_region, s * sizeof(WireHeader),
                                link->region("f2a_headers"), remote_slot * sizeof(WireHeader),
                                sizeof(WireHeader), static_cast<uint32_t>(remote_slot), 0);
        metrics.sent(a, h->payload_bytes + sizeof(WireHeader));
        metrics.answered(static_cast<int64_t>(h->stamps[kPosted]) - batch_ready);
      } catch (const Error& e) {
        // The connection broke under the write: its peer_lost event, on the comm thread, decides
        // (an attention instance that is gone is contained, not fatal).
        if (e.status() == kStatusPeerLost) {
          std::lock_guard lock(mutex);
          if (peers->at(a).link->epoch == job.epoch)
            arrivals[s].responding = arrivals[s].queued = false;
          return;
        }
        rethrow_for_peer(e, Role::attention, a);
      }
    } catch (const Error& e) {
      on_failure(e.status(), e.what());
    } catch (const std::exception& e) {
      on_failure(HM_ERR_INTERNAL, e.what());
    }
  }

  // Attention `a` is gone without ControlWord::leave: contained. Its parts not yet handed out are
  // dropped, gather-all micro-batches that waited only for it are released to the live ones, and
  // answers still owed to it are skipped by its sender. When every A is lost and none left cleanly,
  // get_batch waits for a replacement until its timeout.
  void on_lost_locked(int a, const std::string& reason) override {
    ++gone;
    lost.push_back(reason);
    // Its parts not handed out yet go: from batches waiting in ready_batches too (a batch left
    // empty goes with them), so get_batch never hands out work for an instance that is gone.
    for (Batch& batch : ready_batches)
      std::erase_if(batch.parts, [&](const Batch::FromAttention& part) {
        if (part.rank != a) return false;
        arrivals[slot(a, batch.micro_batch)].responding = false;
        return true;
      });
    std::erase_if(ready_batches, [](const Batch& batch) { return batch.parts.empty(); });
    for (Batch& batch : ready_batches) {
      batch.packed = false;
      mark_packed(batch);
    }
    news.store(!ready_batches.empty(), std::memory_order_relaxed);
    for (int mb = 0; mb < spec.micro_batches; ++mb) {
      if (arrivals[slot(a, mb)].waiting) waiting_parts.fetch_sub(1, std::memory_order_relaxed);
      arrivals[slot(a, mb)].waiting = false;
      release_batches(mb);
    }
    changed.notify_all();
  }

  // Gather-all: the micro-batches whose oldest waiting part has waited a whole gather window go
  // out as they are (EngineSpec::gather_window says why).
  void on_turn() override {
    if (spec.gather != Gather::all || waiting_parts.load(std::memory_order_relaxed) == 0) return;
    const int64_t now = now_ns();
    const int64_t window =
        std::chrono::duration_cast<std::chrono::nanoseconds>(spec.gather_window).count();
    bool released = false;
    {
      std::lock_guard lock(mutex);
      for (int mb = 0; mb < spec.micro_batches; ++mb) {
        int64_t oldest = now;
        for (int a = 0; a < spec.attention; ++a)
          if (const Arrival& arrival = arrivals[slot(a, mb)]; arrival.waiting)
            oldest = std::min(oldest, arrival.received);
        if (now - oldest < window) continue;
        log(LogLevel::debug,
            "ffn {}: micro-batch {} waited {} ms for the other attention "
            "instances; served without them",
            spec.rank, mb, (now - oldest) / 1000000);
        release_batches(mb, /*overdue=*/true);
        released = true;
      }
    }
    if (released) changed.notify_all();
  }

  // A's replacement starts afresh: its slots' sequences start again, and gather-all waits for it.
  void on_rejoined_locked(int a) override {
    side_band.restart_locked(a);
    a_regions.clear_locked(a);  // imported on the old incarnation's link
    announced.clear_locked(a);
    const Peer& peer = peers->at(a);
    if (peer.lost || peer.left) --gone;
    if (peer.left) --left;
    for (int mb = 0; mb < spec.micro_batches; ++mb) {
      if (arrivals[slot(a, mb)].waiting) waiting_parts.fetch_sub(1, std::memory_order_relaxed);
      arrivals[slot(a, mb)] = Arrival{};
    }
    // The replacement hears where this F wants its rows (until it has, it sends them to the row
    // spaces, which a part then says).
    if (spec.sends(a, spec.rank))
      for (int mb = 0; mb < spec.micro_batches; ++mb)
        if (current_layout[static_cast<size_t>(mb)] != 0) {
          try {
            announce_locked(a, mb);
          } catch (const Error& e) {
            log(LogLevel::warn, "ffn {}: {}", spec.rank, e.what());
            break;
          }
        }
    changed.notify_all();
  }

  // The frames announce_locked(a, mb) would queue: the landing, and a region frame for each
  // registration of the layout that A `a` has not heard of. Caller holds mutex.
  size_t announcement_frames_locked(int a, int mb) const {
    const uint32_t id = current_layout[static_cast<size_t>(mb)];
    size_t frames = 1;
    std::vector<uint32_t> fresh;
    if (id != 0)
      for (const CallerBuffers::Found& found : layouts[static_cast<size_t>(mb)][id - 1].found)
        if (found.region && !announced.has_locked(a, found.id) &&
            std::find(fresh.begin(), fresh.end(), found.id) == fresh.end()) {
          fresh.push_back(found.id);
          ++frames;
        }
    return frames;
  }

  // Tells A `a` where its rows of micro-batch mb land from now on (the layout current_layout[mb]):
  // the region frames of buffers new to it, then the landing, each a job of its sender, in order
  // with this F's answers. Throws Error(INVALID_ARGUMENT), changing nothing, when the frames do
  // not fit the A's queue of messages. Caller holds mutex.
  void announce_locked(int a, int mb) {
    const uint32_t id = current_layout[static_cast<size_t>(mb)];
    LandingFrame frame{static_cast<uint32_t>(mb), id, {}, {}};
    std::vector<std::vector<uint8_t>> frames;
    std::vector<uint32_t> fresh;  // registrations new to this A
    if (id != 0) {
      const ReceiveLayout& layout = layouts[static_cast<size_t>(mb)][id - 1];
      for (size_t t = 0; t < layout.found.size(); ++t) {
        const CallerBuffers::Found& found = layout.found[t];
        if (!found.region) continue;
        frame.region[t] = found.id;
        frame.offset[t] = found.offset;
        if (!announced.has_locked(a, found.id) &&
            std::find(fresh.begin(), fresh.end(), found.id) == fresh.end()) {
          fresh.push_back(found.id);
          frames.push_back(region_frame(found.id, found.region->describe()));
        }
      }
    }
    frames.push_back(landing_frame(frame));
    const size_t count = frames.size();
    side_band.queue_frames_locked(a, std::move(frames));  // all of them, or none
    for (uint32_t registration : fresh)
      announced.first_locked(a, registration);
    for (size_t i = 0; i < count; ++i) {
      RespondJob job;
      job.message = true;
      senders[static_cast<size_t>(a)]->push(job);
    }
  }

  // The application holds none of A's parts any more (each answered, or skipped because A is
  // lost), so its slots can take the replacement's data.
  bool ready_to_replace_locked(int a) override {
    if (!peers->at(a).lost && !peers->at(a).left) return false;
    for (int mb = 0; mb < spec.micro_batches; ++mb)
      if (arrivals[slot(a, mb)].responding || arrivals[slot(a, mb)].queued) return false;
    return true;
  }

  void on_message(int a, const TransportEvent& e) override {
    if (e.type == TransportEvent::Type::notification) {
      check_slot(e.value, static_cast<uint32_t>(spec.attention * spec.micro_batches),
                 peer_name(Role::attention, a));
      bool now;
      {
        std::lock_guard lock(mutex);
        now = side_band.admit_locked(
            a, e.value, reinterpret_cast<const WireHeader*>(a2f_headers.data())[e.value].messages);
      }
      if (now) on_request(a, e.value);
    } else if (auto body = message_body(e.payload)) {
      std::vector<uint32_t> released;
      {
        std::lock_guard lock(mutex);
        released = side_band.arrived_locked(a, *body);
      }
      changed.notify_all();
      for (uint32_t slot_index : released)
        on_request(a, slot_index);
    } else if (auto region = region_of(e.payload)) {
      // A buffer of the A's own for answers.
      for (uint32_t slot_index :
           receive_region(a_regions, side_band, mutex, a, *peers->at(a).link, *region))
        on_request(a, slot_index);
    } else if (decode_control(e.payload) == ControlWord::leave) {
      std::lock_guard lock(mutex);
      Peer& peer = peers->at(a);
      if (!peer.left && !peer.lost) ++gone, ++left;
      peer.left = true;  // the comm thread's to write (Peer), under the mutex
      for (int mb = 0; mb < spec.micro_batches; ++mb)
        release_batches(mb);  // gather-all batches that waited only for it
      changed.notify_all();
    }
  }
};

FfnEngine::FfnEngine(const EngineSpec& spec, const Device& device, KeyValueStore& store)
    : state_(std::make_unique<State>(spec, device)) {
  State& s = *state_;
  s.spec.role = Role::ffn;
  if (device.has(HM_CAP_STREAM_MEMOPS | HM_CAP_PINNED_HOST_MEMORY)) {
    s.batch_flags.emplace(device, spec.micro_batches);
    s.respond_doorbells.emplace(device, spec.micro_batches);
  }
  s.transport = Transport::create(transport_options(spec, device));
  s.metrics.connect(s.transport->kind());
  s.metrics.serve(s.spec.transport.secret ? &*s.spec.transport.secret : nullptr);
  s.caller.emplace(*s.transport, device, peer_name(Role::ffn, spec.rank));
  s.a2f_receive_region = s.mine.regions["a2f_payload"] =
      s.transport->register_memory(device, s.a2f_receive.data(), s.a2f_receive.size());
  s.mine.regions["a2f_headers"] =
      s.transport->register_memory(device, s.a2f_headers.data(), s.a2f_headers.size());
  s.f2a_send_region = s.transport->register_memory(device, s.f2a_send.data(), s.f2a_send.size());
  s.f2a_header_region =
      s.transport->register_memory(device, s.f2a_headers.data(), s.f2a_headers.size());
  auto own_store = store.clone();  // the rejoin thread's: the caller's need not outlive the call
  s.peers = std::make_unique<PeerGroup>(
      s.spec, Role::attention, *s.transport,
      join(s.spec, *s.transport, s.mine, store, Role::attention, spec.attention), s.mutex, s,
      s.metrics);
  s.comm = std::make_unique<CommThread>(spec.comm_cpus, [&s] { s.peers->turn(); });
  s.peers->start_rejoin(std::move(own_store));
  s.senders = start_senders<RespondJob>(
      s.spec, Role::attention, spec.attention,
      static_cast<size_t>(spec.micro_batches) + SideBand::kMaxQueued,
      [&s](int a, const RespondJob& job, const std::atomic<bool>& stopping) {
        s.respond_to(a, job, stopping);
      });
  s.metrics.read_with([this] { return metrics_reading(*this); });
  log(LogLevel::info, "ffn {} (epoch {}): connected to {} attention instance(s) over {}", spec.rank,
      s.peers->own_epoch(), spec.attention, to_string(s.transport->kind()));
}

FfnEngine::~FfnEngine() {
  state_->metrics.stop();  // no scrape reads the engine from here on
  state_->close();
}

void FfnEngine::finish() {
  State& s = *state_;
  {
    std::lock_guard lock(s.mutex);
    if (s.closed) return;
  }
  // The answers respond() queued go out first: a finish() after the last respond() loses none.
  const auto deadline = Clock::now() + s.spec.timeout;
  for (size_t a = 0; a < s.senders.size(); ++a)
    if (!s.senders[a]->drain(deadline))
      log(LogLevel::warn, "ffn {}: the answers queued for {} did not go out within {} ms",
          s.spec.rank, peer_name(Role::attention, static_cast<int>(a)), s.spec.timeout.count());
  s.close();
  std::lock_guard lock(s.mutex);
  s.failure.throw_if_set();
}

void FfnEngine::send_message(int a, std::span<const uint8_t> bytes) {
  State& s = *state_;
  if (a < 0 || a >= s.spec.attention)
    throw Error(HM_ERR_INVALID_ARGUMENT, fmt::format("send_message: attention {} does not exist "
                                                     "(0..{})",
                                                     a, s.spec.attention - 1));
  {
    std::lock_guard lock(s.mutex);
    s.failure.throw_if_set();
    if (s.closed)
      throw Error(kStatusClosed, fmt::format("ffn {}: send_message after finish()", s.spec.rank));
    if (const Peer& peer = s.peers->at(a); peer.lost || peer.left)
      throw Error(
          kStatusPeerLost,
          fmt::format("ffn {}: send_message: {}", s.spec.rank,
                      peer.lost ? peer.lost_reason : peer_name(Role::attention, a) + " has left"));
    s.side_band.queue_locked(a, bytes);
  }
  RespondJob job;
  job.message = true;
  s.senders[static_cast<size_t>(a)]->push(job);
}

std::optional<Message> FfnEngine::receive_message(std::chrono::milliseconds timeout) {
  return receive_next_message(*state_, timeout);
}

std::vector<std::string> FfnEngine::lost_attention() const {
  std::lock_guard lock(state_->mutex);
  return state_->lost;
}

std::vector<PeerStatus> FfnEngine::peers() const {
  std::lock_guard lock(state_->mutex);
  return peer_status(Role::attention, state_->peers->all());
}

PeerHistory FfnEngine::peer_history() const {
  std::lock_guard lock(state_->mutex);
  return state_->peers->history_locked();
}

const EngineSpec& FfnEngine::spec() const {
  return state_->spec;
}

uint64_t FfnEngine::epoch() const {
  return state_->peers->own_epoch();
}

std::optional<Batch> FfnEngine::get_batch(std::chrono::milliseconds timeout) {
  State& s = *state_;
  TimedWait measured(s.get_spin);
  measured.spin([&] { return s.news.load(std::memory_order_acquire); });
  const auto deadline = Clock::now() + timeout;
  std::unique_lock lock(s.mutex);
  if (s.closed)
    throw Error(kStatusClosed, fmt::format("ffn {}: get_batch after finish()", s.spec.rank));
  if (s.device_mode)
    throw Error(HM_ERR_INVALID_ARGUMENT,
                "get_batch: this F serves its device (serve_device): its stream waits for the "
                "batches");
  // Lost As whose replacement has claimed its epoch, by rank and the lost epoch: while one of
  // them is not in yet, the As that left do not end the job.
  std::vector<std::pair<int, uint64_t>> coming;
  auto awaiting = [&] {
    return std::any_of(coming.begin(), coming.end(),
                       [&](const auto& c) { return s.peers->at(c.first).link->epoch == c.second; });
  };
  for (;;) {
    const bool woke = s.changed.wait_until(lock, deadline, [&] {
      return !s.ready_batches.empty() || s.failure.has() || (s.all_done() && !awaiting()) ||
             s.every_one_quit() || s.closed;
    });
    s.failure.throw_if_set();
    if (s.closed)
      throw Error(
          kStatusClosed,
          fmt::format("ffn {}: the engine was finished while get_batch waited", s.spec.rank));
    if (!s.ready_batches.empty()) {
      Batch batch = std::move(s.ready_batches.front());
      s.ready_batches.pop_front();
      s.host_batches = true;
      s.news.store(!s.ready_batches.empty() || s.failure.has(), std::memory_order_relaxed);
      return batch;
    }
    if (s.all_done() && !awaiting()) {
      // Every A left or was lost. One lost that is being replaced will send again: the job is
      // not over until it has joined (the store says so before the member log does).
      std::vector<std::pair<int, uint64_t>> lost;
      for (const Peer& peer : s.peers->all())
        if (peer.lost && !peer.quit) lost.emplace_back(peer.rank, peer.link->epoch);
      if (lost.empty()) return std::nullopt;
      lock.unlock();
      std::erase_if(
          lost, [&](const auto& l) { return !s.peers->newer_epoch_claimed(l.first, l.second); });
      lock.lock();
      if (lost.empty()) return std::nullopt;
      for (const auto& [a, epoch] : lost)
        log(LogLevel::info,
            "ffn {}: the other attention instances are done; waiting for {}'s replacement",
            s.spec.rank, peer_name(Role::attention, a));
      coming = std::move(lost);
      continue;
    }
    if (s.every_one_quit())
      throw Error(kStatusPeerLost,
                  fmt::format("ffn {}: every attention instance was lost, each after a failure of "
                              "its own (last: {})",
                              s.spec.rank, s.lost.empty() ? "?" : s.lost.back()));
    if (woke) continue;
    if (awaiting())
      throw Error(HM_ERR_TIMEOUT,
                  fmt::format("ffn {}: the other attention instances are done, and the "
                              "replacement of {} did not join within {} ms",
                              s.spec.rank, peer_name(Role::attention, coming.front().first),
                              timeout.count()));
    if (s.gone == s.spec.attention)
      throw Error(HM_ERR_TIMEOUT,
                  fmt::format("ffn {}: every attention instance was lost, and none was replaced "
                              "within {} ms (last: {})",
                              s.spec.rank, timeout.count(), s.lost.empty() ? "?" : s.lost.back()));
    std::string waiting;
    for (int a = 0; a < s.spec.attention; ++a)
      for (int mb = 0; mb < s.spec.micro_batches; ++mb)
        if (s.arrivals[s.slot(a, mb)].waiting)
          waiting +=
              fmt::format("{}(attention {}, micro-batch {})", waiting.empty() ? "" : ", ", a, mb);
    throw Error(HM_ERR_TIMEOUT,
                fmt::format("ffn {}: no complete micro-batch within {} ms{}{}", s.spec.rank,
                            timeout.count(), waiting.empty() ? "" : "; partial: ", waiting));
  }
}

void FfnEngine::respond(const Batch& batch, const Stream* after, int64_t compute_start_ns) {
  {
    std::lock_guard lock(state_->mutex);
    if (state_->device_mode)
      throw Error(HM_ERR_INVALID_ARGUMENT,
                  "respond: this F serves its device (serve_device): a stream rings its answers");
  }
  state_->respond_batch(batch, after, compute_start_ns);
}

void FfnEngine::State::respond_batch(const Batch& batch, const Stream* after,
                                     int64_t compute_start_ns) {
  State& s = *this;
  int64_t compute_end = now_ns();
  // Each part's answer rows, as its A asked (the engine's record, not the caller's copy).
  std::vector<uint32_t> answer_rows(batch.parts.size(), 0);
  {
    std::lock_guard lock(s.mutex);
    s.failure.throw_if_set();
    if (s.closed)
      throw Error(kStatusClosed, fmt::format("ffn {}: respond after finish()", s.spec.rank));
    if (batch.micro_batch < 0 || batch.micro_batch >= s.spec.micro_batches)
      throw Error(HM_ERR_INVALID_ARGUMENT,
                  fmt::format("respond: micro-batch {} does not exist", batch.micro_batch));
    for (const auto& part : batch.parts) {
      if (part.rank < 0 || part.rank >= s.spec.attention)
        throw Error(HM_ERR_INVALID_ARGUMENT,
                    fmt::format("respond: attention {} does not exist", part.rank));
      if (s.replaced(part)) continue;
      const Arrival& arrival = s.arrivals[s.slot(part.rank, batch.micro_batch)];
      if (!arrival.responding || arrival.queued || arrival.sequence != part.sequence)
        throw Error(HM_ERR_INVALID_ARGUMENT,
                    fmt::format("respond: attention {} micro-batch {} sequence {} is not awaiting "
                                "an answer{}",
                                part.rank, batch.micro_batch, part.sequence,
                                arrival.queued ? " (already answered)" : ""));
      answer_rows[static_cast<size_t>(&part - batch.parts.data())] = arrival.result_rows;
    }
  }
  // The parts whose output the application pointed at a buffer of its own, registered at first
  // sight (nothing is allocated when every output is the engine's slot).
  std::vector<CallerBuffers::Found> outputs;
  for (size_t i = 0; i < batch.parts.size(); ++i) {
    const auto& part = batch.parts[i];
    if (part.output == s.output_rows(batch.micro_batch, part.row_offset) || answer_rows[i] == 0)
      continue;
    outputs.resize(batch.parts.size());
    outputs[i] = s.caller->find_or_register(
        part.output, uint64_t{answer_rows[i]} * s.spec.f2a_bytes_per_token(), "a part's output");
  }
  // Each part's slot event is free: its last record was waited for before the slot's previous
  // answer was posted. Recording it is all the engine keeps of the caller's stream; a record that
  // fails leaves every part unanswered and awaiting respond() again.
  // A part of an A that was replaced since is not answered: its slot is the new incarnation's
  // (which could be replaced only once none of the old one's parts was held, so this is rare).
  if (after != nullptr)
    for (const auto& part : batch.parts) {
      bool replaced;
      {
        std::lock_guard lock(s.mutex);
        replaced = s.replaced(part);
      }
      if (!replaced) s.ready_events[s.slot(part.rank, batch.micro_batch)].record(*after);
    }
  std::lock_guard lock(s.mutex);
  for (const auto& part : batch.parts)
    if (!s.replaced(part) && s.arrivals[s.slot(part.rank, batch.micro_batch)].queued)
      throw Error(HM_ERR_INVALID_ARGUMENT,
                  fmt::format("respond: attention {} micro-batch {} was answered meanwhile",
                              part.rank, batch.micro_batch));
  // Queued under the engine's mutex: a sender never takes it while it holds its own.
  for (size_t i = 0; i < batch.parts.size(); ++i) {
    const auto& part = batch.parts[i];
    if (s.replaced(part)) continue;
    Arrival& arrival = s.arrivals[s.slot(part.rank, batch.micro_batch)];
    arrival.queued = true;
    arrival.output = outputs.empty() ? CallerBuffers::Found{} : std::move(outputs[i]);
    s.senders[static_cast<size_t>(part.rank)]->push(
        RespondJob{batch.micro_batch, part.epoch, part.sequence, answer_rows[i], after != nullptr,
                   compute_start_ns, compute_end});
  }
}

// The doorbell thread's turn: complete batches are held for their micro-batch's stream (its flag
// raised), each ring of a respond doorbell answers the batch held; once the job is over for this F
// every flag is raised at once, so no stream waits forever.
Turn FfnEngine::State::serve_doorbells() {
  bool worked = false;
  std::string& over = device_over;
  // The engine's mutex only when a batch is ready, or every 256th turn for the job's end: a
  // spinning thread that took it every turn would hold up the comm thread and the senders.
  if (news.load(std::memory_order_acquire) || ++turns_since_look >= 256) {
    turns_since_look = 0;
    std::lock_guard lock(mutex);
    for (auto batch = ready_batches.begin(); batch != ready_batches.end();) {
      auto& held = device_held[static_cast<size_t>(batch->micro_batch)];
      if (held) {  // a partial batch went out (the gather window): this one waits for its answer
        ++batch;
        continue;
      }
      held = std::move(*batch);
      batch = ready_batches.erase(batch);
      held_batches.fetch_add(1, std::memory_order_relaxed);
      batch_flags->store(held->micro_batch, 1);
      device_log.completed();
      worked = true;
    }
    news.store(!ready_batches.empty() || failure.has(), std::memory_order_relaxed);
    if (over.empty()) {  // once over, for good
      if (failure.has())
        over = failure.reason();
      else if (closed)
        over = fmt::format("ffn {} was finished", spec.rank);
      else if (gone == spec.attention)
        over = fmt::format("ffn {}: every attention instance left or was lost{}", spec.rank,
                           lost.empty() ? "" : " (last: " + lost.back() + ")");
    }
  }
  for (int mb = 0; mb < spec.micro_batches; ++mb) {
    if (respond_doorbells->load(mb) == 0) continue;
    respond_doorbells->store(mb, 0);
    worked = true;
    std::optional<Batch> batch;
    {
      std::lock_guard lock(mutex);
      batch.swap(device_held[static_cast<size_t>(mb)]);
    }
    if (batch) held_batches.fetch_sub(1, std::memory_order_relaxed);
    try {
      if (!batch)
        throw Error(
            HM_ERR_INVALID_ARGUMENT,
            over.empty() ? std::string("its respond doorbell rang with no batch held") : over);
      respond_batch(*batch, nullptr, 0);
      device_log.rung();
    } catch (const std::exception& e) {
      device_log.ring_failed(fmt::format("micro-batch {}: not answered: {}", mb, e.what()));
    }
  }
  if (!over.empty()) {
    device_log.ended(over);
    for (int mb = 0; mb < spec.micro_batches; ++mb)
      if (batch_flags->load(mb) == 0) batch_flags->store(mb, 1);
  }
  // A batch held: its stream rings the answer once it has computed it.
  return worked                                             ? Turn::worked
         : held_batches.load(std::memory_order_relaxed) > 0 ? Turn::expecting
                                                            : Turn::idle;
}

void FfnEngine::serve_device() {
  State& s = *state_;
  if (!s.batch_flags)
    throw Error(HM_ERR_NOT_SUPPORTED,
                fmt::format("serve_device: {} has no stream memory operations (get_batch and "
                            "respond on the host)",
                            s.device.selector()));
  if (s.spec.gather != Gather::all)
    throw Error(HM_ERR_INVALID_ARGUMENT,
                "serve_device: gather = \"eager\" hands out a micro-batch in parts; the device "
                "waits for whole batches (gather = \"all\")");
  std::lock_guard lock(s.mutex);
  s.failure.throw_if_set();
  if (s.closed)
    throw Error(kStatusClosed, fmt::format("ffn {}: serve_device after finish()", s.spec.rank));
  if (s.host_batches)
    throw Error(HM_ERR_INVALID_ARGUMENT,
                "serve_device: get_batch has handed out batches already: the device serves an F "
                "from its start");
  if (s.device_mode) return;
  s.device_mode = true;
  s.doorbell_thread = std::make_unique<DoorbellThread>(
      "hm-doorbells", sender_cpu(s.spec.comm_cpus, static_cast<size_t>(s.spec.attention)),
      [&s] { return s.serve_doorbells(); });
}

void FfnEngine::enqueue_wait_batch(int mb, const Stream& stream) {
  State& s = *state_;
  check_trigger_stream(s.device, s.batch_flags.has_value(), stream, "enqueue_wait_batch");
  check_micro_batch(mb, s.spec.micro_batches, "enqueue_wait_batch");
  enqueue_flag_wait(stream, *s.batch_flags, mb);
}

void FfnEngine::enqueue_respond(int mb, const Stream& stream) {
  State& s = *state_;
  check_trigger_stream(s.device, s.respond_doorbells.has_value(), stream, "enqueue_respond");
  check_micro_batch(mb, s.spec.micro_batches, "enqueue_respond");
  stream.write_value32(s.respond_doorbells->at(mb), 1);
}

const void* FfnEngine::batch_flag(int mb) const {
  const State& s = *state_;
  if (!s.batch_flags || mb < 0 || mb >= s.spec.micro_batches) return nullptr;
  return s.batch_flags->at(mb);
}

void* FfnEngine::respond_doorbell(int mb) const {
  const State& s = *state_;
  if (!s.respond_doorbells || mb < 0 || mb >= s.spec.micro_batches) return nullptr;
  return s.respond_doorbells->at(mb);
}

DeviceTrips FfnEngine::device_trips() {
  return state_->device_log.take();
}

void* FfnEngine::inputs(int mb, int tensor) const {
  const EngineSpec& spec = state_->spec;
  if (mb < 0 || mb >= spec.micro_batches || tensor < 0 || tensor >= spec.a2f_tensors())
    return nullptr;
  return state_->input_rows(mb, tensor, 0, 0);
}

void* FfnEngine::outputs(int mb) const {
  if (mb < 0 || mb >= state_->spec.micro_batches) return nullptr;
  return state_->output_rows(mb, 0);
}

void FfnEngine::receive_into(int mb, int tensor, void* data, uint64_t bytes) {
  State& s = *state_;
  const EngineSpec& spec = s.spec;
  if (mb < 0 || mb >= spec.micro_batches || tensor < 0 || tensor >= spec.a2f_tensors() ||
      spec.a2f_row_bytes(tensor) == 0)
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("receive_into: micro-batch {} tensor {}: the job has micro-batches "
                            "0..{} and {} A2F tensors{}",
                            mb, tensor, spec.micro_batches - 1, spec.a2f_tensors(),
                            spec.top_k == 0 ? " (no routing: top_k is 0)" : ""));
  const uint64_t need = spec.ffn_rows(spec.rank) * spec.a2f_row_bytes(tensor);
  if (data != nullptr && bytes < need)
    throw Error(
        HM_ERR_INVALID_ARGUMENT,
        fmt::format("receive_into: a buffer of {} bytes for the {} of micro-batch {}: it "
                    "holds this F's whole row space, {} rows ({} As x {} tokens) of {} "
                    "bytes, {} bytes",
                    bytes, spec.a2f_tensor_name(tensor), mb, spec.ffn_rows(spec.rank),
                    spec.attention_of(spec.rank), spec.tokens, spec.a2f_row_bytes(tensor), need));
  CallerBuffers::Found found = data
                                   ? s.caller->find_or_register(data, need, "receive_into's buffer")
                                   : CallerBuffers::Found{};
  std::lock_guard lock(s.mutex);
  s.failure.throw_if_set();
  if (s.closed)
    throw Error(kStatusClosed, fmt::format("ffn {}: receive_into after finish()", spec.rank));
  auto& layouts = s.layouts[static_cast<size_t>(mb)];
  uint32_t& current = s.current_layout[static_cast<size_t>(mb)];
  ReceiveLayout next = current == 0 ? ReceiveLayout{} : layouts[current - 1];
  next.found[static_cast<size_t>(tensor)] = found;
  next.data[static_cast<size_t>(tensor)] = static_cast<uint8_t*>(data);
  // A layout it had before keeps its number (a framework that swaps two buffers uses two).
  auto same = std::find_if(layouts.begin(), layouts.end(),
                           [&](const ReceiveLayout& l) { return l.data == next.data; });
  const bool engine_own =
      std::all_of(next.data.begin(), next.data.end(), [](uint8_t* d) { return d == nullptr; });
  uint32_t id = engine_own ? 0 : static_cast<uint32_t>(same - layouts.begin()) + 1;
  if (!engine_own && same == layouts.end()) {
    if (layouts.size() == State::kMaxLayouts)
      throw Error(HM_ERR_INVALID_ARGUMENT,
                  fmt::format("receive_into: micro-batch {} had {} layouts of receive buffers "
                              "already, the most it keeps: receive buffers are set up once",
                              mb, State::kMaxLayouts));
    layouts.push_back(next);
  }
  if (id == current) return;
  const uint32_t before = current;
  current = id;
  // Every A this F serves hears of it, in order with this F's answers to it: all of them, or,
  // where one's queue of messages has no room, none (the layout stays as it was).
  auto hears = [&](int a) {
    const Peer& peer = s.peers->at(a);
    return spec.sends(a, spec.rank) && !peer.lost && !peer.left;
  };
  for (int a = 0; a < spec.attention; ++a)
    if (hears(a) && s.side_band.room_locked(a) < s.announcement_frames_locked(a, mb)) {
      current = before;
      throw Error(HM_ERR_INVALID_ARGUMENT,
                  fmt::format("receive_into: {} has {} messages queued behind answers not "
                              "posted yet; no A was told of the new buffer: call it again once "
                              "those answers are out",
                              peer_name(Role::attention, a),
                              SideBand::kMaxQueued - s.side_band.room_locked(a)));
    }
  for (int a = 0; a < spec.attention; ++a)
    if (hears(a)) s.announce_locked(a, mb);
}

RegisteredBuffer FfnEngine::register_buffer(const void* data, uint64_t bytes) {
  const CallerBuffers::Found found =
      state_->caller->find_or_register(data, bytes, "register_buffer's buffer");
  return {static_cast<const uint8_t*>(data) - found.offset, found.size, found.fresh};
}

DataCounters FfnEngine::counters() const {
  return state_->moved.read(&*state_->caller);
}

std::vector<std::pair<std::string, uint64_t>> FfnEngine::registered() const {
  const State& s = *state_;
  return {{"a2f_receive", s.a2f_receive.size()},
          {"a2f_headers", s.a2f_headers.size()},
          {"f2a_send", s.f2a_send.size()},
          {"f2a_headers", s.f2a_headers.size()}};
}

std::string FfnEngine::metrics_text() const {
  return state_->metrics.render();
}

std::string FfnEngine::metrics_address() const {
  return state_->metrics.address();
}

}  // namespace hetmesh::afd
