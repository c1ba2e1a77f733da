// Faults in a running AFD job, with real processes and real signals: one instance is killed with
// SIGKILL or stopped with SIGSTOP in the middle of a run, and every survivor must end with an
// error that names a peer, within bounded time, and never by a signal of its own (a crash).
//
// The F instances answer through a device stream (a stream copy of the tokens into the outputs,
// then respond(batch, &stream)), the path on which a survivor once polled an event that its own
// loop had already destroyed. This binary re-runs itself as the instances (--role).
#include "child_output.hpp"
#include "etcd_server.hpp"
#include "verbs_support.hpp"

#include <hetmesh/afd/engine.hpp>
#include <hetmesh/afd/local_job.hpp>
#include <hetmesh/core/error.hpp>
#include <hetmesh/core/log.hpp>
#include <hetmesh/core/membership.hpp>
#include <hetmesh/core/plugin.hpp>
#include <hetmesh/core/rendezvous.hpp>
#include <hetmesh/core/subprocess.hpp>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <optional>
#include <thread>

namespace hetmesh::afd {
namespace {

// The engines' bound on every wait in the children: what a stopped peer costs its survivors. Both
// bounds are far beyond any pause of a healthy peer on a loaded machine, which must never look
// like the fault under test.
constexpr std::chrono::milliseconds kChildTimeout{30000};
// Their heartbeat: a peer silent this long is hung, even when no data is due.
constexpr std::chrono::milliseconds kHeartbeat{10000};
// The heartbeat of the replacement cases ("recover"), which do not measure it: their survivors
// learn of a loss from the replacement or from the dead peer's link. Starting and connecting a
// replacement keeps a slow machine (the rxe VM: 2 emulated cores) so busy that a survivor can go
// unheard for over a second; that must not make it look hung.
constexpr std::chrono::milliseconds kRecoveryHeartbeat{60000};
// How long the test waits for a child: far beyond any bound the engine promises.
constexpr std::chrono::milliseconds kWait{120000};

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
      stream.copy(part.output, part.tokens_data, uint64_t{part.tokens} * spec.hidden * 2);
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

// ---- the tests ----

struct Fault {
  int attention, ffn;
  TransportKind kind;
  const char* ffn_device;
  const char* victim;  // "ffn" or "attention": rank 1 of that role is hit
  int signal;          // SIGKILL or SIGSTOP
};

std::string fault_name(const Fault& f) {
  return fmt::format("{}a{}f_{}_{}_{}1_{}", f.attention, f.ffn, to_string(f.kind),
                     f.ffn_device[0] == 'a' ? "asic" : "cpu", f.victim,
                     f.signal == SIGKILL ? "kill" : "stop");
}
void PrintTo(const Fault& f, std::ostream* os) {
  *os << fault_name(f);
}

class AfdFaultTest : public testing::TestWithParam<Fault> {};

// Whatever is hit, every survivor ends by itself and never by a signal. A lost F is fatal to the
// attention instances it owed answers (each names it), and so to the job; a lost A, killed or
// hung (found by the heartbeat), is contained: the other As finish their rounds, the F instances
// serve them to the end and name the lost A.
TEST_P(AfdFaultTest, SurvivorsEndByThemselvesNamingThePeerAndNeverCrash) {
  const Fault f = GetParam();
  HETMESH_SKIP_UNLESS_USABLE(f.kind);
  const bool contained = std::string(f.victim) == "attention";
  constexpr int kRounds = 40;  // per A, when an A is the victim: the survivors finish them
  // Repeated: the crash this guards against depended on how the threads interleaved.
  for (int run = 0; run < 3; ++run) {
    SCOPED_TRACE(fmt::format("run {}", run));
    TcpStoreServer store("127.0.0.1:0");
    LocalJob job({}, store.address(), testing::TempDir());
    struct Child {
      std::string name;
      ChildProcess* process;
    };
    std::vector<Child> children;
    auto start = [&](const char* role, int rank) {
      std::vector<std::string> args = {std::to_string(f.attention), std::to_string(f.ffn),
                                       to_string(f.kind), f.ffn_device};
      if (contained) args.push_back(std::to_string(kRounds));
      children.push_back({fmt::format("{} {}", role, rank), &job.start(role, rank, args)});
    };
    for (int r = 0; r < f.ffn; ++r)
      start("ffn", r);
    for (int r = 0; r < f.attention; ++r)
      start("attention", r);

    // Mid-run: attention 0 has finished a few rounds against every F.
    ChildProcess& first = *children[static_cast<size_t>(f.ffn)].process;
    for (int round = 0; round < 2 + run; ++round)
      ASSERT_EQ(first.read_line(kWait), fmt::format("round {}", round));
    const std::string victim = fmt::format("{} 1", f.victim);
    ChildProcess* hit = nullptr;
    for (auto& c : children)
      if (c.name == victim) hit = c.process;
    ASSERT_NE(hit, nullptr);
    hit->kill(f.signal);

    for (auto& c : children) {
      if (c.process == hit) continue;
      std::string error, last;
      std::vector<std::string> lines;
      try {
        for (;;) {
          std::string line = c.process->read_line(kWait);
          if (line.rfind("error ", 0) == 0) error = line;
          lines.push_back(line);
        }
      } catch (const Error&) {  // the child closed its stdout: it has exited
      }
      ProcessResult r = c.process->wait(kWait);
      EXPECT_FALSE(r.timed_out) << c.name << " did not end: " << r.describe();
      EXPECT_EQ(r.signal, 0) << c.name << " died by a signal: " << r.describe();
      if (contained) {
        EXPECT_EQ(r.exit_code, 0) << c.name << " was not contained: " << r.describe() << " "
                                  << error;
        if (c.name.rfind("attention", 0) == 0) {
          ASSERT_FALSE(lines.empty()) << c.name;
          EXPECT_EQ(lines.back(), fmt::format("round {}", kRounds - 1)) << c.name;
        } else {
          ASSERT_FALSE(lines.empty()) << c.name;
          EXPECT_EQ(lines.back().rfind("served on without attention 1 ", 0), 0u)
              << c.name << ": " << lines.back();
          EXPECT_TRUE(lines.back().find("attention 1 lost") != std::string::npos ||
                      lines.back().find("attention 1 hung") != std::string::npos)
              << c.name << ": " << lines.back();
        }
        continue;
      }
      EXPECT_EQ(r.exit_code, 1) << c.name << ": " << r.describe();
      // The error names a peer: the victim itself, or a survivor that ended because of it.
      EXPECT_TRUE(error.find(" lost") != std::string::npos ||
                  error.find(" hung") != std::string::npos ||
                  error.find("no answer from") != std::string::npos ||
                  error.find("no complete micro-batch") != std::string::npos)
          << c.name << ": " << error;
      EXPECT_TRUE(error.find("ffn ") != std::string::npos ||
                  error.find("attention ") != std::string::npos)
          << c.name << " names no peer: " << error;
    }
    hit->kill(SIGKILL);
    hit->wait(kWait);
  }
}

struct Replacement {
  int attention, ffn;
  TransportKind kind;
  const char* victim;  // "ffn" or "attention": its last rank is hit
  int signal;          // SIGKILL, or SIGSTOP: replaced while stopped, killed at the end
  bool etcd = false;   // the job meets at a real etcd rather than the embedded store
};

std::string replacement_name(const Replacement& r) {
  return fmt::format("{}a{}f_{}_{}_{}{}", r.attention, r.ffn, to_string(r.kind), r.victim,
                     r.signal == SIGKILL ? "killed" : "stopped", r.etcd ? "_etcd" : "");
}
void PrintTo(const Replacement& r, std::ostream* os) {
  *os << replacement_name(r);
}

class AfdReplacementTest : public testing::TestWithParam<Replacement> {};

// One instance is hit mid-run and a new process with its role and rank is started at once: it
// joins the running job under epoch 2, nobody is restarted, and every A (the replacement too)
// finishes all its rounds with every answer checked. A lost F costs each A the micro-batches it
// owed, pushed again once the replacement is in; a lost A costs the F instances nothing. A stopped
// instance is replaced before the heartbeat finds it hung: the new epoch supersedes it.
TEST_P(AfdReplacementTest, TheReplacementRejoinsAndTheJobFinishes) {
  const Replacement r = GetParam();
  HETMESH_SKIP_UNLESS_USABLE(r.kind);
  constexpr int kRounds = 300;  // the hit comes after 3: most of the run is after it
  if (r.etcd) HETMESH_REQUIRE_ETCD_OR_SKIP();
  std::optional<TcpStoreServer> store;
  std::optional<test::EtcdServer> etcd;
  if (r.etcd)
    etcd.emplace();
  else
    store.emplace("127.0.0.1:0");
  LocalJob job({}, r.etcd ? etcd->endpoint() : store->address(), testing::TempDir());
  const bool ffn_hit = std::string(r.victim) == "ffn";
  const int victim_rank = (ffn_hit ? r.ffn : r.attention) - 1;
  const std::vector<std::string> args = {std::to_string(r.attention),
                                         std::to_string(r.ffn),
                                         to_string(r.kind),
                                         "cpu:0",
                                         "recover",
                                         std::to_string(kRounds),
                                         r.victim,
                                         std::to_string(victim_rank)};
  struct Child {
    std::string name;
    ChildProcess* process;
  };
  std::vector<Child> children;
  for (int f = 0; f < r.ffn; ++f)
    children.push_back({fmt::format("ffn {}", f), &job.start("ffn", f, args)});
  for (int a = 0; a < r.attention; ++a)
    children.push_back({fmt::format("attention {}", a), &job.start("attention", a, args)});
  for (auto& c : children)
    ASSERT_EQ(c.process->read_line(kWait), "epoch 1") << c.name;

  const std::string victim = fmt::format("{} {}", r.victim, victim_rank);
  // Mid-run: attention 0 (a survivor unless it is the victim) has done a few rounds.
  ChildProcess& first = *children[static_cast<size_t>(r.ffn)].process;
  for (int round = 0; round < 3; ++round)
    ASSERT_EQ(first.read_line(kWait), fmt::format("round {}", round));
  ChildProcess* hit = nullptr;
  for (auto& c : children)
    if (c.name == victim) hit = c.process;
  ASSERT_NE(hit, nullptr);
  hit->kill(r.signal);
  ChildProcess& replacement = job.start(r.victim, victim_rank, args);
  EXPECT_EQ(replacement.read_line(kWait), "epoch 2");
  for (auto& c : children) {
    if (c.process == hit) c = {victim + " (replacement)", &replacement};
  }

  int recovered = 0;  // the A instances' retried and refused micro-batches
  for (auto& c : children) {
    std::vector<std::string> lines = test::lines_until_exit(*c.process, kWait);
    ProcessResult result = c.process->wait(kWait);
    EXPECT_EQ(result.exit_code, 0)
        << c.name << ": " << result.describe() << " " << (lines.empty() ? "" : lines.back());
    if (c.name.rfind("attention", 0) == 0) {
      ASSERT_FALSE(lines.empty()) << c.name;
      int retried = 0, refused = 0;
      ASSERT_EQ(std::sscanf(lines.back().c_str(), "retried %d refused %d", &retried, &refused), 2)
          << c.name << ": " << lines.back();
      ASSERT_GE(lines.size(), 2u);
      EXPECT_EQ(lines[lines.size() - 2], fmt::format("round {}", kRounds - 1)) << c.name;
      recovered += retried + refused;
    } else if (!ffn_hit) {
      // A survivor F lost the old A and served its replacement, and its history says so.
      ASSERT_GE(lines.size(), 2u) << c.name;
      EXPECT_NE(lines.back().find("served on without " + victim), std::string::npos)
          << c.name << ": " << lines.back();
      EXPECT_EQ(lines[lines.size() - 2],
                fmt::format("changes: {} lost (epoch 1) {} joined (epoch 2)", victim, victim))
          << c.name;
    }
  }
  // Every A was owed answers by the F that was hit, or was refused a push while it was lost.
  if (ffn_hit) {
    EXPECT_GE(recovered, r.attention);
  }
  hit->kill(SIGKILL);
  hit->wait(kWait);
}

INSTANTIATE_TEST_SUITE_P(
    Recovery, AfdReplacementTest,
    testing::Values(Replacement{2, 2, TransportKind::ipc, "ffn", SIGKILL},
                    Replacement{2, 2, TransportKind::ipc, "attention", SIGKILL},
                    Replacement{2, 2, TransportKind::tcp, "ffn", SIGKILL},
                    Replacement{2, 2, TransportKind::tcp, "attention", SIGKILL},
                    Replacement{1, 1, TransportKind::ipc, "ffn", SIGKILL},
                    Replacement{1, 1, TransportKind::tcp, "attention", SIGKILL},
                    Replacement{2, 2, TransportKind::ipc, "ffn", SIGSTOP},
                    Replacement{2, 2, TransportKind::tcp, "attention", SIGSTOP},
                    Replacement{2, 2, TransportKind::verbs, "ffn", SIGKILL},
                    Replacement{2, 2, TransportKind::verbs, "attention", SIGKILL},
                    // Containment and rejoin over etcd as over the embedded store.
                    Replacement{2, 2, TransportKind::ipc, "ffn", SIGKILL, true},
                    Replacement{2, 2, TransportKind::tcp, "attention", SIGKILL, true}),
    [](const testing::TestParamInfo<Replacement>& p) { return replacement_name(p.param); });

// The As still in the job finish while a lost A's replacement is starting: the F must not take
// their "leave" for the end of the job. A start claims its epoch in the store before anything
// else (here the test claims one, as a replacement's first step would, before the survivor
// finishes); the F sees the claim, waits, and serves the replacement when it joins (epoch 3).
// Without the claim the F ends when the others leave (AfdFaultTest's A kills).
TEST(AfdReplacement, AnFWaitsForAReplacementThatIsStartingWhenTheOthersAreDone) {
  TcpStoreServer store("127.0.0.1:0");
  LocalJob job({}, store.address(), testing::TempDir());
  const std::vector<std::string> args = {"2", "1", "ipc", "cpu:0", "recover", "20"};
  ChildProcess& ffn = job.start("ffn", 0, args);
  ChildProcess& a0 = job.start("attention", 0, args);
  ChildProcess& a1 = job.start("attention", 1, args);
  ASSERT_EQ(ffn.read_line(kWait), "epoch 1");
  ASSERT_EQ(a1.read_line(kWait), "epoch 1");
  ASSERT_EQ(a1.read_line(kWait), "round 0");
  a1.kill(SIGKILL);
  a1.wait(kWait);
  auto client = connect_tcp_store(store.address(), kWait);
  ASSERT_EQ(client->add(EngineSpec{}.job + "/attention/1/epochs", 1), 2);
  ProcessResult survivor = a0.wait(kWait);
  ASSERT_EQ(survivor.exit_code, 0) << survivor.describe();
  // attention 0 has left; the F is still serving, for the replacement (it prints nothing until
  // it ends, and its stdout closes when it exits).
  try {
    std::string line = ffn.read_line(std::chrono::milliseconds(300));
    FAIL() << "the F ended before the replacement joined: " << line;
  } catch (const Error& e) {
    ASSERT_EQ(e.status(), HM_ERR_TIMEOUT) << "the F ended before the replacement joined";
  }
  ChildProcess& replacement = job.start("attention", 1, args);
  EXPECT_EQ(replacement.read_line(kWait), "epoch 3");
  std::string last = test::last_line_until_exit(replacement, kWait);
  EXPECT_EQ(last, "retried 0 refused 0");
  ProcessResult r = replacement.wait(kWait);
  EXPECT_EQ(r.exit_code, 0) << r.describe();
  std::string served = test::last_line_until_exit(ffn, kWait);
  EXPECT_NE(served.find("served on without attention 1"), std::string::npos) << served;
  ProcessResult f = ffn.wait(kWait);
  EXPECT_EQ(f.exit_code, 0) << f.describe();
}

// An instance still joining when a peer dies follows the peer's replacement: F (epoch 1) is
// killed after it published itself, A starts and dials it, and a new F (epoch 2) starts while A
// is still trying. A's connection to the dead epoch fails, A finds epoch 2 in the store and
// connects to it, and the job runs to the end. Without that, A would fail its start.
TEST(AfdReplacement, AnInstanceThatIsJoiningFollowsAPeersReplacement) {
  TcpStoreServer store("127.0.0.1:0");
  LocalJob job({}, store.address(), testing::TempDir());
  const std::vector<std::string> args = {"1", "1", "ipc", "cpu:0", "recover", "20"};
  ChildProcess& dead = job.start("ffn", 0, args);
  auto client = connect_tcp_store(store.address(), kWait);
  const std::string key = EngineSpec{}.job + "/ffn/0/epoch";
  for (auto start = std::chrono::steady_clock::now(); !client->try_get(key);) {
    ASSERT_LT(std::chrono::steady_clock::now() - start, kWait) << "ffn 0 never published itself";
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  dead.kill(SIGKILL);
  dead.wait(kWait);
  ChildProcess& attention = job.start("attention", 0, args);
  // Time for A to read epoch 1 and dial it (its dial lasts kChildTimeout, leaving the new F
  // seconds to publish epoch 2 even on a loaded machine).
  std::this_thread::sleep_for(std::chrono::milliseconds(2000));
  ChildProcess& ffn = job.start("ffn", 0, args);
  EXPECT_EQ(ffn.read_line(kWait), "epoch 2");
  EXPECT_EQ(attention.read_line(kWait), "epoch 1");
  std::string last = test::last_line_until_exit(attention, kWait);
  EXPECT_EQ(last, "retried 0 refused 0");
  ProcessResult a = attention.wait(kWait);
  EXPECT_EQ(a.exit_code, 0) << a.describe();
  ProcessResult f = ffn.wait(kWait);
  EXPECT_EQ(f.exit_code, 0) << f.describe();
}

// ---- the store's host dies mid-run ----

// This binary as a store's host: prints the store's address, then serves until killed.
int host_store() {
  TcpStoreServer server("127.0.0.1:0");
  std::cout << server.address() << std::endl;
  for (;;)
    pause();
}

// A running job needs its store only for replacements: when the store's host is killed mid-run,
// every instance finishes its rounds (each answer checked) and exits 0; their rejoin threads
// only warn that no replacement can join now.
TEST(AfdStoreLoss, ARunningJobOutlivesItsStoresHost) {
  ChildProcess store_host({self_executable(), "--host-store"});
  const std::string address = store_host.read_line(kWait);
  LocalJob job({}, address, testing::TempDir());
  const std::vector<std::string> args = {"2", "2", "tcp", "cpu:0", "recover", "200"};
  std::vector<ChildProcess*> children;
  for (int f = 0; f < 2; ++f)
    children.push_back(&job.start("ffn", f, args));
  for (int a = 0; a < 2; ++a)
    children.push_back(&job.start("attention", a, args));
  for (ChildProcess* c : children)
    ASSERT_EQ(c->read_line(kWait), "epoch 1");
  for (int round = 0; round < 3; ++round)
    ASSERT_EQ(children[2]->read_line(kWait), fmt::format("round {}", round));
  store_host.kill(SIGKILL);
  store_host.wait(kWait);
  for (size_t i = 0; i < children.size(); ++i) {
    std::string last = test::last_line_until_exit(*children[i], kWait);
    ProcessResult r = children[i]->wait(kWait);
    EXPECT_EQ(r.exit_code, 0) << "instance " << i << ": " << r.describe() << " " << last;
    if (i >= 2) {
      EXPECT_EQ(last, "retried 0 refused 0") << "attention " << i - 2;
    }
  }
}

class AfdHeartbeatTest : public testing::TestWithParam<TransportKind> {};

// Heartbeats keep an idle job alive: A stays silent for three heartbeats between two rounds, and
// neither side takes the silence for a hang.
TEST_P(AfdHeartbeatTest, AnIdleJobIsNotAHungOne) {
  TcpStoreServer store("127.0.0.1:0");
  LocalJob job({}, store.address(), testing::TempDir());
  std::vector<std::string> args = {"1", "1", to_string(GetParam()), "cpu:0", "idle"};
  ChildProcess& ffn = job.start("ffn", 0, args);
  ChildProcess& attention = job.start("attention", 0, args);
  EXPECT_EQ(attention.read_line(kWait), "round 0");
  EXPECT_EQ(attention.read_line(kWait), "round 1");
  ProcessResult a = attention.wait(kWait);
  EXPECT_EQ(a.exit_code, 0) << a.describe();
  ProcessResult f = ffn.wait(kWait);
  EXPECT_EQ(f.exit_code, 0) << f.describe();
}

// A peer stopped while no data is due is found by the heartbeat, not by a data timeout: F waits
// for batches for 60 s, A is stopped, and F finds A lost because it hung.
TEST_P(AfdHeartbeatTest, APeerStoppedWhileIdleIsFoundHung) {
  TcpStoreServer store("127.0.0.1:0");
  LocalJob job({}, store.address(), testing::TempDir());
  std::vector<std::string> args = {"1", "1", to_string(GetParam()), "cpu:0", "idle"};
  ChildProcess& ffn = job.start("ffn", 0, args);
  ChildProcess& attention = job.start("attention", 0, args);
  EXPECT_EQ(ffn.read_line(kWait), "serving");
  EXPECT_EQ(attention.read_line(kWait), "round 0");
  attention.kill(SIGSTOP);
  auto stopped = std::chrono::steady_clock::now();
  std::string error;
  try {
    for (;;)
      if (std::string line = ffn.read_line(kWait); line.rfind("lost ", 0) == 0) error = line;
  } catch (const Error&) {
  }
  ProcessResult f = ffn.wait(kWait);
  auto found_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                      std::chrono::steady_clock::now() - stopped)
                      .count();
  EXPECT_EQ(f.exit_code, 1) << f.describe();
  EXPECT_NE(error.find("attention 0 hung: nothing heard from it"), std::string::npos) << error;
  std::printf(
      "[ figure ] %s: a stopped idle A found hung %lld ms after SIGSTOP (heartbeat %lld ms)\n",
      to_string(GetParam()), static_cast<long long>(found_ms),
      static_cast<long long>(kHeartbeat.count()));
  attention.kill(SIGKILL);
  attention.wait(kWait);
}

INSTANTIATE_TEST_SUITE_P(Transports, AfdHeartbeatTest,
                         testing::Values(TransportKind::ipc, TransportKind::tcp),
                         [](const testing::TestParamInfo<TransportKind>& p) {
                           return std::string(to_string(p.param));
                         });

INSTANTIATE_TEST_SUITE_P(
    Faults, AfdFaultTest,
    testing::Values(Fault{2, 2, TransportKind::ipc, "asic_stub:0", "ffn", SIGKILL},
                    Fault{2, 2, TransportKind::ipc, "asic_stub:0", "attention", SIGKILL},
                    Fault{3, 2, TransportKind::ipc, "cpu:0", "ffn", SIGKILL},
                    Fault{2, 2, TransportKind::tcp, "asic_stub:0", "ffn", SIGKILL},
                    Fault{3, 2, TransportKind::tcp, "cpu:0", "attention", SIGKILL},
                    Fault{2, 2, TransportKind::ipc, "cpu:0", "ffn", SIGSTOP},
                    Fault{2, 2, TransportKind::tcp, "asic_stub:0", "ffn", SIGSTOP},
                    Fault{2, 2, TransportKind::ipc, "cpu:0", "attention", SIGSTOP},
                    Fault{2, 2, TransportKind::verbs, "asic_stub:0", "ffn", SIGKILL},
                    Fault{2, 2, TransportKind::verbs, "cpu:0", "attention", SIGKILL}),
    [](const testing::TestParamInfo<Fault>& p) { return fault_name(p.param); });

}  // namespace
}  // namespace hetmesh::afd

int main(int argc, char** argv) {
  if (argc > 2 && std::strcmp(argv[1], "--role") == 0) return hetmesh::afd::child_main(argc, argv);
  if (argc == 2 && std::strcmp(argv[1], "--host-store") == 0) return hetmesh::afd::host_store();
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
