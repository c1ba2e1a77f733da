// The rendezvous store: the TCP store's operations, blocking gets across threads and processes,
// the reusable barrier, Rendezvous across real processes (2A2F), a store that dies, and a store
// fed malformed frames.
//
// The binary doubles as its own helper process:
//   rendezvous_test --serve-store               hosts a store, prints "ADDRESS <host:port>", and
//                                               runs until its stdin closes
//   rendezvous_test --set <address> <key> <value>   waits for "go" on stdin, then sets the key
//   rendezvous_test --instance <address> <job> <role> <rank>   one instance of a 2A2F rendezvous
#include <hetmesh/core/log.hpp>
#include <hetmesh/core/membership.hpp>
#include <hetmesh/core/rendezvous.hpp>
#include <hetmesh/core/subprocess.hpp>

#include "etcd_server.hpp"
#include "test_support.hpp"

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <iostream>
#include <mutex>
#include <thread>
#include <tuple>

namespace hetmesh {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using Bytes = std::vector<uint8_t>;
using test::LogCapture;
namespace fs = std::filesystem;

// The bound on whatever should happen promptly: far beyond it on any loaded machine.
constexpr milliseconds kWait{20000};

Bytes bytes(const std::string& text) {
  return Bytes(text.begin(), text.end());
}

milliseconds since(Clock::time_point start) {
  return std::chrono::duration_cast<milliseconds>(Clock::now() - start);
}

// "<text after prefix>" of a helper's line, or a test failure.
std::string after(const std::string& line, const std::string& prefix) {
  EXPECT_EQ(line.rfind(prefix + " ", 0), 0u) << "expected '" << prefix << " ...', got: " << line;
  return line.substr(std::min(line.size(), prefix.size() + 1));
}

// ---- helper processes ----------------------------------------------------------------------

int serve_store() {
  TcpStoreServer server("127.0.0.1:0");
  std::cout << "ADDRESS " << server.address() << std::endl;
  std::string line;
  while (std::getline(std::cin, line)) {
  }
  return 0;
}

// A store named on a helper's command line: the TCP store's "host:port", or
// "etcd|ENDPOINT|PREFIX" (whose owned keys live on a 5 s lease).
std::unique_ptr<KeyValueStore> connect_spec(const std::string& spec) {
  if (!spec.starts_with("etcd|")) return connect_tcp_store(spec, kWait);
  auto bar = spec.find('|', 5);
  EtcdOptions options;
  options.endpoint = spec.substr(5, bar - 5);
  options.prefix = spec.substr(bar + 1);
  options.lease_ttl = std::chrono::seconds(5);
  return connect_etcd_store(options, kWait);
}

int set_when_told(const std::string& address, const std::string& key, const std::string& value) {
  auto store = connect_spec(address);
  std::cout << "CONNECTED x" << std::endl;
  std::string line;
  if (!std::getline(std::cin, line) || line != "go") return 2;
  store->set(key, bytes(value));
  return 0;
}

// Sets `key` as this process's own and "job/shared" as a job key, says "SET", then waits to be
// killed.
int own_and_wait(const std::string& spec, const std::string& key) {
  auto store = connect_spec(spec);
  store->own_keys(key);
  store->set(key, bytes("mine"));
  store->set("job/shared", bytes("the job's"));
  std::cout << "SET x" << std::endl;
  std::string line;
  while (std::getline(std::cin, line)) {
  }
  return 0;
}

std::string endpoint_of(const std::string& role, int rank) {
  return "endpoint of " + role + " " + std::to_string(rank);
}

// One instance of a 2A2F job: publishes its endpoint, waits for the world, checks every peer's
// endpoint, meets the others at a barrier twice, and leaves.
int run_instance(const std::string& address, const std::string& job, const std::string& role,
                 int rank) {
  try {
    auto store = connect_spec(address);
    Rendezvous rendezvous(*store, job, role, rank);
    rendezvous.publish("endpoint", bytes(endpoint_of(role, rank)));
    rendezvous.wait_for_world(2, 2, kWait);
    for (const char* peer_role : {"attention", "ffn"})
      for (int peer = 0; peer < 2; ++peer)
        if (rendezvous.fetch(peer_role, peer, "endpoint", kWait) !=
            bytes(endpoint_of(peer_role, peer))) {
          std::cerr << role << rank << ": wrong endpoint for " << peer_role << peer << "\n";
          return 1;
        }
    barrier(*store, job + "/fetched", 4, kWait);
    barrier(*store, job + "/fetched", 4, kWait);
    rendezvous.leave();
    std::cout << "OK " << role << " " << rank << std::endl;
    return 0;
  } catch (const std::exception& e) {
    std::cerr << role << rank << ": " << e.what() << "\n";
    return 1;
  }
}

// A store hosted in a child process, so the test can kill it.
class ChildStore {
 public:
  ChildStore() : child_({self_executable(), "--serve-store"}) {
    address_ = after(child_.read_line(kWait), "ADDRESS");
  }
  const std::string& address() const { return address_; }
  ChildProcess& process() { return child_; }

 private:
  ChildProcess child_;
  std::string address_;
};

// ---- the store's operations ----------------------------------------------------------------

class RendezvousTcpStore : public testing::Test {
 protected:
  TcpStoreServer server_{"127.0.0.1:0"};
  std::unique_ptr<KeyValueStore> store_ = connect_tcp_store(server_.address(), kWait);
};

// The stores every rendezvous test runs against: the embedded TCP store, and a real etcd (one
// for the whole binary, each test under a prefix of its own).
class StoreUnderTest {
 public:
  virtual ~StoreUnderTest() = default;
  virtual std::unique_ptr<KeyValueStore> client() = 0;
  // How a helper process names it (connect_spec).
  virtual std::string spec() const = 0;
};

class TcpUnderTest : public StoreUnderTest {
 public:
  std::unique_ptr<KeyValueStore> client() override {
    return connect_tcp_store(server_.address(), kWait);
  }
  std::string spec() const override { return server_.address(); }

 private:
  TcpStoreServer server_{"127.0.0.1:0"};
};

class EtcdUnderTest : public StoreUnderTest {
 public:
  std::unique_ptr<KeyValueStore> client() override { return etcd().client(prefix_); }
  std::string spec() const override { return "etcd|" + etcd().endpoint() + "|" + prefix_; }
  static test::EtcdServer& etcd() {
    static test::EtcdServer server;
    return server;
  }

 private:
  std::string prefix_ = fmt::format("test-{}-{}/", getpid(), next_++);
  static inline std::atomic<int> next_{0};
};

class RendezvousStore : public testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "etcd") {
      HETMESH_REQUIRE_ETCD_OR_SKIP();
      under_ = std::make_unique<EtcdUnderTest>();
    } else {
      under_ = std::make_unique<TcpUnderTest>();
    }
    store_ = under_->client();
  }
  std::unique_ptr<StoreUnderTest> under_;
  std::unique_ptr<KeyValueStore> store_;
};

INSTANTIATE_TEST_SUITE_P(Stores, RendezvousStore, testing::Values("tcp", "etcd"),
                         [](const auto& store) { return store.param; });

TEST_F(RendezvousTcpStore, ReportsTheRealPort) {
  EXPECT_EQ(server_.address().rfind("127.0.0.1:", 0), 0u) << server_.address();
  EXPECT_NE(server_.address(), "127.0.0.1:0");
  EXPECT_EQ(store_->describe(), "tcp store " + server_.address());
}

TEST_P(RendezvousStore, SetGetTryGetAddErase) {
  store_->set("a", {1, 2, 3});
  EXPECT_EQ(store_->get("a", milliseconds(100)), (Bytes{1, 2, 3}));
  EXPECT_EQ(store_->try_get("a"), (Bytes{1, 2, 3}));
  EXPECT_EQ(store_->try_get("missing"), std::nullopt);

  store_->set("a", {});  // replaced, and an empty value is a value
  EXPECT_EQ(store_->try_get("a"), Bytes{});

  EXPECT_EQ(store_->add("counter", 5), 5);
  EXPECT_EQ(store_->add("counter", -7), -2);
  EXPECT_EQ(store_->add("counter", 0), -2);
  EXPECT_EQ(store_->get("counter", milliseconds(100)), bytes("-2"));  // decimal text

  store_->erase("a");
  EXPECT_EQ(store_->try_get("a"), std::nullopt);
  store_->erase("a");  // erasing a missing key is fine

  Bytes big(1 << 20);
  for (size_t i = 0; i < big.size(); ++i)
    big[i] = static_cast<uint8_t>(i * 7);
  store_->set("big", big);
  EXPECT_EQ(store_->get("big", milliseconds(1000)), big);
}

TEST_P(RendezvousStore, AddRefusesValuesThatAreNotCounters) {
  store_->set("blob", {0xff, 0x00});
  try {
    store_->add("blob", 1);
    FAIL() << "added to a blob";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), HM_ERR_INVALID_ARGUMENT);
    EXPECT_NE(
        std::string(e.what()).find("add to 'blob': the key holds a value that is not a counter"),
        std::string::npos)
        << e.what();
  }
  store_->set("max", bytes(std::to_string(INT64_MAX)));
  EXPECT_THROW(store_->add("max", 1), Error);
  EXPECT_EQ(store_->add("max", -1), INT64_MAX - 1);  // the connection is still fine
}

TEST_P(RendezvousStore, RejectsOversizedKeysAndValuesBeforeSending) {
  try {
    store_->set(std::string(KeyValueStore::kMaxKeyBytes + 1, 'k'), {1});
    FAIL() << "accepted a 4 KiB + 1 key";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), HM_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(e.what()).find("key of 4097 bytes is outside 1..4096"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(store_->set("", {1}), Error);
  EXPECT_THROW(store_->set("v", Bytes(KeyValueStore::kMaxValueBytes + 1)), Error);
  store_->set(std::string(KeyValueStore::kMaxKeyBytes, 'k'), {1});  // the limits are inclusive
  EXPECT_EQ(store_->try_get(std::string(KeyValueStore::kMaxKeyBytes, 'k')), Bytes{1});
}

TEST_P(RendezvousStore, GetBlocksUntilAnotherThreadSetsTheKey) {
  auto start = Clock::now();
  std::thread setter([&] {
    auto other = under_->client();
    std::this_thread::sleep_for(milliseconds(300));
    other->set("late", bytes("here"));
  });
  EXPECT_EQ(store_->get("late", kWait), bytes("here"));
  EXPECT_GE(since(start), milliseconds(250));
  setter.join();
}

TEST_P(RendezvousStore, OneThreadsBlockingGetDoesNotHoldUpAnother) {
  // Both threads share one store object: the set must get through while the get waits.
  auto waiting = std::async(std::launch::async, [&] { return store_->get("shared", kWait); });
  std::this_thread::sleep_for(milliseconds(100));
  store_->set("shared", {42});
  EXPECT_EQ(waiting.get(), Bytes{42});
}

TEST_P(RendezvousStore, GetBlocksUntilAnotherProcessSetsTheKey) {
  ChildProcess setter({self_executable(), "--set", under_->spec(), "from/child", "hello"});
  after(setter.read_line(kWait), "CONNECTED");
  auto waiting = std::async(std::launch::async, [&] { return store_->get("from/child", kWait); });
  EXPECT_EQ(waiting.wait_for(milliseconds(200)), std::future_status::timeout);  // still blocked
  setter.write("go\n");
  EXPECT_EQ(waiting.get(), bytes("hello"));
  EXPECT_EQ(setter.wait(kWait).exit_code, 0);
}

TEST_P(RendezvousStore, GetTimeoutNamesTheKeyAndTheStore) {
  auto start = Clock::now();
  try {
    store_->get("job/ffn/1/endpoint", milliseconds(300));
    FAIL() << "got a key nobody set";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), HM_ERR_TIMEOUT);
    EXPECT_EQ(std::string(e.what()),
              store_->describe() + ": key 'job/ffn/1/endpoint' did not appear within 300 ms");
  }
  EXPECT_GE(since(start), milliseconds(290));
  EXPECT_LT(since(start), kWait);
  store_->set("after", {1});  // a timed-out get leaves the store usable
  EXPECT_EQ(store_->try_get("after"), Bytes{1});
}

TEST(RendezvousConnect, RetriesUntilTheServerIsUp) {
  // Find a free port, then start a store on it only after the client has begun dialing.
  std::string address;
  { address = TcpStoreServer("127.0.0.1:0").address(); }
  std::unique_ptr<TcpStoreServer> server;
  std::thread late([&] {
    std::this_thread::sleep_for(milliseconds(300));
    server = std::make_unique<TcpStoreServer>(address);
  });
  auto start = Clock::now();
  auto store = connect_tcp_store(address, kWait);
  late.join();
  EXPECT_GE(since(start), milliseconds(250));
  store->set("k", {1});
  EXPECT_EQ(store->try_get("k"), Bytes{1});
}

TEST(RendezvousConnect, TimesOutWhenNoServerComes) {
  std::string address;
  { address = TcpStoreServer("127.0.0.1:0").address(); }
  auto start = Clock::now();
  try {
    connect_tcp_store(address, milliseconds(300));
    FAIL() << "connected to nothing";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), HM_ERR_TIMEOUT);
    EXPECT_NE(
        std::string(e.what()).find("cannot connect to tcp store " + address + " within 300 ms"),
        std::string::npos)
        << e.what();
  }
  EXPECT_LT(since(start), kWait);
  EXPECT_THROW(connect_tcp_store("no-port-here", milliseconds(10)), Error);
}

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

// ---- membership: epochs and the member log --------------------------------------------------

TEST_P(RendezvousStore, CloneIsAClientOfItsOwn) {
  store_->set("k", {7});
  const std::string described = store_->describe();
  auto clone = store_->clone();
  store_.reset();  // the clone outlives the client it came from
  EXPECT_EQ(clone->try_get("k"), Bytes{7});
  EXPECT_EQ(clone->describe(), described);
}

// Each start of an instance is a new epoch; what it published lives under that epoch, its
// predecessor's goes, and only a replacement is announced.
TEST_P(RendezvousStore, EpochsCountUpAndBlobsFollowTheirEpoch) {
  Membership first(*store_, "job", "ffn", 1);
  EXPECT_EQ(first.join({{"endpoint", bytes("one")}}), 1u);
  Membership reader(*store_, "job", "attention", 0);
  EXPECT_EQ(reader.current_epoch("ffn", 1, milliseconds(100)), 1u);
  EXPECT_EQ(reader.fetch("ffn", 1, 1, "endpoint", milliseconds(100)), bytes("one"));
  MemberWatch watch(*store_, "job", milliseconds(1000));
  EXPECT_EQ(watch.next(milliseconds(20)), std::nullopt);  // a first start is no replacement

  Membership second(*store_, "job", "ffn", 1);
  EXPECT_EQ(second.join({{"endpoint", bytes("two")}}), 2u);
  EXPECT_EQ(reader.current_epoch("ffn", 1, milliseconds(100)), 2u);
  EXPECT_EQ(reader.fetch("ffn", 1, 2, "endpoint", milliseconds(100)), bytes("two"));
  EXPECT_EQ(store_->try_get("job/ffn/1/e1/endpoint"), std::nullopt);  // the dead one's is gone
  auto announced = watch.next(milliseconds(1000));
  ASSERT_TRUE(announced.has_value());
  EXPECT_EQ(announced->role, "ffn");
  EXPECT_EQ(announced->rank, 1);
  EXPECT_EQ(announced->epoch, 2u);
  EXPECT_EQ(watch.next(milliseconds(20)), std::nullopt);
}

// The member log's bytes are checked like a peer's: a malformed entry is skipped, and an entry
// claimed but never written (its writer died in between) holds up the next only for the patience.
TEST_P(RendezvousStore, MemberWatchSkipsMalformedAndUnwrittenEntries) {
  LogCapture logs;
  store_->add("job/members", 1);
  store_->set("job/members/1", bytes("ffn one 2"));
  store_->add("job/members", 1);  // entry 2: claimed, never written
  store_->add("job/members", 1);
  store_->set("job/members/3", bytes("attention 3 4"));
  MemberWatch watch(*store_, "job", milliseconds(200));
  EXPECT_EQ(watch.next(milliseconds(50)), std::nullopt);  // entry 1, malformed
  auto start = Clock::now();
  std::optional<Incarnation> next;
  while (!next && since(start) < kWait)
    next = watch.next(milliseconds(50));
  ASSERT_TRUE(next.has_value());
  EXPECT_GE(since(start), milliseconds(200));  // waited out the patience for entry 2
  EXPECT_EQ(next->role, "attention");
  EXPECT_EQ(next->rank, 3);
  EXPECT_EQ(next->epoch, 4u);
  EXPECT_TRUE(logs.saw("member log entry 1 is malformed")) << logs.all();
  EXPECT_TRUE(logs.saw("member log entry 2 was claimed but never written")) << logs.all();
}

// ---- etcd: leases, and etcd itself failing ----------------------------------------------------

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

TEST(RendezvousMembers, ParsesOnlyExactEntries) {
  auto ok = parse_member_entry("attention 12 3");
  ASSERT_TRUE(ok.has_value());
  EXPECT_EQ(ok->role, "attention");
  EXPECT_EQ(ok->rank, 12);
  EXPECT_EQ(ok->epoch, 3u);
  for (const char* bad : {"", "ffn", "ffn 1", "ffn 1 1", "ffn 1 0", "gpu 1 2", "ffn -1 2",
                          "ffn 1 -2", "ffn 1 2 ", " ffn 1 2", "ffn  1 2", "ffn 1 2 3", "ffn x 2",
                          "ffn 1 99999999999999999999", "ffn 99999999999 2", "ffn 1 +2"})
    EXPECT_EQ(parse_member_entry(bad), std::nullopt) << "'" << bad << "'";
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

// ---- failures ------------------------------------------------------------------------------

void expect_prompt_loss(const std::function<void()>& call, milliseconds limit) {
  auto start = Clock::now();
  try {
    call();
    ADD_FAILURE() << "the call succeeded without a store";
  } catch (const Error& e) {
    EXPECT_TRUE(e.status() == kStatusPeerLost || e.status() == HM_ERR_TIMEOUT)
        << status_name(e.status()) << ": " << e.what();
    EXPECT_NE(std::string(e.what()).find("tcp store "), std::string::npos) << e.what();
  }
  EXPECT_LT(since(start), limit);
}

// "Promptly": well within the client's own I/O timeout (kWait), so a call that only ended when that
// timeout ran out would fail these checks.
TEST(RendezvousFailure, KilledServerFailsCallsPromptly) {
  ChildStore host;
  auto store = connect_tcp_store(host.address(), kWait);
  store->set("k", {1});
  // One call is blocked in get() when the server dies; later calls start after.
  auto blocked = std::async(std::launch::async, [&] {
    auto start = Clock::now();
    try {
      store->get("never", std::chrono::seconds(60));
    } catch (const Error& e) {
      return std::make_pair(std::string(e.what()), since(start));
    }
    return std::make_pair(std::string("returned"), since(start));
  });
  std::this_thread::sleep_for(milliseconds(200));
  host.process().kill(SIGKILL);
  EXPECT_TRUE(host.process().wait(kWait).signal == SIGKILL);
  auto [message, took] = blocked.get();
  EXPECT_NE(message.find("tcp store " + host.address() + ": get 'never': "), std::string::npos)
      << message;
  EXPECT_NE(message.find("is the store's host still running?"), std::string::npos) << message;
  EXPECT_LT(took, kWait / 2);
  expect_prompt_loss([&] { store->get("k", std::chrono::seconds(60)); }, kWait / 2);
  expect_prompt_loss([&] { store->set("k", {2}); }, kWait / 2);
}

TEST(RendezvousFailure, StoppedServerFailsBlockedGetPromptly) {
  auto server = std::make_unique<TcpStoreServer>("127.0.0.1:0");
  auto store = connect_tcp_store(server->address(), kWait);
  auto start = Clock::now();
  auto blocked = std::async(std::launch::async, [&]() -> hm_status {
    try {
      store->get("never", std::chrono::seconds(60));
      return HM_OK;
    } catch (const Error& e) {
      return e.status();
    }
  });
  std::this_thread::sleep_for(milliseconds(200));
  server.reset();  // must not wait for the get's 60 s
  EXPECT_EQ(blocked.get(), kStatusPeerLost);
  EXPECT_LT(since(start), kWait / 2);
}

// A raw connection to the store, for sending what a real client never would.
class RawClient {
 public:
  explicit RawClient(const std::string& address) {
    size_t colon = address.rfind(':');
    sockaddr_in in{};
    in.sin_family = AF_INET;
    in.sin_port = htons(static_cast<uint16_t>(std::stoi(address.substr(colon + 1))));
    inet_pton(AF_INET, address.substr(0, colon).c_str(), &in.sin_addr);
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    EXPECT_EQ(connect(fd_, reinterpret_cast<sockaddr*>(&in), sizeof in), 0) << std::strerror(errno);
  }
  ~RawClient() { close(fd_); }
  // The client's half of the store's challenge-response, by hand: true if the store accepted
  // `secret`. `client_label` is what the client MACs (the protocol's own label, unless a test
  // forges another).
  bool prove(const JobSecret& secret, const std::string& client_label = "hetmesh store client") {
    Bytes challenge(40), answer(72), verdict(33);
    if (!receive(challenge)) return false;
    std::copy(challenge.begin(), challenge.begin() + 8, answer.begin());
    for (size_t i = 0; i < 32; ++i)
      answer[8 + i] = static_cast<uint8_t>(i * 7 + 3);
    JobSecret::Mac mac = secret.mac(client_label, std::span(challenge).subspan(8, 32),
                                    std::span(answer).subspan(8, 32));
    std::copy(mac.begin(), mac.end(), answer.begin() + 40);
    send_bytes(answer);
    return receive(verdict) && verdict[0] == 0;
  }
  bool receive(Bytes& out) {
    size_t got = 0;
    while (got < out.size()) {
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, static_cast<int>(kWait.count())) <= 0) return false;
      ssize_t n = recv(fd_, out.data() + got, out.size() - got, 0);
      if (n <= 0) return false;
      got += static_cast<size_t>(n);
    }
    return true;
  }
  void send_bytes(const Bytes& data) {
    EXPECT_EQ(send(fd_, data.data(), data.size(), MSG_NOSIGNAL), static_cast<ssize_t>(data.size()));
  }
  // Whether the server closed the connection within the limit (reading and dropping any data).
  bool closed_by_peer(milliseconds limit) {
    auto deadline = Clock::now() + limit;
    while (Clock::now() < deadline) {
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, 50) <= 0) continue;
      char buffer[256];
      ssize_t n = recv(fd_, buffer, sizeof buffer, 0);
      if (n <= 0) return true;
    }
    return false;
  }

 private:
  int fd_ = -1;
};

// A request header as the protocol lays it out (little-endian): magic "HMKV", version, op, zero,
// key length, value length.
Bytes header(uint32_t magic, uint8_t version, uint8_t op, uint32_t key_length,
             uint32_t value_length) {
  Bytes out(16, 0);
  for (int i = 0; i < 4; ++i) {
    out[i] = static_cast<uint8_t>(magic >> (8 * i));
    out[8 + i] = static_cast<uint8_t>(key_length >> (8 * i));
    out[12 + i] = static_cast<uint8_t>(value_length >> (8 * i));
  }
  out[4] = version;
  out[5] = op;
  return out;
}

// ---- the job secret ----

// A client that does not prove the store's secret reads and changes nothing, and the real client
// goes on; the refusal is logged with the client's address. Both halves prove themselves: a
// client never trusts a store that cannot prove the secret back.
TEST(RendezvousSecret, AClientWithoutTheSecretReadsAndChangesNothing) {
  LogCapture log;
  JobSecret secret = JobSecret::generate();
  TcpStoreServer server("127.0.0.1:0", secret);
  auto store = connect_tcp_store(server.address(), kWait, secret);
  store->set("endpoint", {7});
  for (const JobSecret& wrong : {JobSecret::none(), JobSecret::generate()}) {
    try {
      auto stranger = connect_tcp_store(server.address(), kWait, wrong);
      ADD_FAILURE() << "a client with the wrong secret was served";
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), kStatusNotAuthorized) << e.what();
      EXPECT_NE(std::string(e.what()).find("does not hold the job's secret"), std::string::npos)
          << e.what();
    }
    // By hand: the refused connection is closed before any request is read.
    RawClient raw(server.address());
    EXPECT_FALSE(raw.prove(wrong));
    raw.send_bytes(header(0x564b4d48, 2, 1, 8, 1));
    EXPECT_TRUE(raw.closed_by_peer(kWait));
  }
  // A MAC of the server's own label (a reflected answer) is no proof either.
  RawClient reflected(server.address());
  EXPECT_FALSE(reflected.prove(secret, "hetmesh store server"));
  EXPECT_TRUE(log.saw("refused 127.0.0.1:")) << log.all();
  EXPECT_TRUE(log.saw("it does not hold the job's secret")) << log.all();
  EXPECT_EQ(store->try_get("endpoint"), Bytes{7});
  RawClient real(server.address());
  EXPECT_TRUE(real.prove(secret));
  // What the handshake costs a connection (both HMACs and a round trip, on loopback).
  constexpr int kConnections = 200;
  auto start = Clock::now();
  for (int i = 0; i < kConnections; ++i)
    connect_tcp_store(server.address(), kWait, secret)->try_get("endpoint");
  std::printf(
      "[ figure ] a store connection with the secret's handshake and one request: %.3f ms\n",
      std::chrono::duration<double, std::milli>(Clock::now() - start).count() / kConnections);
  // A store that does not hold the client's secret is not the job's store: refused by the client.
  TcpStoreServer other("127.0.0.1:0", JobSecret::generate());
  try {
    connect_tcp_store(other.address(), kWait, secret);
    ADD_FAILURE() << "a client trusted a store without its secret";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), kStatusNotAuthorized) << e.what();
  }
}

// A connection that does not open with the store's hello (an HTTP probe, a client of version 1)
// is closed and logged; one that says nothing costs the store a bounded wait, not a thread forever.
// Connections that say nothing, or half an answer, cost the store no thread and hold no place
// that a client needs: past the 512 that may be opening at once the oldest goes, so more of them
// than the store's 1024 clients (a cap that about a thousand idle connections used to fill) leave
// a new client served within a dial of less than one handshake deadline, and a client already
// connected undisturbed.
TEST(RendezvousSecret, FloodsOfSilentConnectionsKeepNoClientOut) {
  if (!test::raise_descriptor_limit(4096)) GTEST_SKIP() << "needs 4096 descriptors";
  JobSecret secret = JobSecret::generate();
  TcpStoreServer server("127.0.0.1:0", secret);
  auto before = connect_tcp_store(server.address(), kWait, secret);
  before->set("k", {1});
  std::vector<std::unique_ptr<RawClient>> flood;
  for (int i = 0; i < 1100; ++i)
    flood.push_back(std::make_unique<RawClient>(server.address()));
  for (int i = 0; i < 50; ++i) {
    auto& half = flood.emplace_back(std::make_unique<RawClient>(server.address()));
    Bytes challenge(40);
    ASSERT_TRUE(half->receive(challenge));
    half->send_bytes(Bytes(30, 0x41));
  }
  auto after = connect_tcp_store(server.address(), milliseconds(3000), secret);
  EXPECT_EQ(after->try_get("k"), Bytes{1});
  EXPECT_EQ(before->try_get("k"), Bytes{1});
}

TEST(RendezvousSecret, AConnectionThatDoesNotOpenWithTheHelloIsClosed) {
  LogCapture log;
  TcpStoreServer server("127.0.0.1:0");
  RawClient raw(server.address());
  Bytes challenge(40);
  ASSERT_TRUE(raw.receive(challenge));
  raw.send_bytes(
      bytes("GET / HTTP/1.1\r\nHost: x\r\n\r\nGET / HTTP/1.1\r\nHost: "
            "x\r\n\r\n12345678901234567890123456789012"));
  EXPECT_TRUE(raw.closed_by_peer(kWait));
  EXPECT_TRUE(log.saw("did not open with the store's hello")) << log.all();
}

// The store's caps: past its keys or its bytes a set or an add is refused with OUT_OF_MEMORY
// naming the cap, and what it holds stays readable; replacing a value or erasing a key frees
// its share.
TEST(RendezvousLimits, SetsPastTheStoresCapsAreRefused) {
  LogCapture log;
  TcpStoreServer server("127.0.0.1:0", std::nullopt, StoreLimits{4, 1000});
  auto store = connect_tcp_store(server.address(), kWait);
  for (int i = 0; i < 4; ++i)
    store->set(fmt::format("k{}", i), Bytes(10, static_cast<uint8_t>(i)));
  auto refused = [&](auto&& call) {
    try {
      call();
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), HM_ERR_OUT_OF_MEMORY) << e.what();
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(refused([&] { store->set("k4", {1}); }).find("the store holds 4 keys, its cap"),
            std::string::npos);
  EXPECT_NE(refused([&] { store->add("counter", 1); }).find("its cap"), std::string::npos);
  EXPECT_NE(refused([&] { store->set("k0", Bytes(990, 1)); }).find("over its cap of 1000"),
            std::string::npos);
  EXPECT_EQ(store->try_get("k0"), Bytes(10, 0));  // unchanged
  store->set("k0", Bytes(900, 2));                // replacing fits
  store->erase("k1");
  store->set("k4", {4});  // a key freed makes room
  EXPECT_EQ(store->try_get("k4"), Bytes{4});
  EXPECT_TRUE(log.saw("refusing to store 'k4'")) << log.all();
}

// Beyond loopback the store refuses to listen without a secret: anyone could reach it.
TEST(RendezvousSecret, NoStoreListensBeyondLoopbackWithoutASecret) {
  unsetenv(JobSecret::kFileVariable);
  try {
    TcpStoreServer server("0.0.0.0:0");
    ADD_FAILURE() << "listened on 0.0.0.0 without a secret";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), HM_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(e.what()).find("without the job's secret"), std::string::npos)
        << e.what();
  }
  TcpStoreServer with_secret("0.0.0.0:0", JobSecret::generate());  // with one, it may
}

// The secret's file: written 0600, read back the same; refused when others may read it, when it
// is not 64 hex digits, or missing; the environment variable names it for a launcher's children.
TEST(RendezvousSecret, TheSecretFileIsPrivateAndChecked) {
  fs::path dir = fs::path(testing::TempDir()) / fmt::format("secret-{}", getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  JobSecret secret = JobSecret::generate();
  const std::string path = (dir / "job.secret").string();
  secret.write_file(path);
  EXPECT_EQ(fs::status(path).permissions() & fs::perms::all,
            fs::perms::owner_read | fs::perms::owner_write);
  Bytes nonce(32, 1);
  EXPECT_TRUE(JobSecret::same(JobSecret::read_file(path).mac("x", nonce, nonce),
                              secret.mac("x", nonce, nonce)));
  EXPECT_FALSE(
      JobSecret::same(JobSecret::generate().mac("x", nonce, nonce), secret.mac("x", nonce, nonce)));
  EXPECT_THROW(secret.write_file(path), Error);  // never over an existing file
  setenv(JobSecret::kFileVariable, path.c_str(), 1);
  ASSERT_TRUE(JobSecret::from_environment().has_value());
  TcpStoreServer server("127.0.0.1:0");  // both ends take the secret from the environment
  auto store = connect_tcp_store(server.address(), kWait);
  store->set("k", {1});
  EXPECT_THROW(connect_tcp_store(server.address(), kWait, JobSecret::none()), Error);
  unsetenv(JobSecret::kFileVariable);
  auto said = [](const std::string& file) {
    try {
      JobSecret::read_file(file);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  fs::permissions(path, fs::perms::group_read, fs::perm_options::add);
  EXPECT_NE(said(path).find("others may read it"), std::string::npos) << said(path);
  const std::string short_file = (dir / "short").string();
  std::ofstream(short_file) << "abcd\n";
  fs::permissions(short_file, fs::perms::owner_read | fs::perms::owner_write);
  EXPECT_NE(said(short_file).find("expected 64 hex digits"), std::string::npos) << said(short_file);
  EXPECT_NE(said((dir / "missing").string()).find("No such file"), std::string::npos);
  fs::remove_all(dir);
}

TEST(RendezvousFailure, MalformedFramesCloseOnlyThatConnection) {
  LogCapture log;
  TcpStoreServer server("127.0.0.1:0");
  auto store = connect_tcp_store(server.address(), kWait);
  store->set("before", {1});
  constexpr uint32_t kMagic = 0x564b4d48;
  struct Case {
    Bytes frame;
    std::string logged;
  } cases[] = {
      {bytes("GET / HTTP/1.1\r\nHost: x\r\n\r\n"), "malformed request: bad magic"},
      {header(kMagic, 9, 1, 1, 0), "malformed request: protocol version 9"},
      {header(kMagic, 2, 77, 1, 0), "malformed request: unknown op 77"},
      {header(kMagic, 2, 1, 5000, 0), "malformed request: key length 5000 is outside 1..4096"},
      {header(kMagic, 2, 1, 0, 0), "malformed request: key length 0 is outside 1..4096"},
      {header(kMagic, 2, 1, 1, (16u << 20) + 1), "malformed request: set with a value of 16777217"},
      {header(kMagic, 2, 2, 1, 3), "malformed request: get with a value of 3 bytes"},
      {header(kMagic, 2, 4, 1, 0xffffffffu), "malformed request: add with a value of 4294967295"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.logged);
    RawClient raw(server.address());
    ASSERT_TRUE(raw.prove(JobSecret::none()));
    raw.send_bytes(c.frame);
    EXPECT_TRUE(raw.closed_by_peer(kWait));
    EXPECT_TRUE(log.saw(c.logged)) << log.all();
    // The server and its other clients carry on.
    EXPECT_EQ(store->try_get("before"), Bytes{1});
  }
  // A client that dies mid-header costs nothing either.
  {
    RawClient raw(server.address());
    ASSERT_TRUE(raw.prove(JobSecret::none()));
    Bytes partial = header(kMagic, 2, 1, 100, 100);
    partial.resize(10);
    raw.send_bytes(partial);
  }
  EXPECT_TRUE(log.saw("request header: connection closed mid-frame")) << log.all();
  auto fresh = connect_tcp_store(server.address(), kWait);
  fresh->set("after", {2});
  EXPECT_EQ(store->get("after", milliseconds(1000)), Bytes{2});
}

}  // namespace
}  // namespace hetmesh

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.size() == 1 && args[0] == "--serve-store") return hetmesh::serve_store();
  if (args.size() == 4 && args[0] == "--set")
    return hetmesh::set_when_told(args[1], args[2], args[3]);
  if (args.size() == 3 && args[0] == "--own") return hetmesh::own_and_wait(args[1], args[2]);
  if (args.size() == 5 && args[0] == "--instance")
    return hetmesh::run_instance(args[1], args[2], args[3], std::stoi(args[4]));
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
