#include "engine_common.hpp"

#include <hetmesh/core/hex.hpp>
#include <hetmesh/core/log.hpp>
#include <hetmesh/core/topology.hpp>

#include <nlohmann/json.hpp>

#include <pthread.h>

#include <algorithm>

namespace hetmesh::afd {
int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

const char* to_string(Role role) {
  return role == Role::attention ? "attention" : "ffn";
}

std::string peer_name(Role role, int rank) {
  return fmt::format("{} {}", to_string(role), rank);
}

std::vector<uint8_t> PublishedRegions::encode() const {
  nlohmann::json document = nlohmann::json::object();
  for (const auto& [name, region] : regions)
    document[name] = to_hex(region->describe());
  std::string text = document.dump();
  return {text.begin(), text.end()};
}

std::map<std::string, std::vector<uint8_t>> decode_regions(const std::vector<uint8_t>& blob,
                                                           const std::string& from) {
  auto document = nlohmann::json::parse(blob.begin(), blob.end(), nullptr, false);
  if (document.is_discarded() || !document.is_object())
    throw Error(kStatusProtocolError, fmt::format("{} published malformed regions", from));
  std::map<std::string, std::vector<uint8_t>> out;
  for (const auto& [name, value] : document.items()) {
    if (!value.is_string())
      throw Error(kStatusProtocolError,
                  fmt::format("{} published a malformed region '{}'", from, name));
    out[name] = from_hex(value.get<std::string>(), from + " region " + name, kStatusProtocolError);
  }
  return out;
}

const char* to_string(PeerStatus::State state) {
  switch (state) {
    case PeerStatus::State::live:
      return "live";
    case PeerStatus::State::left:
      return "left";
    case PeerStatus::State::lost:
      return "lost";
  }
  return "?";
}

std::vector<PeerStatus> peer_status(Role role, const std::vector<Peer>& peers) {
  std::vector<PeerStatus> out;
  for (const Peer& peer : peers) {
    auto state = peer.lost   ? PeerStatus::State::lost
                 : peer.left ? PeerStatus::State::left
                             : PeerStatus::State::live;
    out.push_back({role, peer.rank, peer.link->epoch, state, peer.lost_reason});
  }
  return out;
}

std::map<std::string, uint64_t> expected_regions(const EngineSpec& spec, Role peer_role) {
  const uint64_t header = sizeof(WireHeader);
  const uint64_t slots = uint64_t(spec.attention) * spec.micro_batches;  // an F's, per A
  const uint64_t results = uint64_t(spec.micro_batches) * spec.ffn;      // an A's, per F
  if (peer_role == Role::ffn)
    return {{"a2f_payload", spec.a2f_slot_bytes() * slots}, {"a2f_headers", header * slots}};
  return {{"f2a_payload", spec.f2a_slot_bytes() * results}, {"f2a_headers", header * results}};
}

std::shared_ptr<const Link> connect_peer(const EngineSpec& spec, Transport& transport,
                                         Membership& membership, Role peer_role, int rank,
                                         uint64_t epoch,
                                         const std::map<std::string, uint64_t>& expected) {
  const std::string name = peer_name(peer_role, rank);
  const std::string self = peer_name(spec.role, spec.rank);
  auto endpoint = membership.fetch(to_string(peer_role), rank, epoch, "endpoint", spec.timeout);
  auto regions = decode_regions(
      membership.fetch(to_string(peer_role), rank, epoch, "regions", spec.timeout), name);
  for (const auto& [region, bytes] : expected)
    if (!regions.contains(region))
      throw Error(kStatusProtocolError, fmt::format("{}: {} (epoch {}) published no region '{}'",
                                                    self, name, epoch, region));
  auto link = std::make_shared<Link>();
  link->epoch = epoch;
  link->connection = transport.connect(endpoint, spec.timeout);
  for (const auto& [region, descriptor] : regions) {
    auto size = expected.find(region);
    if (size == expected.end()) continue;  // not one this engine writes to
    auto imported = link->connection->import_region(descriptor);
    if (imported->size() != size->second)
      throw Error(kStatusProtocolError,
                  fmt::format("{}: {} (epoch {}) published region '{}' of {} bytes, but this "
                              "job's shape needs {} (were both started from the same config?)",
                              self, name, epoch, region, imported->size(), size->second));
    link->regions[region] = std::move(imported);
  }
  log(LogLevel::debug, "{}: connected to {} (epoch {}) over {}", self, name, epoch,
      to_string(transport.kind()));
  return link;
}

Joined join(const EngineSpec& spec, Transport& transport, const PublishedRegions& mine,
            KeyValueStore& store, Role peer_role, int peer_count) {
  Membership membership(store, spec.job, to_string(spec.role), spec.rank);
  Joined joined;
  joined.epoch = membership.join({{"endpoint", transport.endpoint()}, {"regions", mine.encode()}});
  const auto expected = expected_regions(spec, peer_role);
  for (int rank = 0; rank < peer_count; ++rank) {
    Peer peer;
    peer.rank = rank;
    uint64_t epoch = membership.current_epoch(to_string(peer_role), rank, spec.timeout);
    while (!peer.link) {
      try {
        peer.link = connect_peer(spec, transport, membership, peer_role, rank, epoch, expected);
      } catch (const Error& e) {
        // A peer that failed after publishing its endpoint refuses the connection: its own report
        // says why, better than the refusal.
        std::optional<std::string> failure;
        try {
          failure = job_failure(store, spec.job);
        } catch (const Error&) {
        }
        if (failure)
          throw Error(kStatusJobFailed, fmt::format("job '{}' failed: {}", spec.job, *failure));
        if (e.status() == kStatusProtocolError) throw;
        // It died while this instance was joining, and a replacement took its place: that one.
        uint64_t newest = epoch;
        try {
          newest =
              membership.current_epoch(to_string(peer_role), rank, std::chrono::milliseconds(0));
        } catch (const Error&) {
        }
        if (newest > epoch) {
          log(LogLevel::info,
              "{}: {} (epoch {}) is gone ({}); connecting to its replacement (epoch {})",
              peer_name(spec.role, spec.rank), peer_name(peer_role, rank), epoch, e.what(), newest);
          epoch = newest;
          continue;
        }
        throw Error(e.status(), fmt::format("{}: connecting to {} (epoch {}): {}",
                                            peer_name(spec.role, spec.rank),
                                            peer_name(peer_role, rank), epoch, e.what()));
      }
    }
    joined.peers.push_back(std::move(peer));
  }
  return joined;
}

TransportOptions transport_options(const EngineSpec& spec, const Device& device) {
  TransportOptions options = spec.transport;
  options.io_timeout = spec.timeout;
  if (options.rdma_device == "auto") {
    const std::string pci = device.properties().pci_bus_id;
    std::optional<std::string> nic;
    if (!pci.empty()) nic = Topology::of_this_machine().nearest_nic(pci);
    options.rdma_device = nic.value_or("");
    log(LogLevel::info, "{}: RDMA device auto: {}", device.selector(),
        nic ? fmt::format("{}, the nearest to {}", *nic, pci)
            : std::string("the first active one (the topology names no NIC near the device)"));
  }
  return options;
}

void pin_thread(std::thread& thread, int cpu, const char* what) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (int rc = pthread_setaffinity_np(thread.native_handle(), sizeof set, &set); rc != 0)
    log(LogLevel::warn, "cannot pin {} to CPU {}: {}", what, cpu, std::strerror(rc));
}

Heartbeat::Heartbeat(const EngineSpec& spec, Role peer_role, size_t peers)
    : timeout_(spec.heartbeat),
      grace_(spec.timeout),
      peer_role_(peer_role),
      last_heard_(peers, Clock::now()),
      heard_once_(peers, false),
      last_sent_(Clock::now() - spec.heartbeat) {}

void Heartbeat::restart(int peer) {
  last_heard_.at(static_cast<size_t>(peer)) = Clock::now();
  heard_once_[static_cast<size_t>(peer)] = false;
}

void Heartbeat::heard(int peer) {
  last_heard_.at(static_cast<size_t>(peer)) = Clock::now();
  heard_once_[static_cast<size_t>(peer)] = true;
}

std::optional<Heartbeat::Silent> Heartbeat::tick(const std::vector<Peer>& peers) {
  static constexpr std::string_view kBeat = "hb";
  const Clock::time_point now = Clock::now();
  if (now - last_sent_ >= timeout_ / 4) {
    last_sent_ = now;
    for (const Peer& peer : peers) {
      if (peer.left || peer.lost || !peer.link->connection->alive()) continue;
      try {  // a busy connection is skipped: its data is on its way, a beat would only queue
        peer.link->connection->try_send_control(
            {reinterpret_cast<const uint8_t*>(kBeat.data()), kBeat.size()});
      } catch (const Error&) {  // the connection broke: its peer_lost event follows
      }
    }
  }
  for (const Peer& peer : peers) {
    if (peer.left || peer.lost || !peer.link->connection->alive()) continue;
    const size_t r = static_cast<size_t>(peer.rank);
    auto silent = now - last_heard_[r];
    if (silent <= (heard_once_[r] ? timeout_ : timeout_ + grace_)) continue;
    return Silent{peer.rank,
                  fmt::format("{} hung: nothing heard from it for {} ms (heartbeat_ms {})",
                              peer_name(peer_role_, peer.rank),
                              std::chrono::duration_cast<std::chrono::milliseconds>(silent).count(),
                              timeout_.count())};
  }
  return std::nullopt;
}

CommThread::CommThread(const std::vector<int>& cpus, std::function<void()> step)
    : thread_([this, step = std::move(step)] {
        while (!stopping_.load(std::memory_order_acquire))
          step();
      }) {
  if (!cpus.empty()) pin_thread(thread_, cpus.front(), "the comm thread");
}

CommThread::~CommThread() {
  stop();
}

void CommThread::stop() {
  stopping_.store(true, std::memory_order_release);
  if (thread_.joinable()) thread_.join();
}

bool wait_ready(const ReadyWait& ready, const std::atomic<bool>& stopping) {
  // Slices short enough that a stopping engine is not held up for long.
  constexpr auto kSlice = std::chrono::milliseconds(10);
  if (ready.event != nullptr) {
    while (!ready.event->ready()) {
      if (stopping.load(std::memory_order_acquire)) return false;
      try {
        ready.event->synchronize(kSlice);
      } catch (const Error& e) {
        if (e.status() != HM_ERR_TIMEOUT) throw;
      }
    }
    return true;
  }
  if (ready.flag != nullptr) {
    auto reached = [&] {
      return static_cast<int32_t>(
                 std::atomic_ref<const uint32_t>(*static_cast<const uint32_t*>(ready.flag))
                     .load(std::memory_order_acquire) -
                 ready.value) >= 0;
    };
    // A stream writes the flag: spin briefly, then poll it with growing sleeps (up to 50 us).
    auto spin_until = Clock::now() + std::chrono::microseconds(20);
    auto pause = std::chrono::microseconds(1);
    while (!reached()) {
      if (stopping.load(std::memory_order_acquire)) return false;
      if (Clock::now() < spin_until) {
        cpu_relax();
      } else {
        std::this_thread::sleep_for(pause);
        pause = std::min(pause * 2, std::chrono::microseconds(50));
      }
    }
  }
  return true;
}

int sender_cpu(const std::vector<int>& comm_cpus, size_t index) {
  if (comm_cpus.empty()) return -1;
  return comm_cpus[(1 + index) % comm_cpus.size()];
}

void rethrow_for_peer(const Error& e, Role role, int rank) {
  if (e.status() == kStatusPeerLost)
    throw Error(e.status(), fmt::format("{} lost: {}", peer_name(role, rank), e.what()));
  throw Error(e.status(), fmt::format("writing to {}: {}", peer_name(role, rank), e.what()));
}

void check_slot(uint32_t slot, uint32_t limit, const std::string& from) {
  if (slot >= limit)
    throw Error(kStatusProtocolError,
                fmt::format("{} notified slot {}, but only {} slots exist", from, slot, limit));
}

}  // namespace hetmesh::afd
