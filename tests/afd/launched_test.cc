// A process another launcher started (afd/launched.hpp): each launcher's variables, the innermost
// launcher first, the store's address, the instance a rank is, and what is refused by name.
#include <hetmesh/afd/launched.hpp>

#include <hetmesh/core/error.hpp>

#include "test_support.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <string>

namespace hetmesh::afd {
namespace {

using ::testing::HasSubstr;

// An environment of exactly these variables.
EnvironmentLookup env(std::map<std::string, std::string> variables) {
  auto values = std::make_shared<std::map<std::string, std::string>>(std::move(variables));
  return [values](const char* name) -> const char* {
    auto it = values->find(name);
    return it == values->end() ? nullptr : it->second.c_str();
  };
}

// What refuses a launcher's environment: always an invalid argument.
std::string refusal_of(const std::function<void()>& f) {
  return test::error_of(f, HM_ERR_INVALID_ARGUMENT);
}

JobConfig job(int attention, int ffn) {
  JobConfig c;
  c.job.attention = attention;
  c.job.ffn = ffn;
  return c;
}

TEST(Launched, NoLauncherIsNone) {
  EXPECT_FALSE(launched_process(env({{"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "1"}})));
}

TEST(Launched, EachLaunchersVariablesGiveRankSizeAndLocalRank) {
  struct Case {
    std::map<std::string, std::string> variables;
    std::string launcher;
    int rank, size, local_rank;
  };
  const Case cases[] = {
      {{{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"}}, "torchrun", 3, 4, 1},
      {{{"OMPI_COMM_WORLD_RANK", "2"},
        {"OMPI_COMM_WORLD_SIZE", "4"},
        {"OMPI_COMM_WORLD_LOCAL_RANK", "0"}},
       "openmpi",
       2,
       4,
       0},
      {{{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", "1"}}, "slurm", 1, 4, 1},
      {{{"LWS_WORKER_INDEX", "2"}, {"LWS_GROUP_SIZE", "3"}}, "leaderworkerset", 2, 3, 0},
      {{{"JOB_COMPLETION_INDEX", "5"}}, "kubernetes", 5, -1, 0},
  };
  for (const Case& c : cases) {
    auto p = launched_process(env(c.variables));
    ASSERT_TRUE(p) << c.launcher;
    EXPECT_EQ(p->launcher, c.launcher);
    EXPECT_EQ(p->rank, c.rank) << c.launcher;
    EXPECT_EQ(p->size, c.size) << c.launcher;
    EXPECT_EQ(p->local_rank, c.local_rank) << c.launcher;
    EXPECT_EQ(p->store, "") << c.launcher;
  }
}

// mpirun or torchrun inside a Slurm allocation: every process sees the batch step's SLURM_PROCID.
TEST(Launched, TheInnermostLauncherWins) {
  auto p = launched_process(env({{"SLURM_PROCID", "0"},
                                 {"SLURM_NTASKS", "1"},
                                 {"OMPI_COMM_WORLD_RANK", "3"},
                                 {"OMPI_COMM_WORLD_SIZE", "4"}}));
  ASSERT_TRUE(p);
  EXPECT_EQ(p->launcher, "openmpi");
  EXPECT_EQ(p->rank, 3);
  p = launched_process(env({{"OMPI_COMM_WORLD_RANK", "0"}, {"RANK", "2"}, {"WORLD_SIZE", "4"}}));
  ASSERT_TRUE(p);
  EXPECT_EQ(p->launcher, "torchrun");
  EXPECT_EQ(p->rank, 2);
}

TEST(Launched, TheStoreIsAtTheMasterAddressAndUnderTorchrunThePortAfterIt) {
  auto p = launched_process(env({{"SLURM_PROCID", "0"},
                                 {"SLURM_NTASKS", "2"},
                                 {"MASTER_ADDR", "node7"},
                                 {"MASTER_PORT", "29500"}}));
  ASSERT_TRUE(p);
  EXPECT_EQ(p->store, "node7:29500");
  p = launched_process(env(
      {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "node7"}, {"MASTER_PORT", "29500"}}));
  ASSERT_TRUE(p);
  EXPECT_EQ(p->store, "node7:29501");
  p = launched_process(env({{"LWS_WORKER_INDEX", "1"},
                            {"LWS_GROUP_SIZE", "2"},
                            {"LWS_LEADER_ADDRESS", "leader.svc"},
                            {"MASTER_PORT", "7000"}}));
  ASSERT_TRUE(p);
  EXPECT_EQ(p->store, "leader.svc:7000");
  // An IPv6 master address is bracketed, or the store's address would be ambiguous.
  p = launched_process(env({{"OMPI_COMM_WORLD_RANK", "0"},
                            {"OMPI_COMM_WORLD_SIZE", "2"},
                            {"MASTER_ADDR", "fd00::7"},
                            {"MASTER_PORT", "29500"}}));
  ASSERT_TRUE(p);
  EXPECT_EQ(p->store, "[fd00::7]:29500");
}

TEST(Launched, MalformedValuesAreRefusedNamingTheVariable) {
  EXPECT_THAT(refusal_of([] {
                launched_process(env({{"RANK", "one"}, {"WORLD_SIZE", "2"}}));
              }),
              HasSubstr("RANK=\"one\""));
  EXPECT_THAT(refusal_of([] {
                launched_process(env({{"RANK", "1"}}));
              }),
              HasSubstr("WORLD_SIZE=\"\""));
  EXPECT_THAT(refusal_of([] {
                launched_process(env({{"SLURM_PROCID", "4"}, {"SLURM_NTASKS", "4"}}));
              }),
              HasSubstr("SLURM_PROCID=4 is not below SLURM_NTASKS=4"));
  EXPECT_THAT(
      refusal_of([] {
        launched_process(env({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "0"}}));
      }),
      HasSubstr("OMPI_COMM_WORLD_SIZE=\"0\""));
  EXPECT_THAT(
      refusal_of([] {
        launched_process(env(
            {{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "65535"}}));
      }),
      HasSubstr("no port after it"));
}

TEST(Launched, RanksAreTheAttentionInstancesThenTheFfnInstances) {
  LaunchedProcess p{"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", 0, 5, 0, ""};
  const JobConfig c = job(2, 3);
  const std::pair<Role, int> want[] = {
      {Role::attention, 0}, {Role::attention, 1}, {Role::ffn, 0}, {Role::ffn, 1}, {Role::ffn, 2}};
  for (int rank = 0; rank < 5; ++rank) {
    p.rank = rank;
    EXPECT_EQ(instance_of(p, c), want[rank]) << rank;
  }
}

TEST(Launched, ASizeOtherThanTheJobsOrARankPastItIsRefused) {
  LaunchedProcess p{"slurm", "SLURM_PROCID", "SLURM_NTASKS", 0, 3, 0, ""};
  EXPECT_THAT(refusal_of([&] { instance_of(p, job(2, 2)); }),
              HasSubstr("slurm started 3 processes (SLURM_NTASKS=3); the job has 2 attention + "
                        "2 ffn = 4 instances"));
  LaunchedProcess indexed{"kubernetes", "JOB_COMPLETION_INDEX", "", 4, -1, 0, ""};
  EXPECT_THAT(refusal_of([&] { instance_of(indexed, job(2, 2)); }),
              HasSubstr("JOB_COMPLETION_INDEX=4 is past the job's 2 attention + 2 ffn = 4 "
                        "instances (ranks 0..3)"));
  indexed.rank = 3;
  EXPECT_EQ(instance_of(indexed, job(2, 2)), std::make_pair(Role::ffn, 1));
}

TEST(Launched, TheDeviceAtTheLocalRankKeepsTheConfigsPlugin) {
  LaunchedProcess p;
  p.local_rank = 3;
  EXPECT_EQ(device_at_local_rank("cuda:0", p), "cuda:3");
  EXPECT_EQ(device_at_local_rank("cpu", p), "cpu:3");
}

}  // namespace
}  // namespace hetmesh::afd
