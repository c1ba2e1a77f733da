// Two hosts on one machine: two network namespaces joined by a veth pair, each with an address of
// its own, made and removed by the test itself (root only). A transport benchmark and a 2A2F demo
// are split across them, each end listening on its own host's address, every store connection and
// link authenticated by the job's secret; without the secret, neither starts.
#include <hetmesh/core/error.hpp>
#include <hetmesh/core/job_secret.hpp>
#include <hetmesh/core/subprocess.hpp>

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
        "[job]\nattention = 2\nffn = 2\nlayers = 2\n\n[transport]\nkind = \"tcp\"\n"
        "listen_host = \"{}\"\n\n[rendezvous]\naddress = \"{}\"\nsecret_file = \"{}\"\n",
        hosts_->address(h), store, dir_.file("job.secret"));
  ChildProcess attention(hosts_->on(
      0, {HETMESH_CLI, "demo", "--config", dir_.file("host0.toml"), "--instances", "attention"}));
  ProcessResult ffn =
      run_process(hosts_->on(1, {HETMESH_CLI, "demo", "--config", dir_.file("host1.toml"),
                                 "--instances", "ffn", "--store", store}),
                  180s);
  std::string output;
  try {
    for (;;)
      output += attention.read_line(120s) + "\n";
  } catch (const Error&) {
  }
  EXPECT_EQ(ffn.exit_code, 0) << ffn.out << ffn.err;
  EXPECT_EQ(attention.wait(60s).exit_code, 0) << output;
  EXPECT_THAT(ffn.out, HasSubstr("ffn instance(s) 0,1 done"));
  EXPECT_THAT(output, HasSubstr("verified: final hidden states of 2 attention"));
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
  auto on = [&](int host) {
    return hosts_->on(
        host, {HETMESH_CLI, "demo", "--config", dir_.file("job.toml"), "--instances", "here"});
  };
  ChildProcess attention(on(0));
  ProcessResult ffn = run_process(on(1), 180s);
  std::string output;
  try {
    for (;;)
      output += attention.read_line(120s) + "\n";
  } catch (const Error&) {
  }
  EXPECT_EQ(ffn.exit_code, 0) << ffn.out << ffn.err;
  EXPECT_EQ(attention.wait(60s).exit_code, 0) << output;
  EXPECT_THAT(output, HasSubstr("here: attention 0,1, ffn none"));
  EXPECT_THAT(output, HasSubstr("(hosted here)"));
  EXPECT_THAT(ffn.out, HasSubstr("here: attention none, ffn 0,1"));
  EXPECT_THAT(ffn.out, HasSubstr("(joined)"));
  EXPECT_THAT(output, HasSubstr("verified: final hidden states of 2 attention"));
}

}  // namespace
}  // namespace hetmesh
