// The store's operations on each store (the embedded TCP store and etcd): set, get, add, erase,
// the key and value limits, blocking gets across threads and processes, a get's timeout; and a
// client dialing a TCP store that is not up yet.
#include "rendezvous_support.hpp"

#include <gtest/gtest.h>

#include <future>
#include <thread>

namespace hetmesh {
namespace {

using namespace rendezvous_test;

class RendezvousTcpStore : public testing::Test {
 protected:
  TcpStoreServer server_{"127.0.0.1:0"};
  std::unique_ptr<KeyValueStore> store_ = connect_tcp_store(server_.address(), kWait);
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

}  // namespace
}  // namespace hetmesh
