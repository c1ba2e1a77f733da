// The job secret at the TCP store: a client without it reads and changes nothing, connections
// that never prove it keep no client out, no store listens beyond loopback without one, and the
// secret's file is private and checked.
#include <hetmesh/core/job_secret.hpp>

#include "raw_store_client.hpp"
#include "rendezvous_support.hpp"
#include "test_support.hpp"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace hetmesh {
namespace {

using namespace rendezvous_test;
using test::LogCapture;
namespace fs = std::filesystem;

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
  // Only a regular file is opened for reading, so a FIFO is refused at once (its open would wait
  // for a writer forever), and nothing past the cap is read.
  const std::string fifo = (dir / "fifo").string();
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_EQ(said(fifo), "job secret file " + fifo + " is a FIFO, not a regular file");
  EXPECT_EQ(said("/dev/zero"),
            "job secret file /dev/zero is a character device, not a regular file");
  EXPECT_EQ(said(dir.string()),
            "job secret file " + dir.string() + " is a directory, not a regular file");
  const std::string big = (dir / "big").string();
  std::ofstream(big) << std::string(10000, 'a');
  fs::permissions(big, fs::perms::owner_read | fs::perms::owner_write);
  EXPECT_EQ(said(big),
            "job secret file " + big + " is 10000 bytes; the most hetmesh reads is 4097");
  fs::create_symlink(path, dir / "link");
  EXPECT_EQ(said((dir / "link").string()),
            "job secret file " + (dir / "link").string() +
                " is a symbolic link, which is not followed for it; name the file itself");
  fs::remove_all(dir);
}

}  // namespace
}  // namespace hetmesh
