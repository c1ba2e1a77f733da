// A TCP store whose host is killed or stopped: calls fail by name, promptly, and a blocked get does
// not wait out its timeout. One whose host cannot start a thread to serve a request says so at
// once, naming why.
#include "rendezvous_support.hpp"
#include "test_support.hpp"

#include <gtest/gtest.h>

#include <csignal>
#include <fstream>
#include <functional>
#include <future>
#include <thread>

namespace hetmesh {
namespace {

using namespace rendezvous_test;

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

// Out of threads (a real RLIMIT_AS on the store's host, as `ulimit -v` gives a job, which
// RLIMIT_NPROC cannot do for root), with no worker running yet: each request is answered at once
// with why, naming the store, the request and the host's errno text, never left to its client's
// deadline ("no reply within 20000 ms"), and the host says so once however many come. Once the
// host can start threads again, the same client is served.
TEST(RendezvousFailure, AStoreThatCannotStartAThreadSaysSoAtOnce) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "not under the sanitizers: their shadow memory needs more address space";
#endif
  test::TempDir dir;
  test::ScopedEnv log_file("HETMESH_LOG_FILE", dir.file("store.log"));
  ChildProcess host({self_executable(), "--serve-store-out-of-threads"});
  const std::string address = after(host.read_line(kWait), "ADDRESS");
  constexpr milliseconds kClientTimeout{20000};
  auto store = connect_tcp_store(address, kClientTimeout);
  const std::string why = fmt::format(
      "the store's host (pid {}) cannot start a thread to serve the request: Resource temporarily "
      "unavailable (it is out of threads, or of address space for a thread's stack: check ulimit "
      "-u and ulimit -v there",
      host.pid());
  const std::pair<std::string, std::function<void()>> calls[] = {
      {"add 'hetmesh/attention/0/epochs'", [&] { store->add("hetmesh/attention/0/epochs", 1); }},
      {"get 'never'", [&] { store->get("never", std::chrono::seconds(60)); }},
      {"set 'k'", [&] { store->set("k", bytes("a value")); }},
  };
  for (const auto& [what, call] : calls) {
    SCOPED_TRACE(what);
    const auto start = Clock::now();
    try {
      call();
      ADD_FAILURE() << "served without a thread to serve it";
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), HM_ERR_OUT_OF_MEMORY) << status_name(e.status()) << ": " << e.what();
      EXPECT_EQ(std::string(e.what()).find("tcp store " + address + ": " + what + ": " + why), 0u)
          << e.what();
    }
    ASSERT_LT(since(start), kClientTimeout / 2) << "the refusal waited for the client's deadline";
  }
  host.write("raise\n");
  after(host.read_line(kWait), "RAISED");
  EXPECT_EQ(store->add("hetmesh/attention/0/epochs", 1), 1);
  EXPECT_EQ(store->get("hetmesh/attention/0/epochs", kWait), bytes("1"));
  host.kill(SIGTERM);
  host.wait(kWait);
  std::ifstream in(dir.file("store.log"));
  std::string log((std::istreambuf_iterator<char>(in)), {}), said = "cannot start a worker (0 run)";
  size_t times = 0;
  for (size_t at = log.find(said); at != std::string::npos; at = log.find(said, at + 1))
    ++times;
  EXPECT_EQ(times, 1u) << log;
}

}  // namespace
}  // namespace hetmesh
