// What the rendezvous tests share: the stores every test runs against (the embedded TCP store and
// a real etcd, RendezvousStore's parameter), how a helper process names a store, and small helpers.
#pragma once

#include <hetmesh/core/rendezvous.hpp>
#include <hetmesh/core/subprocess.hpp>

#include "etcd_server.hpp"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace hetmesh::rendezvous_test {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using Bytes = std::vector<uint8_t>;

// The bound on whatever should happen promptly: far beyond it on any loaded machine.
inline constexpr milliseconds kWait{60000};

inline Bytes bytes(const std::string& text) {
  return Bytes(text.begin(), text.end());
}

inline milliseconds since(Clock::time_point start) {
  return std::chrono::duration_cast<milliseconds>(Clock::now() - start);
}

// "<text after prefix>" of a helper's line, or a test failure.
inline std::string after(const std::string& line, const std::string& prefix) {
  EXPECT_EQ(line.rfind(prefix + " ", 0), 0u) << "expected '" << prefix << " ...', got: " << line;
  return line.substr(std::min(line.size(), prefix.size() + 1));
}

// A store named on a helper's command line: the TCP store's "host:port", or
// "etcd|ENDPOINT|PREFIX" (whose owned keys live on a 5 s lease).
inline std::unique_ptr<KeyValueStore> connect_spec(const std::string& spec) {
  if (!spec.starts_with("etcd|")) return connect_tcp_store(spec, kWait);
  auto bar = spec.find('|', 5);
  EtcdOptions options;
  options.endpoint = spec.substr(5, bar - 5);
  options.prefix = spec.substr(bar + 1);
  options.lease_ttl = std::chrono::seconds(5);
  return connect_etcd_store(options, kWait);
}

inline std::string endpoint_of(const std::string& role, int rank) {
  return "endpoint of " + role + " " + std::to_string(rank);
}

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

}  // namespace hetmesh::rendezvous_test
