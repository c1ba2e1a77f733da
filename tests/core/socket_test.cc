// The core's socket layer (core/socket.hpp): addresses, connect, listen and accept, and I/O whose
// deadlines hold on blocking sockets, with the statuses the store and the transports report.
#include <hetmesh/core/socket.hpp>

#include "test_support.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>

#include <thread>

namespace hetmesh::net {
namespace {

using std::chrono::milliseconds;

using test::error_of;
using ::testing::HasSubstr;

// A listener on the loopback and one connection to it, from both ends.
struct Pair {
  Pair() {
    listener = listen_on(resolve("127.0.0.1:0", true, "test address").front(), "the test");
    address = to_string(local_address(listener.get()));
    client = connect_with_retry(resolve(address, false, "test address"), milliseconds(2000),
                                milliseconds(5), "the test listener");
    for (int i = 0; i < 200 && !server; ++i) {
      server = accept_connection(listener);
      if (!server) std::this_thread::sleep_for(milliseconds(5));
    }
  }
  Fd listener, client, server;
  std::string address;
};

TEST(SocketAddressTest, ResolvesAndFormatsHostPort) {
  auto v4 = resolve("127.0.0.1:29500", false, "store address");
  ASSERT_EQ(v4.size(), 1u);
  EXPECT_EQ(v4[0].family(), AF_INET);
  EXPECT_EQ(to_string(v4[0]), "127.0.0.1:29500");
  auto v6 = resolve("[::1]:7", false, "store address");
  ASSERT_EQ(v6.size(), 1u);
  EXPECT_EQ(to_string(v6[0]), "[::1]:7");
  EXPECT_EQ(to_string(unix_abstract("hetmesh-1", "a test")), "@hetmesh-1");
}

TEST(SocketAddressTest, RefusesWhatIsNotHostPort) {
  for (const char* text : {"no-port-here", ":5", "host:"}) {
    EXPECT_EQ(error_of([&] { resolve(text, false, "store address"); }, HM_ERR_INVALID_ARGUMENT),
              "store address '" + std::string(text) + "' is not host:port");
  }
  error_of([] { unix_abstract("", "socket address 'unix:@'"); }, HM_ERR_INVALID_ARGUMENT);
}

TEST(SocketAddressTest, TakesHostPortApartAndPutsItBackTogether) {
  auto v6 = parse_host_port("[fd00::1]:9400");
  ASSERT_TRUE(v6);
  EXPECT_EQ(v6->host, "fd00::1");
  EXPECT_EQ(v6->port, 9400);
  EXPECT_EQ(join_host_port(v6->host, v6->port), "[fd00::1]:9400");
  EXPECT_EQ(join_host_port("[fd00::1]", 1), "[fd00::1]:1");
  EXPECT_EQ(join_host_port("node7", 65535), "node7:65535");
  EXPECT_EQ(parse_host_port("node7:0")->port, 0);
  for (const char* text : {"::1:29500", "[::1:29500", "::1]:29500", "[]:5", "h:65536", "h:-1",
                           "h:5x", "h: 5", "h:", ":5", "h"})
    EXPECT_FALSE(parse_host_port(text)) << text;
}

TEST(SocketTest, ConnectedSocketsAreBlockingWithNoDelay) {
  Pair pair;
  ASSERT_TRUE(pair.client && pair.server);
  for (int fd : {pair.client.get(), pair.server.get()}) {
    EXPECT_EQ(fcntl(fd, F_GETFL) & O_NONBLOCK, 0);
    int nodelay = 0;
    socklen_t length = sizeof nodelay;
    getsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &nodelay, &length);
    EXPECT_NE(nodelay, 0);
  }
}

TEST(SocketTest, SendsTwoBuffersAndReceivesThemWhole) {
  Pair pair;
  std::string head = "head", body(1 << 20, 'b');
  std::thread sender([&] {
    send_two(pair.client.get(), head.data(), head.size(), body.data(), body.size(), "frame");
  });
  std::string got(head.size() + body.size(), '\0');
  recv_all(pair.server.get(), got.data(), got.size(), "frame", Clock::now() + milliseconds(5000));
  sender.join();
  EXPECT_EQ(got, head + body);
}

TEST(SocketTest, ACloseIsCleanBeforeAFrameAndPeerLostWithinOne) {
  Pair pair;
  char byte = 'x';
  send_all(pair.client.get(), &byte, 1, "one byte");
  pair.client.reset();
  char buffer[4];
  EXPECT_THAT(error_of([&] { recv_exact(pair.server.get(), buffer, 4, "request header"); },
                       kStatusPeerLost),
              HasSubstr("receiving request header: connection closed mid-frame"));
  EXPECT_FALSE(recv_exact(pair.server.get(), buffer, 4, "request"));
  EXPECT_THAT(
      error_of([&] { recv_all(pair.server.get(), buffer, 4, "frame header"); }, kStatusPeerLost),
      HasSubstr("receiving frame header: the peer closed the connection"));
}

TEST(SocketTest, DeadlinesHoldOnBlockingSockets) {
  Pair pair;
  char buffer[4];
  EXPECT_EQ(error_of(
                [&] {
                  recv_all(pair.server.get(), buffer, 4, "the reply",
                           Clock::now() + milliseconds(100));
                },
                HM_ERR_TIMEOUT),
            "receiving the reply: timed out");
  // A peer that reads nothing: the send fills the buffers, then times out.
  std::string big(64 << 20, 'z');
  EXPECT_EQ(error_of(
                [&] {
                  send_all(pair.client.get(), big.data(), big.size(), "a flood",
                           Clock::now() + milliseconds(200));
                },
                HM_ERR_TIMEOUT),
            "sending a flood: timed out");
}

TEST(SocketTest, ConnectingToNobodyTimesOut) {
  std::string address;
  {
    Fd gone = listen_on(resolve("127.0.0.1:0", true, "test address").front(), "the test");
    address = to_string(local_address(gone.get()));
  }
  auto start = Clock::now();
  EXPECT_THAT(error_of(
                  [&] {
                    connect_with_retry(resolve(address, false, "test address"), milliseconds(200),
                                       milliseconds(5), "nobody");
                  },
                  HM_ERR_TIMEOUT),
              HasSubstr("cannot connect to nobody within 200 ms"));
  EXPECT_GE(Clock::now() - start, milliseconds(200));
}

TEST(SocketTest, ListeningOnAnAddressInUseIsAnInvalidArgument) {
  Pair pair;
  EXPECT_THAT(
      error_of(
          [&] { listen_on(resolve(pair.address, true, "test address").front(), pair.address); },
          HM_ERR_INVALID_ARGUMENT),
      HasSubstr("cannot listen on " + pair.address));
}

}  // namespace
}  // namespace hetmesh::net
