// Faults in a running AFD job, with real processes and real signals: one instance is killed with
// SIGKILL or stopped with SIGSTOP in the middle of a run, and every survivor must end with an
// error that names a peer, within bounded time, and never by a signal of its own (a crash).
//
// The F instances answer through a device stream (a stream copy of the tokens into the outputs,
// then respond(batch, &stream)), the path on which a survivor once polled an event that its own
// loop had already destroyed. This binary re-runs itself as the instances (--role).
//
// The cases are in the files beside this one, a subject each: an instance killed or stopped and
// its survivors (afd_fault_survivors_test.cc), a replacement that rejoins the running job
// (afd_fault_replacement_test.cc), the store's host killed mid-run (afd_fault_store_loss_test.cc),
// heartbeats on an idle job (afd_fault_heartbeat_test.cc); what they share is in
// afd_fault_support.hpp. This file is the binary's main and what it runs as: the instances
// (--role) and a store's host (--host-store).
#include "afd_fault_support.hpp"

#include <hetmesh/afd/engine.hpp>
#include <hetmesh/core/error.hpp>
#include <hetmesh/core/log.hpp>
#include <hetmesh/core/membership.hpp>
#include <hetmesh/core/plugin.hpp>
#include <hetmesh/core/rendezvous.hpp>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <iostream>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace hetmesh::afd {
namespace {

using namespace fault_test;

EngineSpec fault_spec(int attention, int ffn, TransportKind kind) {
  EngineSpec s;
  s.attention = attention;
  s.ffn = ffn;
  s.micro_batches = 3;
  s.tokens = 16;
  s.hidden = 64;
  s.top_k = 2;
  s.a2f_bytes = 2;
  s.f2a_bytes = 2;
  s.timeout = kChildTimeout;
  s.heartbeat = kHeartbeat;
  s.transport.kind = kind;
  return s;
}

// F: each part's outputs are a stream copy of its tokens, answered once the stream gets there.
// Prints "epoch N" once it has joined. `idle_limit` bounds get_batch: how long the F may go
// without work (a job waiting for a replacement goes without for as long as the replacement takes
// to join; the heartbeat, not this bound, finds a hung A).
int run_ffn(const EngineSpec& spec, KeyValueStore& store, const std::string& device_name,
            std::chrono::milliseconds idle_limit) {
  Device device = PluginRegistry::load().device(device_name);
  FfnEngine engine(spec, device, store);
  std::cout << "epoch " << engine.epoch() << std::endl;
  Stream stream = device.create_stream();  // destroyed before the engine: the engine must cope
  while (auto batch = engine.get_batch(idle_limit)) {
    for (const auto& part : batch->parts)
      stream.copy(part.output, part.tokens_data(), uint64_t{part.tokens} * spec.hidden * 2);
    engine.respond(*batch, &stream);
  }
  std::string changes;
  for (const PeerChange& c : engine.peer_history().changes)
    changes += fmt::format(" attention {} {} (epoch {})", c.rank,
                           c.state == PeerStatus::State::lost ? "lost" : "joined", c.epoch);
  std::cout << "changes:" << changes << std::endl;
  for (const std::string& lost : engine.lost_attention())
    std::cout << "served on without " << lost << std::endl;
  return 0;
}

// A: `rounds` rounds, each answer checked; prints "round N" as it goes, then leaves.
int run_attention(const EngineSpec& spec, KeyValueStore& store, int rounds) {
  Device device = PluginRegistry::load().device("cpu:0");
  AttentionEngine engine(spec, device, store);
  const uint64_t bytes = uint64_t{spec.tokens} * spec.hidden * 2;
  for (int round = 0; round < rounds; ++round) {
    std::vector<AttentionEngine::Handle> handles;
    for (int mb = 0; mb < spec.micro_batches; ++mb) {
      auto* tokens = static_cast<uint8_t*>(engine.tokens(mb));
      for (uint64_t i = 0; i < bytes; ++i)
        tokens[i] = static_cast<uint8_t>(i + round + mb + spec.rank);
      handles.push_back(engine.push_pull(mb, spec.tokens));
    }
    for (int mb = 0; mb < spec.micro_batches; ++mb) {
      engine.wait(handles[static_cast<size_t>(mb)], kChildTimeout);
      for (int f = 0; f < spec.ffn; ++f)
        if (std::memcmp(engine.result(mb, f), engine.tokens(mb), bytes) != 0)
          throw Error(HM_ERR_INTERNAL,
                      fmt::format("round {} mb {}: ffn {} answered wrong bytes", round, mb, f));
    }
    std::cout << "round " << round << std::endl;
  }
  engine.finish();
  return 0;
}

// Fills micro-batch mb's tokens for `round` of attention `rank`.
void fill_tokens(AttentionEngine& engine, int mb, int round, uint64_t bytes) {
  auto* tokens = static_cast<uint8_t*>(engine.tokens(mb));
  for (uint64_t i = 0; i < bytes; ++i)
    tokens[i] = static_cast<uint8_t>(i + round + mb + engine.spec().rank);
}

// An A that recovers from a lost F as docs/failures.md says an application should: a push refused
// or a round trip failed for a lost F is pushed again once wait_for_peers() says the replacement
// is in. Prints "epoch N", "round N" per round (every answer checked), then "retried K refused J".
// `replaced`: the instance the test replaces; every A that is not its replacement waits for the
// replacement to join (epoch 2) before it finishes, as the demo's --replace does: an A that
// finished first could end an F that had no A left, before the replacement came to connect to it.
int recovering_attention(const EngineSpec& spec, KeyValueStore& store, int rounds,
                         const std::optional<std::pair<std::string, int>>& replaced) {
  Device device = PluginRegistry::load().device("cpu:0");
  AttentionEngine engine(spec, device, store);
  std::cout << "epoch " << engine.epoch() << std::endl;
  const uint64_t bytes = uint64_t{spec.tokens} * spec.hidden * 2;
  int retried = 0, refused = 0;
  auto await_replacement = [&](const Error& e) {
    if (e.status() != kStatusPeerLost) throw e;
    if (!engine.wait_for_peers(kWait))
      throw Error(HM_ERR_TIMEOUT, fmt::format("no replacement joined after: {}", e.what()));
  };
  auto push = [&](int mb) {
    for (;;) {
      try {
        return engine.push_pull(mb, spec.tokens);
      } catch (const Error& e) {
        ++refused;
        await_replacement(e);
      }
    }
  };
  std::vector<AttentionEngine::Handle> handles(static_cast<size_t>(spec.micro_batches));
  for (int round = 0; round < rounds; ++round) {
    for (int mb = 0; mb < spec.micro_batches; ++mb) {
      fill_tokens(engine, mb, round, bytes);
      handles[static_cast<size_t>(mb)] = push(mb);
    }
    for (int mb = 0; mb < spec.micro_batches; ++mb) {
      for (;;) {
        try {
          engine.wait(handles[static_cast<size_t>(mb)], kChildTimeout);
          break;
        } catch (const Error& e) {
          ++retried;
          await_replacement(e);
          handles[static_cast<size_t>(mb)] = push(mb);  // its tokens are still in the slot
        }
      }
      for (int f = 0; f < spec.ffn; ++f)
        if (std::memcmp(engine.result(mb, f), engine.tokens(mb), bytes) != 0)
          throw Error(HM_ERR_INTERNAL,
                      fmt::format("round {} mb {}: ffn {} answered wrong bytes", round, mb, f));
    }
    std::cout << "round " << round << std::endl;
  }
  const bool is_replacement = replaced && replaced->first == "attention" &&
                              replaced->second == spec.rank && engine.epoch() >= 2;
  if (replaced && !is_replacement) {
    Membership membership(store, spec.job, "attention", spec.rank);
    const auto give_up = std::chrono::steady_clock::now() + kWait;
    while (membership.current_epoch(replaced->first, replaced->second, kWait) < 2) {
      if (std::chrono::steady_clock::now() > give_up)
        throw Error(HM_ERR_TIMEOUT,
                    fmt::format("{} {} was never replaced", replaced->first, replaced->second));
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  engine.finish();
  std::cout << "retried " << retried << " refused " << refused << std::endl;
  return 0;
}

// Idle modes, for the heartbeat: F waits for batches for far longer than any heartbeat, and
// prints "lost REASON" and fails as soon as it finds its A lost; A does one round, stays silent for
// three heartbeats, does another and leaves.
int idle_ffn(const EngineSpec& spec, KeyValueStore& store) {
  Device device = PluginRegistry::load().device("cpu:0");
  FfnEngine engine(spec, device, store);
  std::cout << "serving" << std::endl;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < deadline) {
    try {
      auto batch = engine.get_batch(std::chrono::milliseconds(50));
      if (!batch) return 0;
      engine.respond(*batch);
    } catch (const Error& e) {
      if (e.status() != HM_ERR_TIMEOUT) throw;
    }
    for (const PeerStatus& a : engine.peers())
      if (a.state == PeerStatus::State::lost) {
        std::cout << "lost " << a.reason << std::endl;
        return 1;
      }
  }
  return 0;
}

int idle_attention(const EngineSpec& spec, KeyValueStore& store) {
  Device device = PluginRegistry::load().device("cpu:0");
  AttentionEngine engine(spec, device, store);
  for (int round = 0; round < 2; ++round) {
    if (round > 0) std::this_thread::sleep_for(3 * kHeartbeat);
    engine.wait(engine.push_pull(0, spec.tokens), kChildTimeout);
    std::cout << "round " << round << std::endl;
  }
  engine.finish();
  return 0;
}

int child_main(int argc, char** argv) {
  // --role ROLE --rank RANK --store STORE --out DIR ATTENTION FFN TRANSPORT FFN_DEVICE
  //   [idle | ROUNDS | recover ROUNDS [REPLACED_ROLE REPLACED_RANK]]
  if (argc < 13) return 2;
  std::string role = argv[2];
  EngineSpec spec =
      fault_spec(std::stoi(argv[9]), std::stoi(argv[10]), parse_transport_kind(argv[11]));
  spec.rank = std::stoi(argv[4]);
  set_log_identity(fmt::format("{}:{}", role, spec.rank));
  try {
    auto store = connect_store(argv[6], kChildTimeout);  // the TCP store, or etcd
    const std::string mode = argc > 13 ? argv[13] : "";
    if (mode == "recover") spec.heartbeat = kRecoveryHeartbeat;
    if (role == "ffn") {
      spec.role = Role::ffn;
      if (mode == "idle") return idle_ffn(spec, *store);
      return run_ffn(spec, *store, argv[12], mode == "recover" ? kWait : kChildTimeout);
    }
    spec.role = Role::attention;
    if (mode == "idle") return idle_attention(spec, *store);
    if (mode == "recover") {
      std::optional<std::pair<std::string, int>> replaced;
      if (argc > 16) replaced.emplace(argv[15], std::stoi(argv[16]));
      return recovering_attention(spec, *store, std::stoi(argv[14]), replaced);
    }
    return run_attention(spec, *store, argc > 13 ? std::stoi(argv[13]) : 1000000);
  } catch (const std::exception& e) {
    std::cout << "error " << e.what() << std::endl;
    return 1;
  }
}

// This binary as a store's host: prints the store's address, then serves until killed.
int host_store() {
  TcpStoreServer server("127.0.0.1:0");
  std::cout << server.address() << std::endl;
  for (;;)
    pause();
}

}  // namespace
}  // namespace hetmesh::afd

int main(int argc, char** argv) {
  if (argc > 2 && std::strcmp(argv[1], "--role") == 0) return hetmesh::afd::child_main(argc, argv);
  if (argc == 2 && std::strcmp(argv[1], "--host-store") == 0) return hetmesh::afd::host_store();
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
