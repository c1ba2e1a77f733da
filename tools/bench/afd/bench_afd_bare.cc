// `hetmesh bench afd`: the bare-transport baseline's instances. The same processes, the same
// one-sided writes with notifications (A2F to every F, each F answering at once), the same
// micro-batches in flight as the engine's job, and no engine.
#include "bench_afd.hpp"

#include <hetmesh/afd/instance.hpp>
#include <hetmesh/core/error.hpp>
#include <hetmesh/core/rendezvous.hpp>
#include <hetmesh/transport/transport.hpp>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>

namespace hetmesh::cli {
namespace {

namespace fs = std::filesystem;
using afd::JobConfig;
using afd::now_ns;

// One instance of the bare job: its transport, its two buffers (A: send [mb], receive [mb][f];
// F: receive [a][mb], send [a][mb], of the per-A slot sizes) and a connection to every peer.
struct BareInstance {
  std::unique_ptr<afd::Instance> instance;  // its plugins, device, store and spec; no engine
  const afd::EngineSpec& spec;
  const Device& device;
  std::unique_ptr<Transport> transport;
  Buffer send, receive;
  std::shared_ptr<Region> send_region, receive_region;
  std::vector<std::shared_ptr<Connection>> peers;
  std::vector<std::shared_ptr<RemoteRegion>> remote;  // each peer's receive buffer
  std::map<ConnectionId, int> rank_of;
  std::set<int> finished;  // peers that said they are done: their leaving is no loss
  std::vector<TransportEvent> events;

  BareInstance(const JobConfig& c, afd::Role role, int rank, const AfdBenchOptions& o)
      : instance(afd::open_instance(c, role, rank, o.instance_options())),
        spec(instance->spec()),
        device(instance->device()) {
    const uint64_t A = static_cast<uint64_t>(spec.attention), F = static_cast<uint64_t>(spec.ffn),
                   M = static_cast<uint64_t>(spec.micro_batches);
    bool attention = role == afd::Role::attention;
    send = device.allocate(attention ? M * spec.a2f_slot_bytes() : A * M * spec.f2a_slot_bytes());
    receive =
        device.allocate(attention ? M * F * spec.f2a_slot_bytes() : A * M * spec.a2f_slot_bytes());
    transport = Transport::create(spec.transport);
    send_region = transport->register_memory(device, send.data(), send.size());
    receive_region = transport->register_memory(device, receive.data(), receive.size());
    Rendezvous rendezvous(instance->store(), "bare", attention ? "attention" : "ffn", rank);
    rendezvous.publish("endpoint", transport->endpoint());
    rendezvous.publish("receive", receive_region->describe());
    const char* peer_role = attention ? "ffn" : "attention";
    int peer_count = attention ? spec.ffn : spec.attention;
    for (int r = 0; r < peer_count; ++r) {  // in rank order, as the engine connects
      peers.push_back(transport->connect(rendezvous.fetch(peer_role, r, "endpoint", c.job.timeout),
                                         c.job.timeout));
      remote.push_back(
          peers.back()->import_region(rendezvous.fetch(peer_role, r, "receive", c.job.timeout)));
      rank_of[peers.back()->id()] = r;
    }
  }

  // Polls once; calls on_notification(peer rank, value) for each notification, on_control(peer
  // rank) for each control message; throws on a lost peer or a failed write.
  template <typename Notified, typename Control>
  void poll(Notified on_notification, Control on_control) {
    events.clear();
    transport->poll(events, std::chrono::milliseconds(2));
    for (const auto& e : events) {
      switch (e.type) {
        case TransportEvent::Type::notification:
          on_notification(rank_of.at(e.connection), e.value);
          break;
        case TransportEvent::Type::control:
          on_control(rank_of.at(e.connection));
          break;
        case TransportEvent::Type::write_done:
          if (e.status != HM_OK)
            throw Error(e.status, "bare baseline: a write failed: " + e.message);
          break;
        case TransportEvent::Type::peer_lost:
          if (!finished.contains(rank_of.at(e.connection)))
            throw Error(kStatusPeerLost, "bare baseline: a peer was lost: " + e.message);
          break;
      }
    }
  }
};

}  // namespace

// A: each micro-batch's tokens and routing to every F in one notified write, as soon as its
// previous round trip is back; the round trip runs from the first write to the last F's
// notification.
int run_bare_attention(const JobConfig& c, const AfdBenchOptions& o) {
  BareInstance me(c, afd::Role::attention, o.rank, o);
  const int M = me.spec.micro_batches, F = me.spec.ffn;
  const uint64_t a2f = uint64_t{me.spec.tokens} * me.spec.a2f_bytes_per_token();  // the payload
  std::vector<int> arrived(static_cast<size_t>(M), 0);
  std::vector<int64_t> posted(static_cast<size_t>(M)), completed(static_cast<size_t>(M));
  std::vector<double> round_trips;
  auto deadline = [&] { return now_ns() + std::chrono::nanoseconds(c.job.timeout).count(); };
  auto await = [&](int mb) {
    for (int64_t until = deadline(); arrived[static_cast<size_t>(mb)] < F;) {
      me.poll(
          [&](int, uint32_t value) {
            auto slot = static_cast<size_t>(value) / static_cast<size_t>(F);
            if (slot >= arrived.size()) throw Error(kStatusProtocolError, "bare: bad slot");
            if (++arrived[slot] == F) completed[slot] = now_ns();
          },
          [](int) {});
      if (now_ns() > until) throw Error(HM_ERR_TIMEOUT, "bare baseline: an F stopped answering");
    }
  };
  for (int it = 0; it < o.warmup + o.iterations; ++it) {
    for (int mb = 0; mb < M; ++mb) {
      auto m = static_cast<size_t>(mb);
      if (it > 0) {
        await(mb);
        if (it > o.warmup)
          round_trips.push_back(static_cast<double>(completed[m] - posted[m]) / 1e3);
        arrived[m] = 0;
        host_work(o.gap_us);
      }
      posted[m] = now_ns();
      for (int f = 0; f < F; ++f) {
        auto slot = static_cast<uint64_t>(o.rank * M + mb);  // F's slot for (this A, mb)
        me.peers[static_cast<size_t>(f)]->write(*me.send_region, m * a2f,
                                                *me.remote[static_cast<size_t>(f)], slot * a2f, a2f,
                                                static_cast<uint32_t>(slot), 0);
      }
    }
  }
  for (int mb = 0; mb < M; ++mb) {
    await(mb);
    round_trips.push_back(
        static_cast<double>(completed[static_cast<size_t>(mb)] - posted[static_cast<size_t>(mb)]) /
        1e3);
  }
  static const char kDone[] = "done";
  for (auto& peer : me.peers)
    peer->send_control({reinterpret_cast<const uint8_t*>(kDone), sizeof kDone - 1});
  std::ofstream(fs::path(o.out) / fmt::format("bare-attention{}.json", o.rank))
      << nlohmann::json(round_trips).dump();
  return 0;
}

// F: answers each A's micro-batch as soon as its notification arrives, with one notified write of
// its outputs into A's slot; leaves when every A is done.
int run_bare_ffn(const JobConfig& c, const AfdBenchOptions& o) {
  BareInstance me(c, afd::Role::ffn, o.rank, o);
  const int M = me.spec.micro_batches, F = me.spec.ffn, A = me.spec.attention;
  const uint64_t f2a = me.spec.f2a_slot_bytes();
  int done = 0;
  int64_t quiet_since = now_ns();
  while (done < A) {
    bool any = false;
    me.poll(
        [&](int a, uint32_t value) {
          any = true;
          int mb = static_cast<int>(value) % M;
          if (static_cast<int>(value) / M != a) throw Error(kStatusProtocolError, "bare: bad slot");
          auto from = static_cast<uint64_t>(a * M + mb);     // this F's send slot for (a, mb)
          auto to = static_cast<uint64_t>(mb * F + o.rank);  // A's receive slot for (mb, this F)
          me.peers[static_cast<size_t>(a)]->write(*me.send_region, from * f2a,
                                                  *me.remote[static_cast<size_t>(a)], to * f2a, f2a,
                                                  static_cast<uint32_t>(to), 0);
        },
        [&](int a) {
          if (me.finished.insert(a).second) ++done;
        });
    if (any) quiet_since = now_ns();
    if (now_ns() - quiet_since > std::chrono::nanoseconds(c.job.timeout).count())
      throw Error(HM_ERR_TIMEOUT, "bare baseline: the attention instances stopped sending");
  }
  return 0;
}

}  // namespace hetmesh::cli
