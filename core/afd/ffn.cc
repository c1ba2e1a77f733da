// The FFN side of the AFD engine.
#include "engine_common.hpp"

#include <hetmesh/log.hpp>

namespace hetmesh::afd {

namespace {

// What arrived in one (A, micro-batch) slot.
struct Arrival {
  uint64_t sequence = 0;    // last sequence seen in this slot
  bool waiting = false;     // arrived, not yet handed out by get_batch
  bool responding = false;  // handed out, not yet answered (the slot's credit is taken)
  uint32_t tokens = 0;
  int64_t received = 0;
  int64_t batch_ready = 0;
};

struct RespondTask {
  Batch batch;
  const Event* ready;
  int64_t compute_start;
  int64_t compute_end;
};

}  // namespace

struct FfnEngine::State {
  EngineSpec spec;
  Device device;
  std::unique_ptr<Transport> transport;
  Buffer a2f_receive;     // [a][mb] tokens then routing
  HostSlots a2f_headers;  // [a][mb]
  Buffer f2a_send;        // [a][mb] outputs
  HostSlots f2a_headers;  // [a][mb]
  PublishedRegions mine;
  std::shared_ptr<Region> f2a_send_region, f2a_header_region;
  std::vector<Peer> attention;
  std::map<ConnectionId, int> attention_of_connection;

  std::mutex mutex;
  std::condition_variable changed;
  std::vector<Arrival> arrivals;  // [a][mb]
  std::deque<Batch> ready_batches;
  std::deque<RespondTask> to_respond;
  int left = 0;
  std::string failure;
  std::vector<TransportEvent> events;
  std::unique_ptr<CommThread> comm;

  State(const EngineSpec& s, const Device& d)
      : spec(s),
        device(d),
        a2f_receive(d.allocate(s.a2f_slot_bytes() * s.attention * s.micro_batches)),
        a2f_headers(d, sizeof(WireHeader) * s.attention * s.micro_batches),
        f2a_send(d.allocate(s.f2a_slot_bytes() * s.attention * s.micro_batches)),
        f2a_headers(d, sizeof(WireHeader) * s.attention * s.micro_batches),
        arrivals(static_cast<size_t>(s.attention * s.micro_batches)) {}

  size_t slot(int a, int mb) const { return static_cast<size_t>(a * spec.micro_batches + mb); }
  uint64_t routing_offset() const { return uint64_t{spec.tokens} * spec.hidden * spec.a2f_bytes; }

  Batch::FromAttention part(int a, int mb) {
    const Arrival& arrival = arrivals[slot(a, mb)];
    auto* in = static_cast<uint8_t*>(a2f_receive.data()) + slot(a, mb) * spec.a2f_slot_bytes();
    auto* out = static_cast<uint8_t*>(f2a_send.data()) + slot(a, mb) * spec.f2a_slot_bytes();
    return {a, arrival.sequence, arrival.tokens, in, in + routing_offset(), out};
  }

  void fail(const std::string& reason) {
    {
      std::lock_guard lock(mutex);
      if (failure.empty()) failure = reason;
    }
    log(LogLevel::error, "ffn {}: {}", spec.rank, reason);
    changed.notify_all();
  }

  // Hands out complete micro-batches (gather all) or single parts (eager). Caller holds mutex.
  void release_batches(int mb) {
    int64_t now = now_ns();
    if (spec.gather == Gather::eager) {
      for (int a = 0; a < spec.attention; ++a) {
        Arrival& arrival = arrivals[slot(a, mb)];
        if (!arrival.waiting) continue;
        arrival.waiting = false;
        arrival.responding = true;
        arrival.batch_ready = now;
        ready_batches.push_back(Batch{mb, {part(a, mb)}, now});
      }
      return;
    }
    for (int a = 0; a < spec.attention; ++a)
      if (!arrivals[slot(a, mb)].waiting) return;
    Batch batch{mb, {}, now};
    for (int a = 0; a < spec.attention; ++a) {
      Arrival& arrival = arrivals[slot(a, mb)];
      arrival.waiting = false;
      arrival.responding = true;
      arrival.batch_ready = now;
      batch.parts.push_back(part(a, mb));
    }
    ready_batches.push_back(std::move(batch));
  }

  void on_request(const TransportEvent& e) {
    int a = attention_of_connection.at(e.connection);
    std::string from = peer_name(Role::attention, a);
    check_slot(e.value, static_cast<uint32_t>(spec.attention * spec.micro_batches), from);
    int mb = static_cast<int>(e.value) % spec.micro_batches;
    if (static_cast<int>(e.value) / spec.micro_batches != a)
      throw Error(kStatusProtocolError,
                  fmt::format("{} notified slot {}, which belongs to attention {}", from, e.value,
                              static_cast<int>(e.value) / spec.micro_batches));
    WireHeader h = reinterpret_cast<const WireHeader*>(a2f_headers.data())[slot(a, mb)];
    SlotLimits limits{MessageKind::a2f,
                      static_cast<uint32_t>(spec.attention),
                      static_cast<uint32_t>(spec.micro_batches),
                      spec.tokens,
                      spec.hidden,
                      spec.top_k,
                      spec.a2f_slot_bytes(),
                      uint64_t{spec.hidden} * spec.a2f_bytes + spec.routing_bytes_per_token()};
    validate(h, limits, static_cast<uint32_t>(a), static_cast<uint32_t>(mb), from.c_str());
    std::lock_guard lock(mutex);
    Arrival& arrival = arrivals[slot(a, mb)];
    if (arrival.waiting || arrival.responding || h.sequence != arrival.sequence + 1)
      throw Error(kStatusProtocolError,
                  fmt::format("{} sent micro-batch {} sequence {}, but its slot {} (last sequence "
                              "{})",
                              from, mb, h.sequence,
                              arrival.waiting || arrival.responding ? "is still in use"
                                                                    : "expects the next one",
                              arrival.sequence));
    arrival.sequence = h.sequence;
    arrival.tokens = h.tokens;
    arrival.received = now_ns();
    arrival.waiting = true;
    release_batches(mb);
    changed.notify_all();
  }

  void respond_now(const RespondTask& task) {
    int mb = task.batch.micro_batch;
    for (const auto& part : task.batch.parts) {
      size_t s = slot(part.rank, mb);
      WireHeader* h = reinterpret_cast<WireHeader*>(f2a_headers.data()) + s;
      const Arrival& arrival = arrivals[s];
      *h = WireHeader{};
      h->magic = kWireMagic;
      h->version = kWireVersion;
      h->kind = static_cast<uint16_t>(MessageKind::f2a);
      h->source = static_cast<uint32_t>(spec.rank);
      h->micro_batch = static_cast<uint32_t>(mb);
      h->sequence = part.sequence;
      h->tokens = part.tokens;
      h->hidden = spec.hidden;
      h->top_k = spec.top_k;
      h->payload_bytes = uint64_t{part.tokens} * spec.hidden * spec.f2a_bytes;
      h->stamps[kReceived] = static_cast<uint64_t>(arrival.received);
      h->stamps[kBatchReady] = static_cast<uint64_t>(arrival.batch_ready);
      h->stamps[kComputeStart] = static_cast<uint64_t>(task.compute_start);
      h->stamps[kComputeEnd] = static_cast<uint64_t>(task.compute_end);
      h->stamps[kPosted] = static_cast<uint64_t>(now_ns());
      Peer& a = attention[static_cast<size_t>(part.rank)];
      // A's slot for (mb, this F).
      uint64_t remote_slot = static_cast<uint64_t>(mb * spec.ffn + spec.rank);
      try {
        a.connection->write(*f2a_send_region, s * spec.f2a_slot_bytes(),
                            *a.regions.at("f2a_payload"), remote_slot * spec.f2a_slot_bytes(),
                            h->payload_bytes, std::nullopt, 0);
        a.connection->write(*f2a_header_region, s * sizeof(WireHeader),
                            *a.regions.at("f2a_headers"), remote_slot * sizeof(WireHeader),
                            sizeof(WireHeader), static_cast<uint32_t>(remote_slot), 0);
      } catch (const Error& e) {
        rethrow_for_peer(e, Role::attention, part.rank);
      }
    }
    std::lock_guard lock(mutex);
    for (const auto& part : task.batch.parts)
      arrivals[slot(part.rank, mb)].responding = false;
  }

  void step() {
    try {
      for (;;) {
        std::unique_lock lock(mutex);
        if (to_respond.empty() ||
            (to_respond.front().ready != nullptr && !to_respond.front().ready->ready()))
          break;
        RespondTask task = std::move(to_respond.front());
        to_respond.pop_front();
        lock.unlock();
        respond_now(task);
      }
      events.clear();
      transport->poll(events, std::chrono::microseconds(200));
      for (const auto& e : events) {
        switch (e.type) {
          case TransportEvent::Type::notification:
            on_request(e);
            break;
          case TransportEvent::Type::write_done:
            if (e.status != HM_OK) throw Error(e.status, "a write failed: " + e.message);
            break;
          case TransportEvent::Type::control: {
            std::string text(e.payload.begin(), e.payload.end());
            if (text == "leave") {
              std::lock_guard lock(mutex);
              Peer& a = attention[static_cast<size_t>(attention_of_connection.at(e.connection))];
              if (!a.left) ++left;
              a.left = true;
              changed.notify_all();
            }
            break;
          }
          case TransportEvent::Type::peer_lost: {
            int a = attention_of_connection.at(e.connection);
            bool clean;
            {
              std::lock_guard lock(mutex);
              clean = attention[static_cast<size_t>(a)].left;
            }
            if (!clean)
              throw Error(kStatusPeerLost,
                          fmt::format("{} lost: {}", peer_name(Role::attention, a), e.message));
            break;
          }
        }
      }
    } catch (const std::exception& e) {
      fail(e.what());
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
};

FfnEngine::FfnEngine(const EngineSpec& spec, const Device& device, KeyValueStore& store)
    : state_(std::make_unique<State>(spec, device)) {
  State& s = *state_;
  s.spec.role = Role::ffn;
  s.transport = Transport::create(spec.transport);
  s.mine.regions["a2f_payload"] =
      s.transport->register_memory(device, s.a2f_receive.data(), s.a2f_receive.size());
  s.mine.regions["a2f_headers"] =
      s.transport->register_memory(device, s.a2f_headers.data(), s.a2f_headers.size());
  s.f2a_send_region = s.transport->register_memory(device, s.f2a_send.data(), s.f2a_send.size());
  s.f2a_header_region =
      s.transport->register_memory(device, s.f2a_headers.data(), s.f2a_headers.size());
  s.attention = join(s.spec, *s.transport, s.mine, store, Role::attention, spec.attention);
  for (const Peer& a : s.attention)
    s.attention_of_connection[a.connection->id()] = a.rank;
  s.comm = std::make_unique<CommThread>(spec.comm_cpus, [&s] { s.step(); });
  log(LogLevel::info, "ffn {}: connected to {} attention instance(s) over {}", spec.rank,
      spec.attention, to_string(s.transport->kind()));
}

FfnEngine::~FfnEngine() {
  state_->comm->stop();
}

const EngineSpec& FfnEngine::spec() const {
  return state_->spec;
}

std::optional<Batch> FfnEngine::get_batch(std::chrono::milliseconds timeout) {
  State& s = *state_;
  std::unique_lock lock(s.mutex);
  bool done = s.changed.wait_for(lock, timeout, [&] {
    return !s.ready_batches.empty() || !s.failure.empty() || s.left == s.spec.attention;
  });
  if (!s.failure.empty()) throw Error(kStatusPeerLost, s.failure);
  if (!s.ready_batches.empty()) {
    Batch batch = std::move(s.ready_batches.front());
    s.ready_batches.pop_front();
    return batch;
  }
  if (s.left == s.spec.attention) return std::nullopt;
  if (!done) {
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
  return std::nullopt;
}

void FfnEngine::respond(const Batch& batch, const Event* ready, int64_t compute_start_ns) {
  State& s = *state_;
  std::lock_guard lock(s.mutex);
  if (!s.failure.empty()) throw Error(kStatusPeerLost, s.failure);
  s.to_respond.push_back(RespondTask{batch, ready, compute_start_ns, now_ns()});
}

std::vector<std::pair<std::string, uint64_t>> FfnEngine::registered() const {
  const State& s = *state_;
  return {{"a2f_receive", s.a2f_receive.size()},
          {"a2f_headers", s.a2f_headers.size()},
          {"f2a_send", s.f2a_send.size()},
          {"f2a_headers", s.f2a_headers.size()}};
}

}  // namespace hetmesh::afd
