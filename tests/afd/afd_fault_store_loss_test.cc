// The store's host killed mid-run: a running job needs its store only for replacements, and
// finishes without it.
#include "afd_fault_support.hpp"
#include "child_output.hpp"

#include <hetmesh/afd/local_job.hpp>
#include <hetmesh/core/subprocess.hpp>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <csignal>
#include <string>
#include <vector>

namespace hetmesh::afd {
namespace {

using namespace fault_test;

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

}  // namespace
}  // namespace hetmesh::afd
