// An engine's Prometheus series (engine_metrics.hpp).
#include "engine_metrics.hpp"

#include "peer.hpp"

#include <hetmesh/core/error.hpp>
#include <hetmesh/core/log.hpp>
#include <hetmesh/core/socket.hpp>

#include <unistd.h>

#include <algorithm>
#include <climits>

namespace hetmesh::afd {

namespace {

std::string host_name() {
  char name[HOST_NAME_MAX + 1] = {};
  return ::gethostname(name, sizeof name) == 0 ? name : "?";
}

// "peer_lost", "timeout": the status's name as a label value.
std::string status_label(hm_status status) {
  std::string name = status_name(status);
  if (name.starts_with("HM_ERR_")) name = name.substr(7);
  std::transform(name.begin(), name.end(), name.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return name;
}

// A counter the engine keeps elsewhere, brought up to its value at a scrape (only the scrape,
// one at a time, adds to it).
void count_up(metrics::Counter& counter, uint64_t value) {
  if (value > counter.value()) counter.add(value - counter.value());
}

int64_t difference(int64_t later, int64_t earlier) {
  return later != 0 && earlier != 0 ? later - earlier : -1;  // -1: a stamp is missing
}

}  // namespace

EngineMetrics::EngineMetrics(const EngineSpec& spec, const Device& device)
    : spec_(spec),
      plugin_(device.plugin().name()),
      device_(fmt::format("{}:{}", device.plugin().name(), device.index())),
      registry_(metrics::Labels{{"hetmesh_job", spec.job},
                                {"role", to_string(spec.role)},
                                {"rank", std::to_string(spec.rank)},
                                {"host", host_name()}}) {}

EngineMetrics::~EngineMetrics() {
  stop();
}

void EngineMetrics::connect(TransportKind transport) {
  const bool attention = spec_.role == Role::attention;
  const Role peer_role = attention ? Role::ffn : Role::attention;
  const int count = attention ? spec_.ffn : spec_.attention;
  one_clock_ = transport == TransportKind::ipc;
  registry_
      .gauge("hetmesh_instance_info", "This instance: its device plugin, device and transport.",
             {{"plugin", plugin_}, {"device", device_}, {"transport", to_string(transport)}})
      .set(1);
  auto& r = registry_;
  for (int rank = 0; rank < count; ++rank) {
    if (attention ? !spec_.sends(spec_.rank, rank) : !spec_.sends(rank, spec_.rank)) {
      peers_.push_back({});
      continue;
    }
    const std::string peer = peer_name(peer_role, rank);
    const metrics::Labels sent = {
        {"peer", peer}, {"direction", "sent"}, {"transport", to_string(transport)}};
    const metrics::Labels received = {
        {"peer", peer}, {"direction", "received"}, {"transport", to_string(transport)}};
    const metrics::Labels of = {{"peer", peer}};
    Peer p{};
    const char* bytes_help = "Bytes of parts and answers (payload and header), per peer.";
    const char* messages_help = "Parts and answers, per peer.";
    p.sent_bytes = &r.counter("hetmesh_bytes_total", bytes_help, sent);
    p.received_bytes = &r.counter("hetmesh_bytes_total", bytes_help, received);
    p.sent_messages = &r.counter("hetmesh_messages_total", messages_help, sent);
    p.received_messages = &r.counter("hetmesh_messages_total", messages_help, received);
    p.lost = &r.counter("hetmesh_peer_losses_total",
                        "Incarnations of a peer lost: dead, hung or replaced.", of);
    p.joined = &r.counter("hetmesh_peer_rejoins_total", "Replacements of a peer that joined.", of);
    if (attention) {
      p.network = &r.histogram(
          "hetmesh_network_seconds",
          "Wire time of a round trip to one F, both ways: A's round trip less the F's time "
          "between receiving and answering (no clock sync needed).",
          of);
      p.service = &r.histogram("hetmesh_ffn_service_seconds",
                               "An F's time from receiving a part to posting its answer.", of);
      p.answer_lag = &r.histogram(
          "hetmesh_answer_lag_seconds",
          "How long after the round trip's first answer this F's arrived: stragglers.", of);
      if (one_clock_) {
        p.one_way_out =
            &r.histogram("hetmesh_one_way_seconds",
                         "From posting to arrival, one way (only where both ends read one clock).",
                         {{"peer", peer}, {"direction", "sent"}});
        p.one_way_back =
            &r.histogram("hetmesh_one_way_seconds",
                         "From posting to arrival, one way (only where both ends read one clock).",
                         {{"peer", peer}, {"direction", "received"}});
      }
    } else {
      p.part_lag = &r.histogram(
          "hetmesh_part_lag_seconds",
          "How long after its batch's first part this A's part arrived: stragglers.", of);
    }
    peers_.push_back(p);
  }
  // At 0 from the start, so a rate over them reads 0 rather than nothing.
  for (const hm_status status : {kStatusPeerLost, hm_status{HM_ERR_TIMEOUT}, kStatusProtocolError})
    error_counter(status);
  if (attention) {
    round_trip_ = &r.histogram("hetmesh_round_trip_seconds",
                               "A round trip, from posting the first part to the last answer.");
  } else {
    gather_wait_ = &r.histogram(
        "hetmesh_gather_wait_seconds",
        "From a batch's first part arriving to the batch handed out (waiting for the other As).");
    answer_ = &r.histogram("hetmesh_answer_seconds",
                           "From a batch handed out to its answer posted (the experts' compute "
                           "and the queue before it).");
    gather_window_expired_ = &r.counter(
        "hetmesh_gather_window_expired_total",
        "Batches handed out without an A whose part had not come within the gather window.");
  }
}

void EngineMetrics::sent(int peer, uint64_t bytes) {
  const Peer& p = peers_[static_cast<size_t>(peer)];
  if (!p.sent_bytes) return;
  p.sent_bytes->add(bytes);
  p.sent_messages->add();
}

void EngineMetrics::received(int peer, uint64_t bytes) {
  const Peer& p = peers_[static_cast<size_t>(peer)];
  if (!p.received_bytes) return;
  p.received_bytes->add(bytes);
  p.received_messages->add();
}

metrics::Counter& EngineMetrics::error_counter(hm_status status) {
  return registry_.counter(
      "hetmesh_errors_total",
      "Errors by status: round trips failed, waits timed out, the engine's own failure.",
      {{"status", status_label(status)}});
}

void EngineMetrics::error(hm_status status) {
  error_counter(status).add();
}

void EngineMetrics::peer_lost(int peer) {
  if (metrics::Counter* c = peers_[static_cast<size_t>(peer)].lost) c->add();
}

void EngineMetrics::peer_joined(int peer) {
  if (metrics::Counter* c = peers_[static_cast<size_t>(peer)].joined) c->add();
}

void EngineMetrics::round_trip(const RoundTrip& trip) {
  round_trip_->observe_ns(trip.completed - trip.posted);
  int64_t first = INT64_MAX;
  for (const RoundTrip::PerFfn& f : trip.ffn)
    if (f.received_at_a != 0) first = std::min(first, f.received_at_a);
  for (size_t f = 0; f < trip.ffn.size(); ++f) {
    const RoundTrip::PerFfn& at = trip.ffn[f];
    const Peer& p = peers_[f];
    if (!p.network || at.received_at_a == 0) continue;  // not sent to, or lost before it answered
    const int64_t service = difference(at.f_posted, at.f_received);
    const int64_t there_and_back = difference(at.received_at_a, at.posted_at_a);
    if (service >= 0 && there_and_back >= 0) {
      p.service->observe_ns(service);
      p.network->observe_ns(there_and_back - service);
    }
    if (spec_.ffn > 1) p.answer_lag->observe_ns(at.received_at_a - first);
    if (p.one_way_out) {
      p.one_way_out->observe_ns(difference(at.f_received, at.posted_at_a));
      p.one_way_back->observe_ns(difference(at.received_at_a, at.f_posted));
    }
  }
}

void EngineMetrics::batch(int64_t first, int64_t ready, bool overdue) {
  gather_wait_->observe_ns(ready - first);
  if (overdue) gather_window_expired_->add();
}

void EngineMetrics::part_lag(int peer, int64_t lag) {
  if (metrics::Histogram* h = peers_[static_cast<size_t>(peer)].part_lag) h->observe_ns(lag);
}

void EngineMetrics::answered(int64_t ns) {
  answer_->observe_ns(ns);
}

void EngineMetrics::read_with(std::function<Reading()> read) {
  read_ = std::move(read);
  registry_.on_scrape([this] {
    try {
      const Reading now = read_();
      auto& r = registry_;
      r.gauge("hetmesh_epoch",
              "This instance's incarnation: 1 for the first, higher for a "
              "replacement.")
          .set(static_cast<double>(now.epoch));
      for (const PeerStatus& peer : now.peers) {
        const metrics::Labels of = {{"peer", peer_name(peer.role, peer.rank)}};
        r.gauge("hetmesh_peer_up", "1 while a peer is in the job, 0 once it left or was lost.", of)
            .set(peer.state == PeerStatus::State::live ? 1 : 0);
        r.gauge("hetmesh_peer_epoch", "The incarnation of a peer this instance reached.", of)
            .set(static_cast<double>(peer.epoch));
      }
      count_up(r.counter("hetmesh_stale_events_total", "Events of replaced incarnations, dropped."),
               now.stale_events);
      for (const auto& [region, bytes] : now.registered)
        r.gauge("hetmesh_registered_bytes", "Memory the engine allocated and registered.",
                {{"region", region}, {"plugin", plugin_}})
            .set(static_cast<double>(bytes));
      r.gauge("hetmesh_caller_buffers",
              "The application's allocations registered (its tensors used in place).")
          .set(static_cast<double>(now.counters.caller_buffers));
      const char* moved = "Payload bytes sent from or received into memory, by whose it was.";
      count_up(r.counter("hetmesh_moved_bytes_total", moved, {{"memory", "application"}}),
               now.counters.caller_bytes);
      count_up(r.counter("hetmesh_moved_bytes_total", moved, {{"memory", "engine"}}),
               now.counters.slot_bytes);
      count_up(r.counter("hetmesh_staged_bytes_total",
                         "Of those, bytes copied through host staging buffers (memory the "
                         "transport could not reach)."),
               now.counters.staged_bytes);
    } catch (const std::exception& e) {
      log(LogLevel::warn, "{}'s metrics: reading the engine failed: {}",
          peer_name(spec_.role, spec_.rank), e.what());
    }
  });
}

void EngineMetrics::serve(const JobSecret* secret) {
  if (spec_.metrics_listen.empty()) return;
  // One port per instance: its index in the job (As, then Fs) past the configured one.
  std::optional<net::HostPort> listen = net::parse_host_port(spec_.metrics_listen);
  if (!listen)
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("[metrics] listen '{}' is not host:port", spec_.metrics_listen));
  const int index = spec_.metrics_index >= 0        ? spec_.metrics_index
                    : spec_.role == Role::attention ? spec_.rank
                                                    : spec_.attention + spec_.rank;
  if (listen->port != 0) {
    if (listen->port + index > 65535)
      throw Error(HM_ERR_INVALID_ARGUMENT,
                  fmt::format("[metrics] listen '{}': instance {} would serve on port {}",
                              spec_.metrics_listen, index, listen->port + index));
    listen->port = static_cast<uint16_t>(listen->port + index);
  }
  server_ = std::make_unique<metrics::Server>(
      registry_, net::join_host_port(listen->host, listen->port), secret,
      fmt::format("{}'s metrics", peer_name(spec_.role, spec_.rank)));
}

void EngineMetrics::stop() {
  server_.reset();
}

std::string EngineMetrics::address() const {
  return server_ ? server_->address() : "";
}

}  // namespace hetmesh::afd
