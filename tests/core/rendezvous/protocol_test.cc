// The TCP store's protocol limits: past its caps a set or an add is refused, and a malformed frame
// closes only its own connection.
#include <hetmesh/core/socket.hpp>

#include "raw_store_client.hpp"
#include "rendezvous_support.hpp"
#include "test_support.hpp"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <poll.h>

#include <memory>
#include <thread>
#include <vector>

namespace hetmesh {
namespace {

using namespace rendezvous_test;
using test::LogCapture;

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

// Clients that proved the secret and then idle (every instance of a job holds one connection for
// its whole run) cost a descriptor each and no thread: past 1024 of them (the server's old cap of
// a thread per client) both they and a new client are still served.
TEST(RendezvousLimits, ManyIdleClientsDoNotKeepANewOneOut) {
  constexpr size_t kIdle = 1100;
  // Each idle client costs two descriptors here, one at each end.
  if (!test::raise_descriptor_limit(4 * kIdle)) GTEST_SKIP() << "too few descriptors";
  LogCapture log;
  TcpStoreServer server("127.0.0.1:0");
  std::vector<std::unique_ptr<RawClient>> idle;
  for (size_t i = 0; i < kIdle; ++i) {
    idle.push_back(std::make_unique<RawClient>(server.address()));
    ASSERT_TRUE(idle.back()->prove(JobSecret::none())) << "client " << i;
  }
  auto fresh = connect_tcp_store(server.address(), kWait);
  fresh->set("k", {7});
  EXPECT_EQ(fresh->get("k", kWait), Bytes{7});
  // The last of the idle ones is served too: a try_get of "k".
  constexpr uint32_t kMagic = 0x564b4d48;
  Bytes request = header(kMagic, 2, 3, 1, 0);
  request.push_back('k');
  idle.back()->send_bytes(request);
  Bytes reply(13);
  ASSERT_TRUE(idle.back()->receive(reply));
  EXPECT_EQ(reply[5], 0) << "status";  // ok
  EXPECT_EQ(reply[12], 7);
  EXPECT_EQ(log.all().find("refusing"), std::string::npos) << log.all();
}

// A store client that meets something else on the store's port fails at once, naming the store's
// address and what it met: a listener that answers in another protocol (its first bytes, escaped),
// or one that never speaks (the store's hello comes at once; the join's 60 s are not waited).
TEST(RendezvousFailure, AForeignListenerOnTheStoresPortIsNamedAtOnce) {
  for (bool speaks : {true, false}) {
    SCOPED_TRACE(speaks ? "speaks HTTP" : "silent");
    net::Fd listener = net::listen_on(net::resolve("127.0.0.1:0", true, "test").front(), "test");
    const std::string address = net::to_string(net::local_address(listener.get()));
    std::thread foreign([&] {
      pollfd p{listener.get(), POLLIN, 0};
      if (poll(&p, 1, static_cast<int>(kWait.count())) <= 0) return;
      net::Fd fd = net::accept_connection(listener);
      // Shorter than the store's hello, and the connection kept open: a client that waits for a
      // whole hello waits for the join's timeout.
      const std::string answer = "HTTP/1.1 400 Bad Request\r\n\r\n";
      if (speaks) net::send_all(fd.get(), answer.data(), answer.size(), "answer");
      pollfd closed{fd.get(), POLLIN, 0};  // until the client gives up
      poll(&closed, 1, static_cast<int>(kWait.count()));
    });
    const auto start = Clock::now();
    try {
      connect_tcp_store(address, kWait);
      ADD_FAILURE() << "connected to a foreign listener";
    } catch (const Error& e) {
      if (speaks) {
        EXPECT_EQ(e.status(), kStatusProtocolError);
        EXPECT_EQ(std::string(e.what()),
                  "tcp store " + address +
                      ": the listener there is not a hetmesh store: where the store's hello was "
                      "expected, it sent \"HTTP/1.1 400 Bad Request\\r\\n\\r\\n\"");
      } else {
        EXPECT_EQ(e.status(), HM_ERR_TIMEOUT);
        EXPECT_EQ(std::string(e.what()),
                  "tcp store " + address +
                      ": the listener there sent nothing within 5000 ms of the connection, where "
                      "the store's hello comes at once: it is not a hetmesh store (another "
                      "program holds the port?), or the store is wedged");
      }
    }
    EXPECT_LT(since(start), kWait / 2);  // not the whole join timeout
    foreign.join();
  }
}

}  // namespace
}  // namespace hetmesh
