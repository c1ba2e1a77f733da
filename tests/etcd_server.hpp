// A real etcd (Debian etcd-server) for the tests: started on 127.0.0.1 with free ports and a
// temporary data folder, stopped and removed with this object. Absent etcd skips a test, unless
// HETMESH_REQUIRE_ETCD is set (the README's test command sets it), which makes it a failure.
#pragma once

#include <hetmesh/core/rendezvous.hpp>
#include <hetmesh/core/socket.hpp>
#include <hetmesh/core/subprocess.hpp>

#include "test_support.hpp"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>

namespace hetmesh::test {

inline std::string etcd_binary() {
  for (const char* path : {"/usr/bin/etcd", "/usr/local/bin/etcd"})
    if (std::filesystem::exists(path)) return path;
  return {};
}

// Skips the calling test when etcd is missing and not required.
#define HETMESH_REQUIRE_ETCD_OR_SKIP()                                                   \
  do {                                                                                   \
    if (::hetmesh::test::etcd_binary().empty()) {                                        \
      if (std::getenv("HETMESH_REQUIRE_ETCD")) FAIL() << "etcd is required but missing"; \
      GTEST_SKIP() << "no etcd here (Debian etcd-server)";                               \
    }                                                                                    \
  } while (0)

// A port nobody listens on now.
inline uint16_t free_port() {
  net::Fd fd = net::listen_on(net::resolve("127.0.0.1:0", true, "a free port").front(), "port");
  return static_cast<uint16_t>(std::stoi(net::to_string(net::local_address(fd.get())).substr(10)));
}

class EtcdServer {
 public:
  EtcdServer() : client_port_(free_port()), peer_port_(free_port()) { start(); }
  EtcdServer(const EtcdServer&) = delete;
  EtcdServer& operator=(const EtcdServer&) = delete;

  std::string endpoint() const { return fmt::format("http://127.0.0.1:{}", client_port_); }
  // A client under its own prefix.
  std::unique_ptr<KeyValueStore> client(const std::string& prefix,
                                        std::chrono::seconds lease_ttl = std::chrono::seconds(5)) {
    EtcdOptions options;
    options.endpoint = endpoint();
    options.prefix = prefix;
    options.lease_ttl = lease_ttl;
    return connect_etcd_store(options, std::chrono::seconds(20));
  }
  // Kills etcd (SIGKILL), keeping its data folder; start() brings it back on the same ports.
  void kill() {
    if (process_) process_->kill(SIGKILL);
    process_.reset();
  }
  void start() {
    process_ = std::make_unique<ChildProcess>(
        std::vector<std::string>{etcd_binary(),
                                 "--name",
                                 "hetmesh-test",
                                 "--data-dir",
                                 folder_.file("data"),
                                 "--listen-client-urls",
                                 endpoint(),
                                 "--advertise-client-urls",
                                 endpoint(),
                                 "--listen-peer-urls",
                                 fmt::format("http://127.0.0.1:{}", peer_port_),
                                 "--initial-advertise-peer-urls",
                                 fmt::format("http://127.0.0.1:{}", peer_port_),
                                 "--initial-cluster",
                                 fmt::format("hetmesh-test=http://127.0.0.1:{}", peer_port_),
                                 "--max-request-bytes",
                                 "33554432",
                                 "--logger",
                                 "zap",
                                 "--log-level",
                                 "error"});
    client("up/");  // waits until it answers
  }

 private:
  TempDir folder_;
  uint16_t client_port_, peer_port_;
  std::unique_ptr<ChildProcess> process_;
};

}  // namespace hetmesh::test
