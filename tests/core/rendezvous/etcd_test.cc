// etcd as the store: leases that take a killed process's own keys, etcd down at the start or
// restarted mid-job, plain HTTP beyond loopback, and etcd with its own authentication on.
#include "etcd_server.hpp"
#include "rendezvous_support.hpp"
#include "test_support.hpp"

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>
#include <tuple>

namespace hetmesh {
namespace {

using namespace rendezvous_test;

// A killed instance's own keys expire with its lease (5 s here), and whoever watches them is
// told; the job's keys it wrote stay.
TEST(RendezvousEtcd, TheOwnKeysOfAKilledProcessExpireAndWatchersAreTold) {
  HETMESH_REQUIRE_ETCD_OR_SKIP();
  EtcdUnderTest etcd;
  auto store = etcd.client();
  ChildProcess owner({self_executable(), "--own", etcd.spec(), "job/ffn/0/e1/endpoint"});
  after(owner.read_line(kWait), "SET");
  EXPECT_FALSE(store->wait_removed("job/ffn/0/e1/endpoint", milliseconds(300)));  // renewed
  owner.kill(SIGKILL);
  owner.wait(kWait);
  EXPECT_TRUE(store->wait_removed("job/ffn/0/e1/endpoint", milliseconds(60000)));
  EXPECT_EQ(store->try_get("job/shared"), bytes("the job's"));
}

// A store on the embedded server keeps a dead process's keys: own_keys means nothing there.
TEST(RendezvousEtcd, TheTcpStoreKeepsOwnKeys) {
  TcpUnderTest tcp;
  auto store = tcp.client();
  ChildProcess owner({self_executable(), "--own", tcp.spec(), "k"});
  after(owner.read_line(kWait), "SET");
  owner.kill(SIGKILL);
  owner.wait(kWait);
  EXPECT_FALSE(store->wait_removed("k", milliseconds(300)));
}

TEST(RendezvousEtcd, EtcdDownAtStartIsAClearError) {
  EtcdOptions options;
  options.endpoint = fmt::format("http://127.0.0.1:{}", test::free_port());
  options.prefix = "job/";
  try {
    connect_etcd_store(options, milliseconds(500));
    FAIL() << "connected to an etcd that is not there";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), HM_ERR_TIMEOUT);
    EXPECT_THAT(e.what(), testing::HasSubstr("etcd store " + options.endpoint +
                                             ": not reachable within 500 ms"));
  }
}

TEST(RendezvousEtcd, PlainHttpBeyondLoopbackIsRefused) {
  EtcdOptions options;
  options.endpoint = "http://192.0.2.10:2379";
  options.prefix = "job/";
  try {
    connect_etcd_store(options, milliseconds(500));
    FAIL() << "trusted plain HTTP beyond loopback";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), HM_ERR_INVALID_ARGUMENT);
    EXPECT_THAT(e.what(),
                testing::HasSubstr("refusing etcd at http://192.0.2.10:2379 without TLS"));
  }
  options.endpoint = "ftp://127.0.0.1:2379";
  EXPECT_THROW(connect_etcd_store(options, milliseconds(500)), Error);
}

// etcd killed mid-job: calls fail by name (never hang) while it is down, and the same client
// works again once it is back, with the keys it held.
TEST(RendezvousEtcd, TheStoreOutlivesARestartOfEtcd) {
  HETMESH_REQUIRE_ETCD_OR_SKIP();
  test::EtcdServer etcd;
  EtcdOptions options;
  options.endpoint = etcd.endpoint();
  options.prefix = "job/";
  auto store = connect_etcd_store(options, kWait);
  store->set("before", {1});
  etcd.kill();
  try {
    store->set("during", {2});
    FAIL() << "a set succeeded with etcd down";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), kStatusPeerLost) << e.what();
    EXPECT_THAT(e.what(), testing::HasSubstr("etcd store " + etcd.endpoint()));
  }
  etcd.start();
  store->set("after", {3});
  EXPECT_EQ(store->try_get("before"), Bytes{1});
  EXPECT_EQ(store->get("after", milliseconds(1000)), Bytes{3});
}

// ---- etcd with its own authentication on ----------------------------------------------------

// A 0600 file holding `password`, in `dir`.
std::string password_file(const test::TempDir& dir, const std::string& name,
                          const std::string& password,
                          std::filesystem::perms mode = std::filesystem::perms::owner_read |
                                                        std::filesystem::perms::owner_write) {
  std::string path = dir.file(name);
  std::ofstream(path) << password << "\n";
  std::filesystem::permissions(path, mode);
  return path;
}

// The error connect_etcd_store throws for `options`, or "" when it connects.
std::pair<hm_status, std::string> refusal_of(const EtcdOptions& options) {
  try {
    auto store = connect_etcd_store(options, kWait);
    store->set("k", {1});
    return {HM_OK, ""};
  } catch (const Error& e) {
    return {e.status(), e.what()};
  }
}

// Where etcd has authentication on, hetmesh logs in as the user named with its password's file:
// the rendezvous and a lease work as that user; no user, a wrong password, a password file others
// may read, and keys beyond the user's permissions are each refused saying what to do.
TEST(RendezvousEtcd, WithAuthenticationOnOnlyItsUserGetsIn) {
  HETMESH_REQUIRE_ETCD_OR_SKIP();
  test::EtcdServer etcd;
  etcd.enable_auth("job", "job-password", "hetmesh/");
  test::TempDir dir;
  EtcdOptions options;
  options.endpoint = etcd.endpoint();
  options.prefix = "hetmesh/job/";
  options.lease_ttl = std::chrono::seconds(5);
  options.user = "job";
  options.password_file = password_file(dir, "password", "job-password");
  auto store = connect_etcd_store(options, kWait);
  store->set("a", {1});
  EXPECT_EQ(store->get("a", milliseconds(1000)), Bytes{1});
  EXPECT_EQ(store->add("n", 2), 2);
  store->own_keys("mine/");
  store->set("mine/endpoint", {2});  // on the user's lease
  EXPECT_FALSE(store->wait_removed("mine/endpoint", milliseconds(300)));
  store->erase("a");
  EXPECT_TRUE(store->wait_removed("a", milliseconds(1000)));

  // Through connect_store, from the environment, as an instance gets them.
  setenv("HETMESH_ETCD_USER", "job", 1);
  setenv("HETMESH_ETCD_PASSWORD_FILE", options.password_file.c_str(), 1);
  auto from_environment = connect_store(etcd.endpoint(), kWait);
  unsetenv("HETMESH_ETCD_USER");
  unsetenv("HETMESH_ETCD_PASSWORD_FILE");
  from_environment->set("job/b", {3});
  EXPECT_EQ(store->add("n", 1), 3);

  EtcdOptions nobody = options;
  nobody.user.clear();
  nobody.password_file.clear();
  auto [status, said] = refusal_of(nobody);
  EXPECT_EQ(status, kStatusNotAuthorized) << said;
  EXPECT_THAT(said, testing::HasSubstr("HETMESH_ETCD_USER"));

  EtcdOptions wrong = options;
  wrong.password_file = password_file(dir, "wrong", "not-the-password");
  std::tie(status, said) = refusal_of(wrong);
  EXPECT_EQ(status, kStatusNotAuthorized) << said;
  EXPECT_THAT(said, testing::HasSubstr("refused user 'job'"));

  EtcdOptions readable = options;
  readable.password_file =
      password_file(dir, "readable", "job-password",
                    std::filesystem::perms::owner_read | std::filesystem::perms::owner_write |
                        std::filesystem::perms::others_read);
  std::tie(status, said) = refusal_of(readable);
  EXPECT_EQ(status, HM_ERR_INVALID_ARGUMENT) << said;
  EXPECT_THAT(said, testing::HasSubstr("others may read it"));

  EtcdOptions elsewhere = options;
  elsewhere.prefix = "other/";
  std::tie(status, said) = refusal_of(elsewhere);
  EXPECT_EQ(status, kStatusNotAuthorized) << said;
  EXPECT_THAT(said, testing::HasSubstr("permission denied"));

  EtcdOptions half = options;
  half.password_file.clear();
  std::tie(status, said) = refusal_of(half);
  EXPECT_EQ(status, HM_ERR_INVALID_ARGUMENT) << said;
  EXPECT_THAT(said, testing::HasSubstr("HETMESH_ETCD_PASSWORD_FILE"));
}

// etcd forgets a login after --auth-token-ttl; the client logs in again, for requests and
// watches alike, without the caller seeing it.
TEST(RendezvousEtcd, AnExpiredLoginIsRenewed) {
  HETMESH_REQUIRE_ETCD_OR_SKIP();
  test::EtcdServer etcd({"--auth-token-ttl", "1"});
  etcd.enable_auth("job", "job-password", "hetmesh/");
  test::TempDir dir;
  EtcdOptions options;
  options.endpoint = etcd.endpoint();
  options.prefix = "hetmesh/job/";
  options.user = "job";
  options.password_file = password_file(dir, "password", "job-password");
  auto store = connect_etcd_store(options, kWait);
  store->set("a", {1});
  std::this_thread::sleep_for(milliseconds(2500));
  EXPECT_EQ(store->get("a", milliseconds(1000)), Bytes{1});
  std::this_thread::sleep_for(milliseconds(2500));
  EXPECT_FALSE(store->wait_removed("a", milliseconds(200)));  // a watch, with a new login
  store->erase("a");
  EXPECT_EQ(store->try_get("a"), std::nullopt);
}

}  // namespace
}  // namespace hetmesh
