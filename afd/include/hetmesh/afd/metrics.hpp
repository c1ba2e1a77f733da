// Metrics of AFD round trips, derived from the engine's timestamps, and export as a text summary
// and as a Chrome trace (opens in Perfetto or chrome://tracing).
//
// Differences are taken on one host's clock wherever possible. The skew-free network cost is
//   (A result received - A request posted) - (F response posted - F request received),
// two differences each on a single host, so it needs no clock sync. Metrics that subtract an A
// timestamp from an F timestamp (the one-way A2F and F2A times) are only meaningful when A and F
// share a clock (one host); the summary marks them so.
#pragma once

#include <hetmesh/afd/engine.hpp>

#include <map>
#include <string>
#include <vector>

// Exported from the library, which hides every other symbol (core/README.md, "Exports").
#pragma GCC visibility push(default)

namespace hetmesh::afd {

// A distribution's summary; p50 and p99 by core's one percentile rule
// (hetmesh/core/percentile.hpp).
struct Percentiles {
  size_t count = 0;
  double p50 = 0, p99 = 0, mean = 0, max = 0;  // microseconds
  double jitter() const { return p50 > 0 ? p99 / p50 : 0; }
};
Percentiles percentiles(std::vector<double> microseconds);

// One A instance's round trips.
struct AttentionTrace {
  int rank = 0;
  std::vector<RoundTrip> trips;
};

// What one instance saw of its peers (its engine's peer_history()): marked in the Chrome trace on
// that instance's process, and listed by format_metrics.
struct InstanceHistory {
  Role role = Role::attention;
  int rank = 0;
  PeerHistory history;
};
// As JSON text and back; throws Error(INVALID_ARGUMENT) on malformed input.
std::string history_to_json(const InstanceHistory& history);
InstanceHistory history_from_json(const std::string& text);
// One line per change, in time order, with times from `origin_ns` (0: from the first change):
// "ffn 0 at +12.3 ms: attention 1 lost: <why> (epoch 1)", "ffn 0 at +40.2 ms: attention 1 joined
// (epoch 2)", then one per instance that dropped a superseded incarnation's events.
std::vector<std::string> describe_histories(const std::vector<InstanceHistory>& histories,
                                            int64_t origin_ns);

struct Metrics {
  // name -> distribution; names are listed in metric_names().
  std::map<std::string, Percentiles> values;
  // Per F: how much later than the first F its results arrived, on average and p99 (us).
  std::map<int, Percentiles> straggle;
  std::vector<std::string> stragglers;  // "ffn 1 answers 35.2 us after the first (p50)"
  bool same_host_clock = true;
  std::vector<std::string> peer_changes;  // describe_histories(), when the caller has them
};

const std::vector<std::string>& metric_names();
Metrics compute_metrics(const std::vector<AttentionTrace>& traces, bool same_host_clock,
                        double straggler_factor = 1.5);
std::string format_metrics(const Metrics& metrics);

// An AttentionTrace as JSON text and back (for collecting traces from other processes). Throws
// Error(INVALID_ARGUMENT) on malformed input.
std::string trace_to_json(const AttentionTrace& trace);
AttentionTrace trace_from_json(const std::string& text);

// Writes every round trip as Chrome trace JSON (opens in Perfetto): a process per A instance (pid
// = its rank) and per F instance (pid = kFfnPidBase + rank), a track per (A, micro-batch) in each,
// and one complete event ("ph": "X", ts and dur in microseconds) per phase, named as in
// trace_slice_names(), in time order; each peer change in `histories` is an instant event ("ph":
// "i") on its instance's process, named "attention 1 lost" or "attention 1 joined", with the
// epoch and the reason. Throws Error if the file cannot be written.
constexpr int kFfnPidBase = 1000;
const std::vector<std::string>& trace_slice_names();
void write_chrome_trace(const std::string& path, const std::vector<AttentionTrace>& traces,
                        const std::vector<InstanceHistory>& histories = {});

}  // namespace hetmesh::afd

#pragma GCC visibility pop
