// The transport's own figures: one-way latency (half an echoed write's round trip) and the
// bandwidth of a stream of writes.
#include "bench_transport.hpp"

#include <hetmesh/core/percentile.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <utility>

namespace hetmesh::cli::transport_bench {
namespace {

// Waits for events until `done` says so, handing it every event of each poll (a write_done left
// unseen would shrink the bandwidth window); throws on peer loss, failed writes or timeout.
template <typename Done>
void pump(Transport& transport, std::vector<TransportEvent>& events, Done done) {
  std::optional<Clock::time_point> deadline;  // read the clock only once a poll comes back empty
  for (;;) {
    events.clear();
    transport.poll(events, std::chrono::milliseconds(50));
    bool finished = false;
    for (const auto& e : events) {
      if (e.type == TransportEvent::Type::peer_lost)
        throw Error(kStatusPeerLost, "benchmark peer lost: " + e.message);
      if (e.type == TransportEvent::Type::write_done && e.status != HM_OK)
        throw Error(e.status, "benchmark write failed: " + e.message);
      finished = done(e) || finished;
    }
    if (finished) return;
    if (!events.empty()) continue;
    if (!deadline) deadline = Clock::now() + kWait;
    if (Clock::now() > *deadline) throw Error(HM_ERR_TIMEOUT, "benchmark peer stopped answering");
  }
}

}  // namespace

// Latency: a write with notification, echoed back by the peer; half the round trip.
void measure_latency(Row& row, End& end, Connection& connection, const RemoteRegion& target,
                     int iterations, std::vector<TransportEvent>& events) {
  std::vector<double> one_way_us;
  uint32_t tag = kLatencyTag | static_cast<uint32_t>(row.size);
  for (int i = 0; i < iterations + 10; ++i) {
    auto t0 = Clock::now();
    connection.write(*end.region, 0, target, 0, row.size, tag, 0);
    pump(*end.transport, events, [&](const TransportEvent& e) {
      return e.type == TransportEvent::Type::notification && e.value == tag;
    });
    auto t1 = Clock::now();
    if (i >= 10)
      one_way_us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / 2);
  }
  row.latency_p50_us = percentile(one_way_us, 0.5);
  row.latency_p99_us = percentile(one_way_us, 0.99);
  row.latency_us = std::move(one_way_us);
}

// Bandwidth: a stream of writes, at most `window` unfinished, every `notify_every`-th (and the
// last) with a notification, then the peer's count of the notified ones.
void measure_bandwidth(Row& row, End& end, Connection& connection, const RemoteRegion& target,
                       const BenchOptions& o, std::vector<TransportEvent>& events) {
  const uint64_t size = row.size;
  int count = static_cast<int>(std::clamp<uint64_t>((256ull << 20) / size, 64, 4 * o.iterations));
  int in_flight = 0;
  uint32_t notified = 0;
  auto t0 = Clock::now();
  for (int i = 0; i < count; ++i) {
    while (in_flight >= o.window)
      pump(*end.transport, events, [&](const TransportEvent& e) {
        if (e.type == TransportEvent::Type::write_done) --in_flight;
        return in_flight < o.window;
      });
    std::optional<uint32_t> notify;
    if ((i + 1) % o.notify_every == 0 || i + 1 == count)
      notify = kBandwidthTag | (notified++ & kCountMask);
    // Another write follows at once while the window has room: the transport may deliver the
    // run's notifications together (`more`, as FI_MORE).
    const bool more = in_flight + 1 < o.window && i + 1 < count;
    connection.write(*end.region, 0, target, 0, size, notify, 0, more);
    ++in_flight;
  }
  send_text(connection, fmt::format("count {}", notified));
  std::string counted;
  pump(*end.transport, events, [&](const TransportEvent& e) {
    if (e.type == TransportEvent::Type::control) counted.assign(e.payload.begin(), e.payload.end());
    return !counted.empty();
  });
  auto t1 = Clock::now();
  if (counted != std::to_string(notified))
    throw Error(kStatusProtocolError,
                fmt::format("peer counted {} notified writes of {} bytes, {} were sent", counted,
                            size, notified));
  row.bandwidth_gbps =
      static_cast<double>(size) * count / std::chrono::duration<double, std::nano>(t1 - t0).count();
  row.count = count;
}

}  // namespace hetmesh::cli::transport_bench
