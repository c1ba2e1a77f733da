// The link handshake (backends/src/common/socket_link.*) that every connection of the tcp, ipc and
// verbs transports passes: the two ends prove the job's secret to each other before either gets
// the socket. A stranger, a forged proof, a duplicate of a peer's id, floods of silent and
// half-sent connections and a listener out of descriptors are refused or outlasted, and the real
// peer still connects.
//
// The binary doubles as the listener of the descriptor case, in a process of its own with few
// descriptors:
//   link_test --listen <secret file>   prints "ADDRESS <address>", accepts peer kPeerId, reads one
//                                      byte from it, and exits 0 if it was 'x'
//   link_test --dial-as-nobody <address>  becomes user 65534 and dials; prints how it ended
#include "common/socket_link.hpp"

#include <hetmesh/core/log.hpp>
#include <hetmesh/core/subprocess.hpp>
#include <hetmesh/transport/transport.hpp>

#include "test_support.hpp"

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <sys/resource.h>
#include <unistd.h>

#include <fstream>
#include <future>
#include <iostream>
#include <thread>

namespace hetmesh::detail {
namespace {

using namespace std::chrono_literals;
using test::LogCapture;
using ::testing::HasSubstr;

const std::string kListenerId = "8000000000000001";  // sorts after kPeerId: the peer dials
const std::string kPeerId = "0000000000000001";

// One byte each way: the two descriptors are the ends of one live connection.
void expect_linked(const Fd& a, const Fd& b) {
  for (auto [from, to] : {std::pair{&a, &b}, std::pair{&b, &a}}) {
    char sent = 'x', got = 0;
    send_all(from->get(), &sent, 1, "a test byte", net::Clock::now() + 5s);
    recv_all(to->get(), &got, 1, "a test byte", net::Clock::now() + 5s);
    EXPECT_EQ(got, sent);
  }
}

// A plain TCP connection to a listener, which then says what the test makes it say.
Fd raw_connection(const SocketAddress& address) {
  std::string host_port = address.text.substr(std::string_view("tcp://").size());
  return net::connect_with_retry(net::resolve(host_port, false, "listener"), 5s, 5ms, "listener");
}

// The link protocol's frames, mirrored (socket_link.cc) for the tests that forge them.
struct Hello {
  uint32_t magic = 0x4c484d48;
  uint16_t version = 2;
  uint16_t zero = 0;
  char dialer[16];
  char acceptor[16];
  uint8_t nonce[32] = {};
};

Hello hello_from(const std::string& dialer, const std::string& acceptor) {
  Hello h;
  std::memcpy(h.dialer, dialer.data(), 16);
  std::memcpy(h.acceptor, acceptor.data(), 16);
  return h;
}

class LinkTest : public testing::Test {
 protected:
  Fd dial_as(const std::string& id, const JobSecret& secret,
             std::chrono::milliseconds timeout = 10s) {
    return dial(listener_.address(), id, kListenerId, secret, timeout);
  }
  // The status and message a dial throws (it must throw).
  std::pair<hm_status, std::string> refusal(const std::string& id, const JobSecret& secret) {
    try {
      dial_as(id, secret);
    } catch (const Error& e) {
      return {e.status(), e.what()};
    }
    ADD_FAILURE() << "the dial was accepted";
    return {HM_OK, ""};
  }

  JobSecret secret_ = JobSecret::generate();
  Listener listener_{SocketAddress{"tcp://127.0.0.1:0"}, kListenerId, secret_};
};

TEST_F(LinkTest, APeerThatHoldsTheSecretConnects) {
  Fd dialer = dial_as(kPeerId, secret_);
  Fd accepted = listener_.accept_from(kPeerId, 10s);
  expect_linked(dialer, accepted);
  // What a connection costs with its handshake (connect, both HMACs, two round trips, loopback).
  constexpr int kConnections = 200;
  auto start = std::chrono::steady_clock::now();
  for (int i = 1; i <= kConnections; ++i) {
    std::string id = fmt::format("{:016x}", i + 1);
    Fd one = dial_as(id, secret_);
    listener_.accept_from(id, 10s);
  }
  std::printf(
      "[ figure ] a link connection with its handshake: %.3f ms\n",
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() /
          kConnections);
}

// A dialer checks the acceptor's proof first: with another secret, or none, it gives up naming the
// peer, and says what it lacks.
TEST_F(LinkTest, ADialerWithAnotherSecretIsRefusedAndTheRealPeerStillConnects) {
  LogCapture log;
  auto [status, message] = refusal(kPeerId, JobSecret::generate());
  EXPECT_EQ(status, kStatusNotAuthorized);
  EXPECT_THAT(message, HasSubstr("peer 8000000000000001 at tcp://127.0.0.1:"));
  EXPECT_THAT(message, HasSubstr("holds another job secret than this endpoint"));
  std::tie(status, message) = refusal(kPeerId, JobSecret::none());
  EXPECT_EQ(status, kStatusNotAuthorized);
  EXPECT_THAT(message, HasSubstr("this endpoint has none"));
  // The listener logged why, and the id's refusal is named when its owner waits for it.
  EXPECT_TRUE(
      log.saw("claimed to be endpoint 0000000000000001 but does not hold this job's "
              "secret"))
      << log.all();
  try {
    listener_.accept_from(kPeerId, 50ms);
    ADD_FAILURE() << "a refused dialer was handed over";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), HM_ERR_TIMEOUT);
    EXPECT_THAT(e.what(), HasSubstr("(refused: 127.0.0.1:"));
  }
  Fd real = dial_as(kPeerId, secret_);
  expect_linked(real, listener_.accept_from(kPeerId, 10s));
}

// A stranger that ignores the acceptor's proof and forges its own is refused by the acceptor.
TEST_F(LinkTest, AForgedProofIsRefusedByTheListener) {
  Fd stranger = raw_connection(listener_.address());
  Hello hello = hello_from(kPeerId, kListenerId);
  send_all(stranger.get(), &hello, sizeof hello, "hello", net::Clock::now() + 5s);
  uint8_t challenge[72];
  recv_all(stranger.get(), challenge, sizeof challenge, "challenge", net::Clock::now() + 5s);
  EXPECT_EQ(challenge[4], 0) << "the challenge's verdict";
  uint8_t proof[40] = {0x48, 0x4d, 0x48, 0x4c};
  for (size_t i = 8; i < sizeof proof; ++i)
    proof[i] = static_cast<uint8_t>(i * 37);
  send_all(stranger.get(), proof, sizeof proof, "proof", net::Clock::now() + 5s);
  uint8_t outcome[8];
  recv_all(stranger.get(), outcome, sizeof outcome, "outcome", net::Clock::now() + 5s);
  EXPECT_EQ(outcome[4], 2) << "the verdict: not proven";
  EXPECT_TRUE(net::hung_up(stranger.get()) || [&] {
    char c;
    return !net::recv_exact(stranger.get(), &c, 1, "end", net::Clock::now() + 5s);
  }()) << "the listener kept a stranger's connection open";
  Fd real = dial_as(kPeerId, secret_);
  expect_linked(real, listener_.accept_from(kPeerId, 10s));
}

// The id of a peer that is waiting to be accepted, or already was, cannot be taken over: the
// second connection claiming it is refused, and the first is the one handed over and kept.
TEST_F(LinkTest, ASecondConnectionClaimingAPeersIdIsRefusedAndTheFirstStays) {
  Fd first = dial_as(kPeerId, secret_);
  auto [status, message] = refusal(kPeerId, secret_);  // the first still waits to be accepted
  EXPECT_EQ(status, kStatusProtocolError);
  EXPECT_THAT(message, HasSubstr("already has a connection from endpoint 0000000000000001"));
  Fd accepted = listener_.accept_from(kPeerId, 10s);
  std::tie(status, message) = refusal(kPeerId, secret_);  // the first was handed over
  EXPECT_EQ(status, kStatusProtocolError);
  expect_linked(first, accepted);
}

// A dialer that gave up on its connection before it was asked for (it hung up) and dials again,
// as a rail coming back does, is admitted: the new connection takes the abandoned one's place.
// (Before, the second dial was refused: "already has a connection from endpoint ...".)
TEST_F(LinkTest, AConnectionItsDialerHungUpOnGivesWayToItsNextTry) {
  dial_as(kPeerId, secret_).reset();  // proven, then hung up on before anyone asked for it
  Fd again = dial_as(kPeerId, secret_);
  expect_linked(again, listener_.accept_from(kPeerId, 10s));
}

TEST_F(LinkTest, AHelloForAnotherEndpointIsRefused) {
  try {
    dial(listener_.address(), kPeerId, "00000000000000ff", secret_, 10s);
    ADD_FAILURE() << "a hello for another endpoint was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), kStatusPeerLost);
    EXPECT_THAT(e.what(), HasSubstr("is not peer 00000000000000ff"));
  }
}

// A dialer of another version of the handshake hears so, at once, instead of retrying until its
// timeout: the listener reads its whole hello and answers with the verdict before it closes.
TEST_F(LinkTest, AHelloOfAnotherVersionIsAnsweredWithItsVerdict) {
  Fd stranger = raw_connection(listener_.address());
  Hello hello = hello_from(kPeerId, kListenerId);
  hello.version = 3;
  send_all(stranger.get(), &hello, sizeof hello, "hello", net::Clock::now() + 5s);
  uint8_t challenge[72];
  recv_all(stranger.get(), challenge, sizeof challenge, "challenge", net::Clock::now() + 5s);
  EXPECT_EQ(std::memcmp(challenge, "HMHL", 4), 0) << "the challenge's magic";
  EXPECT_EQ(challenge[4], 5) << "the verdict: another version";
  char c;
  EXPECT_FALSE(net::recv_exact(stranger.get(), &c, 1, "end", net::Clock::now() + 5s))
      << "the listener kept the connection open";
}

TEST_F(LinkTest, MalformedIdsAreRefusedBeforeAnyByteIsSent) {
  EXPECT_THROW(dial(listener_.address(), "not-hex-at-all!!", kListenerId, secret_, 1s), Error);
  EXPECT_THROW(dial(listener_.address(), kPeerId, "8000", secret_, 1s), Error);
}

// Hundreds of connections that say nothing or half a hello are held at once, each to its own
// deadline (5 s), so the real peer gets through well within a dial timeout of 2 s; a listener that
// served one connection at a time would make it wait 5 s per silent one.
TEST_F(LinkTest, SilentAndHalfSentConnectionsDoNotHoldUpARealPeer) {
  std::vector<Fd> strangers;
  for (int i = 0; i < 200; ++i)
    strangers.push_back(raw_connection(listener_.address()));
  Hello hello = hello_from(kPeerId, kListenerId);
  for (int i = 0; i < 50; ++i) {
    strangers.push_back(raw_connection(listener_.address()));
    send_all(strangers.back().get(), &hello, 30, "half a hello", net::Clock::now() + 5s);
  }
  std::this_thread::sleep_for(100ms);  // the listener has taken them in
  Fd real = dial_as(kPeerId, secret_, 2s);
  expect_linked(real, listener_.accept_from(kPeerId, 2s));
}

// CPU seconds the process has used (utime + stime of /proc/PID/stat).
double cpu_seconds(int pid) {
  std::ifstream file(fmt::format("/proc/{}/stat", pid));
  std::string stat((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  std::istringstream fields(stat.substr(stat.rfind(')') + 2));
  std::string field;
  double ticks = 0;
  for (int i = 3; i <= 15 && fields >> field; ++i)
    if (i >= 14) ticks += std::stod(field);
  return ticks / static_cast<double>(sysconf(_SC_CLK_TCK));
}

int listen_with_few_descriptors(const std::string& secret_file) {
  try {
    init_logging();  // opens the log file while descriptors are left
    JobSecret secret = JobSecret::read_file(secret_file);
    rlimit limit{48, 48};
    if (setrlimit(RLIMIT_NOFILE, &limit) != 0) return 4;
    Listener listener(SocketAddress{"tcp://127.0.0.1:0"}, kListenerId, secret);
    std::cout << "ADDRESS " << listener.address().text << std::endl;
    Fd peer = listener.accept_from(kPeerId, 60s);
    char byte = 0;
    recv_all(peer.get(), &byte, 1, "the peer's byte", net::Clock::now() + 30s);
    return byte == 'x' ? 0 : 3;
  } catch (const std::exception& e) {
    std::cerr << "listener: " << e.what() << std::endl;
    return 1;
  }
}

// A listener whose process has run out of descriptors sheds what waits without spinning (it would
// otherwise poll a readable socket it cannot accept from, at full speed), and serves the real
// peer once descriptors are free again.
TEST(LinkDescriptorTest, AListenerOutOfDescriptorsShedsWithoutSpinningThenServesTheRealPeer) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "the sanitizers' own checks need descriptors (UBSan's type checks read "
                  "/proc/self/maps), which this test takes away; the ci build runs it";
#endif
  test::TempDir folder;
  JobSecret secret = JobSecret::generate();
  secret.write_file(folder.file("job.secret"));
  std::optional<ChildProcess> listener;
  {
    test::ScopedEnv log_file("HETMESH_LOG_FILE", folder.file("listener.log"));
    listener.emplace(
        std::vector<std::string>{self_executable(), "--listen", folder.file("job.secret")});
  }
  std::string line = listener->read_line(30s);
  ASSERT_EQ(line.rfind("ADDRESS ", 0), 0u) << line;
  SocketAddress address{line.substr(8)};
  std::vector<Fd> flood;
  for (int i = 0; i < 100; ++i)
    flood.push_back(raw_connection(address));
  std::this_thread::sleep_for(200ms);
  double before = cpu_seconds(listener->pid());
  std::this_thread::sleep_for(2s);
  double used = cpu_seconds(listener->pid()) - before;
  // A spinning listener burns a whole core (2 s here); a waiting one next to nothing.
  EXPECT_LT(used, 0.5) << "CPU seconds the listener used in 2 s of a flood";
  flood.clear();
  Fd real = dial(address, kPeerId, kListenerId, secret, 30s);
  char byte = 'x';
  send_all(real.get(), &byte, 1, "a byte", net::Clock::now() + 5s);
  ProcessResult result = listener->wait(30s);
  EXPECT_EQ(result.exit_code, 0) << result.describe();
  std::ifstream log(folder.file("listener.log"));
  std::string logged((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  EXPECT_THAT(logged, HasSubstr("this process is out of file descriptors")) << logged;
}

int dial_as_nobody(const std::string& address) {
  if (setgid(65534) != 0 || setuid(65534) != 0) return 4;
  try {
    dial(SocketAddress{address}, kPeerId, kListenerId, JobSecret::none(), 1s);
    std::cout << "CONNECTED" << std::endl;
  } catch (const Error& e) {
    std::cout << "REFUSED " << e.what() << std::endl;
  }
  return 0;
}

// A unix socket in the abstract namespace is open to every local process: the listener takes
// connections only from processes of its own user (SO_PEERCRED), before reading a byte, and a
// dialer talks only to a listener of its own user.
TEST(LinkUserTest, AUnixListenerRefusesAnotherUsersProcess) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root, to run a process as another user";
  LogCapture log;
  Listener listener(SocketAddress{"unix:@hetmesh-link-test-" + new_endpoint_id()}, kListenerId,
                    JobSecret::none());
  ChildProcess child({self_executable(), "--dial-as-nobody", listener.address().text});
  std::string line = child.read_line(30s);
  // Each side checks the other: the dialer names the listener's user, the listener the dialer's.
  EXPECT_THAT(line, HasSubstr("belongs to another user (0) than this process's (65534): it is not "
                              "peer 8000000000000001"));
  EXPECT_EQ(child.wait(30s).exit_code, 0);
  EXPECT_TRUE(log.saw("does not run as this process's user (0)")) << log.all();
}

// ---- through the transports
// ----------------------------------------------------------------------

// Two transports of one kind with different secrets: neither connects, and each says why.
class TransportSecretTest : public testing::TestWithParam<TransportKind> {};

TEST_P(TransportSecretTest, EndpointsWithDifferentSecretsDoNotConnect) {
  TransportOptions a, b;
  a.kind = b.kind = GetParam();
  a.secret = JobSecret::generate();
  b.secret = JobSecret::generate();
  auto first = Transport::create(a);
  auto second = Transport::create(b);
  auto connect = [](Transport& self, const Transport& peer) {
    return std::async(std::launch::async, [&] {
      try {
        self.connect(peer.endpoint(), 3s);
        return std::pair<hm_status, std::string>{HM_OK, ""};
      } catch (const Error& e) {
        return std::pair<hm_status, std::string>{e.status(), e.what()};
      }
    });
  };
  auto one = connect(*first, *second);
  auto other = connect(*second, *first);
  std::vector<std::pair<hm_status, std::string>> outcomes{one.get(), other.get()};
  std::sort(outcomes.begin(), outcomes.end());
  // The dialer is refused by name; the acceptor times out naming the refusal.
  EXPECT_EQ(outcomes[0].first, HM_ERR_TIMEOUT) << outcomes[0].second;
  EXPECT_THAT(outcomes[0].second, HasSubstr("refused: "));
  EXPECT_EQ(outcomes[1].first, kStatusNotAuthorized) << outcomes[1].second;
  EXPECT_THAT(outcomes[1].second, HasSubstr("holds another job secret"));
}

TEST_P(TransportSecretTest, EndpointsWithTheSameSecretConnect) {
  TransportOptions options;
  options.kind = GetParam();
  options.secret = JobSecret::generate();
  auto first = Transport::create(options);
  auto second = Transport::create(options);
  auto one =
      std::async(std::launch::async, [&] { return first->connect(second->endpoint(), 10s); });
  auto other = second->connect(first->endpoint(), 10s);
  auto connection = one.get();
  EXPECT_TRUE(connection->alive());
  EXPECT_TRUE(other->alive());
}

INSTANTIATE_TEST_SUITE_P(Kinds, TransportSecretTest,
                         testing::Values(TransportKind::ipc, TransportKind::tcp),
                         [](const auto& kind) { return std::string(to_string(kind.param)); });

TEST(TransportSecretRule, NoListenerBeyondLoopbackWithoutASecret) {
  TransportOptions options;
  options.listen_host = "0.0.0.0";
  try {
    Transport::create(options);
    ADD_FAILURE() << "a tcp transport listened on every interface without a secret";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), HM_ERR_INVALID_ARGUMENT);
    EXPECT_THAT(e.what(), HasSubstr("refusing to listen on tcp://0.0.0.0:0 without the job's "
                                    "secret"));
  }
  options.secret = JobSecret::generate();
  EXPECT_NO_THROW(Transport::create(options));
}

}  // namespace
}  // namespace hetmesh::detail

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.size() == 2 && args[0] == "--listen")
    return hetmesh::detail::listen_with_few_descriptors(args[1]);
  if (args.size() == 2 && args[0] == "--dial-as-nobody")
    return hetmesh::detail::dial_as_nobody(args[1]);
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
