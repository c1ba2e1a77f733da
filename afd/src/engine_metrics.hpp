// What an engine tells Prometheus (core/metrics.hpp, shared design §14): its series, made once
// when it connects, so that the engine's threads only add to atomics; the values an engine reads
// rather than counts (its peers' states, its memory) are read at each scrape. Served on
// EngineSpec::metrics_listen, or nowhere; counted either way (a scrape is the only reader).
//
// Every series carries the instance's job (hetmesh_job: `job` is Prometheus' own), role, rank
// and host; per peer, the peer ("ffn 1") and
// the transport. Times are in seconds, from the engine's timestamps (RoundTrip): differences on
// one clock, except the one-way times, which subtract a peer's stamp from this side's and are
// only exported where both ends read one clock (the ipc transport: one host).
#pragma once

#include <hetmesh/afd/engine.hpp>
#include <hetmesh/core/metrics.hpp>
#include <hetmesh/core/metrics_server.hpp>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace hetmesh::afd {

class EngineMetrics {
 public:
  EngineMetrics(const EngineSpec& spec, const Device& device);
  ~EngineMetrics();

  // The peers' series, once the engine's transport is made (before any other call below).
  void connect(TransportKind transport);

  // A part or an answer of `bytes` (payload and header) to or from peer `rank`.
  void sent(int peer, uint64_t bytes);
  void received(int peer, uint64_t bytes);
  // An error of the engine (hm_status), a round trip failed, a wait that timed out.
  void error(hm_status status);
  // A peer's incarnation lost, or a replacement in.
  void peer_lost(int peer);
  void peer_joined(int peer);

  // The attention side: a round trip every F answered.
  void round_trip(const RoundTrip& trip);
  // The FFN side: a batch handed out at `ready`, its first part received at `first`; a part of
  // A `peer` received `lag` ns after the batch's first; a batch that went out without an A because
  // the gather window ended; an answer posted `ns` after its batch was ready.
  void batch(int64_t first, int64_t ready, bool overdue);
  void part_lag(int peer, int64_t lag);
  void answered(int64_t ns);

  // What the engine reads for a scrape.
  struct Reading {
    std::vector<PeerStatus> peers;
    uint64_t stale_events = 0;
    std::vector<std::pair<std::string, uint64_t>> registered;
    DataCounters counters;
    uint64_t epoch = 0;
  };
  // Serves the metrics on spec.metrics_listen (its port plus this instance's index in the job, As
  // first; port 0: any free one) with the job's secret, if an address is set: before the engine
  // joins, so a bad address fails at once. Throws as metrics::Server does.
  void serve(const JobSecret* secret);
  // From now on each scrape reads the engine through `read` (once the engine has joined).
  void read_with(std::function<Reading()> read);
  // Stops serving: before the engine's state that `read` reads goes.
  void stop();
  // Where it serves ("127.0.0.1:9401"); empty when it does not.
  std::string address() const;
  // The exposition as a scrape gets it.
  std::string render() { return registry_.render(); }

 private:
  struct Peer {
    metrics::Counter *sent_bytes, *received_bytes, *sent_messages, *received_messages;
    metrics::Counter *lost, *joined;
    metrics::Histogram *network, *service, *answer_lag, *one_way_out, *one_way_back, *part_lag;
  };
  metrics::Counter& error_counter(hm_status status);

  const EngineSpec& spec_;
  std::string plugin_, device_;
  metrics::Registry registry_;
  std::vector<Peer> peers_;  // [rank of the other role]
  bool one_clock_ = false;
  metrics::Histogram *round_trip_ = nullptr, *gather_wait_ = nullptr, *answer_ = nullptr;
  metrics::Counter* gather_window_expired_ = nullptr;
  std::function<Reading()> read_;
  std::unique_ptr<metrics::Server> server_;
};

// What a scrape reads of an engine (AttentionEngine or FfnEngine).
template <typename Engine>
EngineMetrics::Reading metrics_reading(const Engine& engine) {
  return {engine.peers(), engine.peer_history().stale_events, engine.registered(),
          engine.counters(), engine.epoch()};
}

}  // namespace hetmesh::afd
