// Replacements: a new process with a lost instance's role and rank rejoins the running job under
// a new epoch and the job finishes (over each transport, and over etcd); an F waits for a
// replacement that is starting; an instance still joining follows a peer's replacement.
#include "afd_fault_support.hpp"
#include "child_output.hpp"
#include "etcd_server.hpp"
#include "verbs_support.hpp"

#include <hetmesh/afd/engine.hpp>
#include <hetmesh/afd/local_job.hpp>
#include <hetmesh/core/error.hpp>
#include <hetmesh/core/rendezvous.hpp>
#include <hetmesh/core/subprocess.hpp>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <optional>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

namespace hetmesh::afd {
namespace {

using namespace fault_test;

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

}  // namespace
}  // namespace hetmesh::afd
