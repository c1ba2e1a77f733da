// Two hosts on one machine: two network namespaces joined by a veth pair, each with an address of
// its own, made and removed by the test itself (root only). A transport benchmark and a 2A2F demo
// are split across them, each end listening on its own host's address, every store connection and
// link authenticated by the job's secret (without it, neither starts); and the demo from one
// config file, over the embedded store and over etcd with TLS.
#include <hetmesh/core/error.hpp>
#include <hetmesh/core/job_secret.hpp>
#include <hetmesh/core/subprocess.hpp>

#include "etcd_server.hpp"
#include "test_support.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace hetmesh {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;

std::string ip_binary() {
  for (const char* path : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"})
    if (std::filesystem::exists(path)) return path;
  return {};
}

// Two namespaces, "hosts" 0 and 1, at 10.231.N.1 and 10.231.N.2 on one veth pair.
class TwoHosts {
 public:
  TwoHosts() {
    const int n = static_cast<int>(getpid() % 250);
    for (int h = 0; h < 2; ++h) {
      names_[h] = fmt::format("hm{}{}", getpid(), h ? 'b' : 'a');
      addresses_[h] = fmt::format("10.231.{}.{}", n, h + 1);
    }
    const std::string va = fmt::format("hmv{}a", getpid()), vb = fmt::format("hmv{}b", getpid());
    ip({"netns", "add", names_[0]});
    made_ = 1;
    ip({"netns", "add", names_[1]});
    made_ = 2;
    ip({"link", "add", va, "type", "veth", "peer", "name", vb});
    ip({"link", "set", va, "netns", names_[0]});
    ip({"link", "set", vb, "netns", names_[1]});
    for (int h = 0; h < 2; ++h) {
      const std::string& link = h ? vb : va;
      ip({"-n", names_[h], "addr", "add", addresses_[h] + "/24", "dev", link});
      ip({"-n", names_[h], "link", "set", link, "up"});
      ip({"-n", names_[h], "link", "set", "lo", "up"});
    }
  }
  ~TwoHosts() {
    for (int h = 0; h < made_; ++h)  // the veth pair goes with its namespaces
      run_process({ip_binary(), "netns", "del", names_[h]}, 10s);
  }
  TwoHosts(const TwoHosts&) = delete;
  TwoHosts& operator=(const TwoHosts&) = delete;

  const std::string& address(int host) const { return addresses_[host]; }
  // `argv` run on `host`.
  std::vector<std::string> on(int host, std::vector<std::string> argv) const {
    argv.insert(argv.begin(), {ip_binary(), "netns", "exec", names_[host]});
    return argv;
  }

 private:
  void ip(std::vector<std::string> args) {
    args.insert(args.begin(), ip_binary());
    ProcessResult r = run_process(args, 10s);
    if (r.exit_code != 0)
      throw Error(HM_ERR_BACKEND, fmt::format("{}: {}", fmt::join(args, " "), r.err));
  }
  std::string names_[2], addresses_[2];
  int made_ = 0;
};

class HostsTest : public testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0 || ip_binary().empty()) GTEST_SKIP() << "needs root and iproute2's ip";
    try {
      hosts_.emplace();
    } catch (const Error& e) {
      GTEST_SKIP() << "cannot make network namespaces here: " << e.what();
    }
    JobSecret::generate().write_file(dir_.file("job.secret"));
  }
  // Runs `attention` on host 0, then `ffn` on host 1, each to its end; expects both to exit 0 and
  // returns what each printed.
  struct Outputs {
    std::string attention, ffn;
  };
  Outputs run_split(const std::vector<std::string>& attention,
                    const std::vector<std::string>& ffn) {
    ChildProcess first(hosts_->on(0, attention));
    ProcessResult second = run_process(hosts_->on(1, ffn), 180s);
    std::string output;
    try {
      for (;;)
        output += first.read_line(120s) + "\n";
    } catch (const Error&) {
    }
    EXPECT_EQ(second.exit_code, 0) << second.out << second.err;
    EXPECT_EQ(first.wait(60s).exit_code, 0) << output;
    return {output, second.out};
  }

  test::TempDir dir_;
  std::optional<TwoHosts> hosts_;
};

// bench transport's two ends on two hosts, shaped like ib_write_bw: the serving end on host 0,
// the measuring one on host 1; the JSON names the other end.
TEST_F(HostsTest, ATransportBenchmarkAcrossTwoHosts) {
  const std::string at = hosts_->address(0) + ":18600";
  {  // Beyond loopback the serving end needs the job's secret.
    test::ScopedEnv no_secret(JobSecret::kFileVariable, std::nullopt);
    ProcessResult r = run_process(
        hosts_->on(0, {HETMESH_CLI, "bench", "transport", "--listen", at, "--transport", "tcp"}),
        60s);
    EXPECT_NE(r.exit_code, 0);
    EXPECT_THAT(r.out + r.err, HasSubstr("refusing to listen on " + at + " without the job's"))
        << r.out << r.err;
  }
  test::ScopedEnv secret(JobSecret::kFileVariable, dir_.file("job.secret"));
  ChildProcess server(
      hosts_->on(0, {HETMESH_CLI, "bench", "transport", "--listen", at, "--transport", "tcp"}));
  EXPECT_THAT(server.read_line(60s), HasSubstr("serving at " + at));
  ProcessResult client =
      run_process(hosts_->on(1, {HETMESH_CLI, "bench", "transport", "--connect", at, "--transport",
                                 "tcp", "--sizes", "4K", "64K", "--iterations", "50", "--json",
                                 dir_.file("bench.json")}),
                  120s);
  EXPECT_EQ(client.exit_code, 0) << client.out << client.err;
  EXPECT_THAT(client.out, HasSubstr("to the end at " + at + " on another host"));
  EXPECT_EQ(server.wait(60s).exit_code, 0);
  nlohmann::json results =
      nlohmann::json::parse(std::ifstream(dir_.file("bench.json")), nullptr, false);
  ASSERT_TRUE(results.is_object()) << client.out;
  EXPECT_EQ(results["across_hosts"], at);
  EXPECT_EQ(results["rows"].size(), 2u);
}

// A 2A2F demo split over the two hosts over tcp: host 0 runs the attention instances and hosts
// the store, host 1 the FFN instances; each host's config differs only in its listen_host.
TEST_F(HostsTest, ADemoAcrossTwoHosts) {
  const std::string store = hosts_->address(0) + ":18610";
  for (int h = 0; h < 2; ++h)
    std::ofstream(dir_.file(fmt::format("host{}.toml", h))) << fmt::format(
        // Two invocations meet: a join bound no loaded machine reaches (the default is 10 s).
        "[job]\nattention = 2\nffn = 2\nlayers = 2\njoin_timeout_ms = 300000\n\n"
        "[transport]\nkind = \"tcp\"\n"
        "listen_host = \"{}\"\n\n[rendezvous]\naddress = \"{}\"\nsecret_file = \"{}\"\n",
        hosts_->address(h), store, dir_.file("job.secret"));
  Outputs out = run_split(
      {HETMESH_CLI, "demo", "--config", dir_.file("host0.toml"), "--instances", "attention"},
      {HETMESH_CLI, "demo", "--config", dir_.file("host1.toml"), "--instances", "ffn", "--store",
       store});
  EXPECT_THAT(out.ffn, HasSubstr("ffn instance(s) 0,1 done"));
  EXPECT_THAT(out.attention, HasSubstr("verified: final hidden states of 2 attention"));
}

// One config for every host: [hosts] says where each instance runs; the same command on each host
// (--instances here) starts the instances whose address is that host's, the store's host hosts
// it and the other joins it.
TEST_F(HostsTest, OneConfigForEveryHost) {
  std::ofstream(dir_.file("job.toml")) << fmt::format(
      "[job]\nattention = 2\nffn = 2\nlayers = 2\n\n[transport]\nkind = \"tcp\"\n\n"
      "[hosts]\nattention = \"{0}\"\nffn = [\"{1}\", \"{1}\"]\n\n"
      "[rendezvous]\naddress = \"{0}:18620\"\nsecret_file = \"{2}\"\n",
      hosts_->address(0), hosts_->address(1), dir_.file("job.secret"));
  const std::vector<std::string> here = {HETMESH_CLI,           "demo",        "--config",
                                         dir_.file("job.toml"), "--instances", "here"};
  Outputs out = run_split(here, here);
  EXPECT_THAT(out.attention, HasSubstr("here: attention 0,1, ffn none"));
  EXPECT_THAT(out.attention, HasSubstr("(hosted here)"));
  EXPECT_THAT(out.ffn, HasSubstr("here: attention none, ffn 0,1"));
  EXPECT_THAT(out.ffn, HasSubstr("(joined)"));
  EXPECT_THAT(out.attention, HasSubstr("verified: final hidden states of 2 attention"));
}

// Makes a CA, and a certificate it signs for `name` (key and certificate in `name`.key and .pem)
// with `extensions` (openssl x509 -extfile), in `dir`.
void make_certificate(const test::TempDir& dir, const std::string& name,
                      const std::string& extensions) {
  auto run = [](std::vector<std::string> argv) {
    ProcessResult r = run_process(argv, 60s);
    ASSERT_EQ(r.exit_code, 0) << fmt::format("{}", fmt::join(argv, " ")) << "\n" << r.err;
  };
  if (!std::filesystem::exists(dir.file("ca.pem")))
    run({"/usr/bin/openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
         "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", dir.file("ca.key"), "-out",
         dir.file("ca.pem"), "-days", "1", "-subj", "/CN=hetmesh test CA"});
  std::ofstream(dir.file(name + ".ext")) << extensions << "\n";
  run({"/usr/bin/openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
       "-nodes", "-keyout", dir.file(name + ".key"), "-out", dir.file(name + ".csr"), "-subj",
       "/CN=" + name});
  run({"/usr/bin/openssl", "x509", "-req", "-in", dir.file(name + ".csr"), "-CA",
       dir.file("ca.pem"), "-CAkey", dir.file("ca.key"), "-CAcreateserial", "-out",
       dir.file(name + ".pem"), "-days", "1", "-extfile", dir.file(name + ".ext")});
}

// The same one-config job over etcd on host 0, reached with TLS and client certificates (plain
// HTTP is refused beyond loopback): nothing is hosted by hetmesh, both hosts meet at etcd. A host
// without a client certificate is refused by etcd, by name.
TEST_F(HostsTest, OneConfigOverEtcdWithTls) {
  HETMESH_REQUIRE_ETCD_OR_SKIP();
  // etcd's JSON gateway dials etcd itself with the server's certificate: it needs clientAuth too.
  make_certificate(dir_, "etcd",
                   "subjectAltName=IP:" + hosts_->address(0) +
                       ",IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth");
  make_certificate(dir_, "client", "extendedKeyUsage=clientAuth");
  if (HasFatalFailure()) return;
  const std::string url = "https://" + hosts_->address(0) + ":2379";
  ChildProcess etcd(hosts_->on(0, {test::etcd_binary(),
                                   "--name",
                                   "hm",
                                   "--data-dir",
                                   dir_.file("etcd"),
                                   "--listen-client-urls",
                                   url,
                                   "--advertise-client-urls",
                                   url,
                                   "--listen-peer-urls",
                                   "http://127.0.0.1:2380",
                                   "--initial-advertise-peer-urls",
                                   "http://127.0.0.1:2380",
                                   "--initial-cluster",
                                   "hm=http://127.0.0.1:2380",
                                   "--cert-file",
                                   dir_.file("etcd.pem"),
                                   "--key-file",
                                   dir_.file("etcd.key"),
                                   "--trusted-ca-file",
                                   dir_.file("ca.pem"),
                                   "--client-cert-auth",
                                   "--logger",
                                   "zap",
                                   "--log-level",
                                   "error"}));
  std::ofstream(dir_.file("job.toml")) << fmt::format(
      "[job]\nattention = 2\nffn = 2\nlayers = 2\n\n[transport]\nkind = \"tcp\"\n\n"
      "[hosts]\nattention = \"{}\"\nffn = \"{}\"\n\n"
      "[rendezvous]\nkind = \"etcd\"\naddress = \"{}\"\nsecret_file = \"{}\"\n",
      hosts_->address(0), hosts_->address(1), url, dir_.file("job.secret"));
  const std::vector<std::string> here = {HETMESH_CLI,           "demo",        "--config",
                                         dir_.file("job.toml"), "--instances", "here"};
  test::ScopedEnv ca("HETMESH_ETCD_CA_FILE", dir_.file("ca.pem"));
  {
    test::ScopedEnv no_certificate("HETMESH_ETCD_CERT_FILE", std::nullopt);
    ProcessResult refused = run_process(hosts_->on(1, here), 120s);
    EXPECT_NE(refused.exit_code, 0);
    EXPECT_THAT(refused.err, HasSubstr("etcd store " + url + ": not reachable"));
    EXPECT_THAT(refused.err, HasSubstr("name this client's in HETMESH_ETCD_CERT_FILE"));
  }
  test::ScopedEnv certificate("HETMESH_ETCD_CERT_FILE", dir_.file("client.pem"));
  test::ScopedEnv key("HETMESH_ETCD_KEY_FILE", dir_.file("client.key"));
  Outputs out = run_split(here, here);
  EXPECT_THAT(out.attention, HasSubstr("rendezvous store " + url + " (joined)"));
  EXPECT_THAT(out.attention, HasSubstr("verified: final hidden states of 2 attention"));
}

}  // namespace
}  // namespace hetmesh
