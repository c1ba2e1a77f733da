// A real etcd (Debian etcd-server) for the tests: started on 127.0.0.1 with free ports and a
// temporary data folder, stopped and removed with this object. Absent etcd skips a test, unless
// HM_TEST_REQUIRE_ETCD is set (the README's test command sets it), which makes it a failure.
#pragma once

#include <hetmesh/core/error.hpp>
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
#include <random>
#include <string>
#include <vector>

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
      if (std::getenv("HM_TEST_REQUIRE_ETCD")) FAIL() << "etcd is required but missing"; \
      GTEST_SKIP() << "no etcd here (Debian etcd-server)";                               \
    }                                                                                    \
  } while (0)

// A port nobody listens on now, below Linux's ephemeral ports (32768-60999 by default): no
// other socket's bind-to-0 or connect takes it before etcd binds it.
inline uint16_t free_port() {
  for (int attempt = 0;; ++attempt) {
    const auto port = static_cast<uint16_t>(10000 + std::random_device{}() % 22768);
    try {
      net::listen_on(net::resolve(fmt::format("127.0.0.1:{}", port), true, "a free port").front(),
                     "port");
      return port;
    } catch (const Error&) {
      if (attempt == 200) throw;
    }
  }
}

class EtcdServer {
 public:
  // `flags`: more of etcd's own ("--auth-token-ttl", "1").
  explicit EtcdServer(std::vector<std::string> flags = {})
      : client_port_(free_port()), peer_port_(free_port()), flags_(std::move(flags)) {
    start();
  }
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
  // Turns etcd's own authentication on (etcdctl, Debian etcd-client): a root user, and `user`
  // with `password` whose role may read and write the keys under `prefix` only.
  void enable_auth(const std::string& user, const std::string& password,
                   const std::string& prefix) {
    for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
             {"user", "add", "root:" + kRootPassword, "--interactive=false"},
             {"user", "grant-role", "root", "root"},
             {"role", "add", "job"},
             {"role", "grant-permission", "job", "--prefix=true", "readwrite", prefix},
             {"user", "add", user + ":" + password, "--interactive=false"},
             {"user", "grant-role", user, "job"},
             {"auth", "enable"}})
      etcdctl(args);
  }
  void etcdctl(std::vector<std::string> args) {
    args.insert(args.begin(), {"/usr/bin/etcdctl", "--endpoints", endpoint()});
    ProcessResult r = run_process(args, std::chrono::seconds(30));
    if (r.exit_code != 0)
      throw Error(HM_ERR_INTERNAL, fmt::format("etcdctl {}: {} {}", args[3], r.out, r.err));
  }
  // Kills etcd (SIGKILL), keeping its data folder; start() brings it back on the same ports.
  void kill() {
    if (process_) process_->kill(SIGKILL);
    process_.reset();
  }
  void start() {
    std::vector<std::string> args = {etcd_binary(),
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
                                     "error",
                                     "--bcrypt-cost",
                                     "4"};  // the cheapest password hash: users log in fast
    args.insert(args.end(), flags_.begin(), flags_.end());
    process_ = std::make_unique<ChildProcess>(args);
    client("up/");  // waits until it answers
  }

 private:
  static inline const std::string kRootPassword = "root-password";
  TempDir folder_;
  uint16_t client_port_, peer_port_;
  std::vector<std::string> flags_;
  std::unique_ptr<ChildProcess> process_;
};

}  // namespace hetmesh::test
