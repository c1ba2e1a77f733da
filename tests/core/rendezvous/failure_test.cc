// A TCP store whose host is killed or stopped: calls fail by name, promptly, and a blocked get does
// not wait out its timeout.
#include "rendezvous_support.hpp"

#include <gtest/gtest.h>

#include <csignal>
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

}  // namespace
}  // namespace hetmesh
