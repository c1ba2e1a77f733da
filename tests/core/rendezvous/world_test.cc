// The reusable barrier, and Rendezvous: a 2A2F world meeting across real processes, what a
// timeout says is missing, identities it refuses.
#include "rendezvous_support.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

namespace hetmesh {
namespace {

using namespace rendezvous_test;

// ---- barrier -------------------------------------------------------------------------------

TEST_P(RendezvousStore, ReusedByManyThreadsManyTimes) {
  constexpr int kThreads = 5, kRounds = 6;
  std::atomic<int> entered[kRounds] = {};
  std::atomic<int> violations{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      auto store = under_->client();
      for (int round = 0; round < kRounds; ++round) {
        // Stagger arrivals so the early ones really wait.
        std::this_thread::sleep_for(milliseconds((t * 7 + round * 3) % 20));
        entered[round]++;
        barrier(*store, "step", kThreads, kWait);
        // Nobody passes round r before everyone has entered it.
        if (entered[round] != kThreads) violations++;
      }
    });
  for (auto& t : threads)
    t.join();
  EXPECT_EQ(violations, 0);
  // Finished generations clean up after themselves: only the last round's key is left.
  auto store = under_->client();
  EXPECT_EQ(store->try_get("barrier/step/done/" + std::to_string(kRounds - 2)), std::nullopt);
  EXPECT_TRUE(store->try_get("barrier/step/done/" + std::to_string(kRounds - 1)));
}

TEST_P(RendezvousStore, TimeoutSaysHowManyArrived) {
  auto store = under_->client();
  try {
    barrier(*store, "lonely", 3, milliseconds(200));
    FAIL() << "a barrier of 3 let one through";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), HM_ERR_TIMEOUT);
    EXPECT_NE(std::string(e.what()).find("barrier 'lonely' (round 0): only 1 of 3 arrived within "
                                         "200 ms"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(barrier(*store, "empty", 0, milliseconds(10)), Error);
}

// ---- Rendezvous ----------------------------------------------------------------------------

TEST_P(RendezvousStore, TwoAttentionTwoFfnAcrossProcesses) {
  std::vector<std::unique_ptr<ChildProcess>> instances;
  for (const char* role : {"attention", "ffn"})
    for (int rank = 0; rank < 2; ++rank)
      instances.push_back(std::make_unique<ChildProcess>(std::vector<std::string>{
          self_executable(), "--instance", under_->spec(), "job42", role, std::to_string(rank)}));
  for (auto& instance : instances) {
    after(instance->read_line(kWait), "OK");
    ProcessResult result = instance->wait(kWait);
    EXPECT_EQ(result.exit_code, 0) << result.describe();
  }
  // The host waits for a clean departure before it lets the store go.
  auto store = under_->client();
  wait_for_departure(*store, "job42", 2, 2, milliseconds(1000));
  Rendezvous observer(*store, "job42", "attention", 0);
  EXPECT_TRUE(observer.has_left("ffn", 1));
  EXPECT_EQ(observer.fetch("ffn", 1, "endpoint", milliseconds(100)), bytes(endpoint_of("ffn", 1)));
}

TEST_P(RendezvousStore, TimeoutListsTheMissingInstances) {
  auto store = under_->client();
  Rendezvous alone(*store, "job7", "attention", 0);
  try {
    alone.wait_for_world(1, 2, milliseconds(300));
    FAIL() << "a world of three met with one";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), HM_ERR_TIMEOUT);
    EXPECT_NE(std::string(e.what()).find("job 'job7': 2 of 3 instance(s) not ready within 300 ms: "
                                         "ffn/0, ffn/1"),
              std::string::npos)
        << e.what();
  }
  try {
    wait_for_departure(*store, "job7", 1, 0, milliseconds(100));
    FAIL() << "departed without leaving";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not left within 100 ms: attention/0"), std::string::npos)
        << e.what();
  }
  alone.leave();
  alone.leave();  // idempotent
  wait_for_departure(*store, "job7", 1, 0, milliseconds(100));
}

TEST(RendezvousWorld, RejectsBadIdentities) {
  TcpStoreServer server("127.0.0.1:0");
  auto store = connect_tcp_store(server.address(), kWait);
  EXPECT_THROW(Rendezvous(*store, "job", "expert", 0), Error);
  EXPECT_THROW(Rendezvous(*store, "job", "ffn", -1), Error);
  EXPECT_THROW(Rendezvous(*store, "a/b", "ffn", 0), Error);
  EXPECT_THROW(Rendezvous(*store, "", "ffn", 0), Error);
  Rendezvous r(*store, "job", "ffn", 2);
  EXPECT_EQ(r.key("attention", 1, "slots"), "job/attention/1/slots");
  EXPECT_THROW(r.wait_for_world(1, 2, milliseconds(10)), Error);  // rank 2 of 2 F instances
}

}  // namespace
}  // namespace hetmesh
