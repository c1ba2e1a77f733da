// Heartbeats: an idle job is not taken for a hung one, and a peer stopped while no data is due is
// found hung by the heartbeat.
#include "afd_fault_support.hpp"

#include <hetmesh/afd/local_job.hpp>
#include <hetmesh/core/error.hpp>
#include <hetmesh/core/rendezvous.hpp>
#include <hetmesh/core/subprocess.hpp>

#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <string>
#include <vector>

namespace hetmesh::afd {
namespace {

using namespace fault_test;

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

}  // namespace
}  // namespace hetmesh::afd
