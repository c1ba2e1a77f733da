// Failures around the launcher, with real processes and signals: the real `hetmesh demo` (a 2A2F
// job on cpu:0 over ipc) with one bad instance, SIGTERM/SIGINT/SIGKILL of the launcher, a stopped
// instance, and the death of the process that hosts the store. Each checks that the job ends, in
// a bounded time (printed; only generous bounds are asserted), that its instances are gone, and
// that nothing is left in /tmp or /dev/shm. This binary also re-runs itself as a store's host.
#include <hetmesh/afd/local_job.hpp>
#include <hetmesh/core/error.hpp>
#include <hetmesh/core/rendezvous.hpp>
#include <hetmesh/core/subprocess.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

namespace hetmesh {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// A small 2A2F demo job; `devices` replaces the [devices] section. Its heartbeat is far beyond a
// loaded machine's pauses: a stopped instance is found by the job's timeout or the launcher's
// stopped limit, never a healthy one taken for hung.
std::string write_config(const std::string& name, int timeout_ms,
                         const std::string& devices = "attention = \"cpu:0\"\nffn = \"cpu:0\"\n") {
  fs::path path = fs::path(testing::TempDir()) / fmt::format("launcher-{}-{}.toml", name, getpid());
  std::ofstream(path) << fmt::format(
      "[job]\nattention = 2\nffn = 2\nmicro_batches = 2\nlayers = 2\ntimeout_ms = {}\n"
      "heartbeat_ms = 60000\n"
      "[model]\ntokens = 4\nhidden = 32\nexperts = 2\ntop_k = 1\n"
      "[devices]\n{}"
      "[tracing]\nenabled = false\n",
      timeout_ms, devices);
  return path.string();
}

// The processes whose parent is `parent`, by pid, with their command lines.
std::map<int, std::string> children_of(int parent) {
  std::map<int, std::string> found;
  for (const auto& entry : fs::directory_iterator("/proc")) {
    int pid = std::atoi(entry.path().filename().c_str());
    if (pid <= 0) continue;
    std::ifstream stat(entry.path() / "stat");
    std::string line;
    std::getline(stat, line);
    auto end = line.rfind(')');
    if (end == std::string::npos) continue;
    char state = 0;
    int ppid = 0;
    if (std::sscanf(line.c_str() + end + 1, " %c %d", &state, &ppid) != 2 || ppid != parent)
      continue;
    std::ifstream in(entry.path() / "cmdline");
    std::string cmdline((std::istreambuf_iterator<char>(in)), {});
    std::replace(cmdline.begin(), cmdline.end(), '\0', ' ');
    found[pid] = cmdline;
  }
  return found;
}

// Waits until `parent` has `count` children running the instance roles; returns their pids by
// "ROLE RANK" ("ffn 1").
std::map<std::string, int> wait_for_instances(int parent, size_t count) {
  std::map<std::string, int> instances;
  auto deadline = Clock::now() + std::chrono::seconds(60);
  while (instances.size() < count && Clock::now() < deadline) {
    instances.clear();
    for (const auto& [pid, cmdline] : children_of(parent)) {
      char role[16] = {};
      int rank = -1;
      auto at = cmdline.find("--role ");
      if (at != std::string::npos &&
          std::sscanf(cmdline.c_str() + at, "--role %15s --rank %d", role, &rank) == 2)
        instances[fmt::format("{} {}", role, rank)] = pid;
    }
    if (instances.size() < count) std::this_thread::sleep_for(milliseconds(5));
  }
  return instances;
}

// Whether `pid` has ended (gone, or a zombie waiting for a reaper).
bool ended(int pid) {
  std::ifstream stat(fmt::format("/proc/{}/stat", pid));
  std::string line;
  if (!std::getline(stat, line)) return true;
  auto end = line.rfind(')');
  return end != std::string::npos && end + 2 < line.size() && line[end + 2] == 'Z';
}

bool all_ended(const std::map<std::string, int>& instances, milliseconds within) {
  auto deadline = Clock::now() + within;
  for (;;) {
    bool all = true;
    for (const auto& [name, pid] : instances)
      all = all && ended(pid);
    if (all || Clock::now() >= deadline) return all;
    std::this_thread::sleep_for(milliseconds(5));
  }
}

std::set<std::string> shm_entries() {
  std::set<std::string> names;
  std::error_code ignored;
  for (const auto& entry : fs::directory_iterator("/dev/shm", ignored))
    if (entry.path().filename().string().rfind("hetmesh", 0) == 0)
      names.insert(entry.path().filename().string());
  return names;
}

// The launcher's job folders (hetmesh-demo-<pid>-XXXXXX); none once it has cleaned up.
std::vector<fs::path> demo_folders(int launcher) {
  std::vector<fs::path> found;
  const std::string prefix = fmt::format("hetmesh-demo-{}-", launcher);
  std::error_code ignored;
  for (const auto& entry : fs::directory_iterator(fs::temp_directory_path(), ignored))
    if (entry.path().filename().string().rfind(prefix, 0) == 0) found.push_back(entry.path());
  return found;
}

// Counts the occurrences of `what` in `text`.
size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1))
    ++n;
  return n;
}

class LauncherTest : public testing::Test {
 protected:
  void SetUp() override { shm_before_ = shm_entries(); }
  void TearDown() override { EXPECT_EQ(shm_entries(), shm_before_) << "left in /dev/shm"; }
  std::set<std::string> shm_before_;
};

// ---- fast failure at start ----

struct BadStart {
  std::string name, devices, instance, selector;
};

class BadStartTest : public LauncherTest, public testing::WithParamInterface<BadStart> {};

TEST_P(BadStartTest, OneBadInstanceFailsTheWholeJobAtOnceWithItsErrorShownOnce) {
  const BadStart& p = GetParam();
  // 30 s of join timeout: the others used to wait for all of it.
  std::string config = write_config(p.name, 30000, p.devices);
  auto start = Clock::now();
  ProcessResult r =
      run_process({HETMESH_CLI, "demo", "--config", config}, std::chrono::seconds(300));
  double took = seconds_since(start);
  std::printf("[ figure ] bad start (%s): the 2A2F job ended %.3f s after it started\n",
              p.selector.c_str(), took);
  EXPECT_EQ(r.exit_code, 1) << r.describe() << "\n" << r.err;
  EXPECT_EQ(count(r.err, p.selector), 1u) << r.err;  // the root cause, once
  EXPECT_NE(r.err.find("hetmesh: error: " + p.instance + " on "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("hetmesh demo: " + p.instance + " failed (exit code 1)"), std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("did not appear"), std::string::npos) << r.err;  // no misleading timeout
  EXPECT_EQ(count(r.err, "hetmesh: error:"), 1u) << r.err;  // the others do not repeat it
  fs::remove(config);
}

INSTANTIATE_TEST_SUITE_P(
    Instances, BadStartTest,
    testing::Values(BadStart{"ffn", "attention = \"cpu:0\"\nffn = [\"cpu:0\", \"cpu:3\"]\n",
                             "ffn:1", "cpu:3"},
                    BadStart{"attention", "attention = [\"cpu:0\", \"cpu:7\"]\nffn = \"cpu:0\"\n",
                             "attention:1", "cpu:7"}),
    [](const auto& p) { return p.param.name; });

// ---- a replacement ----

class ReplaceTest : public LauncherTest, public testing::WithParamInterface<std::string> {};

// `hetmesh demo --replace ROLE:RANK` kills that instance halfway (SIGKILL, by the launcher) and
// starts a new process in its place, which rejoins the running 2A2F job; nothing else restarts,
// and the final hidden states still match the single-process reference.
TEST_P(ReplaceTest, TheDemoStillVerifiesAfterAnInstanceIsKilledAndReplaced) {
  const std::string victim = GetParam();
  std::string config = write_config("replace", 30000);
  ProcessResult r = run_process({HETMESH_CLI, "demo", "--config", config, "--replace", victim},
                                std::chrono::seconds(300));
  EXPECT_EQ(r.exit_code, 0) << r.describe() << "\n" << r.out << r.err;
  EXPECT_NE(r.out.find("killing " + victim + " (SIGKILL) at layer 1/2"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("verified: final hidden states of 2 attention x 2 micro-batches match"),
            std::string::npos)
      << r.out << r.err;
  EXPECT_NE(r.out.find("recovery: " + victim + " was killed and replaced mid-run"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(r.err.find("hetmesh: error:"), std::string::npos) << r.err;
  fs::remove(config);
}

INSTANTIATE_TEST_SUITE_P(Instances, ReplaceTest, testing::Values("ffn:1", "attention:1"),
                         [](const auto& p) {
                           std::string name = p.param;
                           name[name.find(':')] = '_';
                           return name;
                         });

TEST_F(LauncherTest, ReplaceRefusesWhatItCannotDo) {
  std::string config = write_config("replace-refused", 10000);
  for (const auto& [value, says] : std::vector<std::pair<std::string, std::string>>{
           {"ffn:5", "ranks 0..1"}, {"ffn", "name one instance"}, {"gpu:0", "the role is"}}) {
    ProcessResult r = run_process({HETMESH_CLI, "demo", "--config", config, "--replace", value},
                                  std::chrono::seconds(120));
    EXPECT_EQ(r.exit_code, 1) << value << ": " << r.describe();
    EXPECT_NE(r.err.find("--replace"), std::string::npos) << value << ": " << r.err;
    EXPECT_NE(r.err.find(says), std::string::npos) << value << ": " << r.err;
  }
  fs::remove(config);
}

// ---- CPUs ----

// `--pin on` gives each instance a share of this process's CPUs of its own (the launcher says
// which), and each instance pins itself to them (it logs so); `--pin off` pins nothing.
TEST_F(LauncherTest, PinOnGivesEachInstanceItsOwnCpus) {
  cpu_set_t allowed;
  ASSERT_EQ(sched_getaffinity(0, sizeof allowed, &allowed), 0);
  if (CPU_COUNT(&allowed) < 2) GTEST_SKIP() << "one CPU: nothing to share";
  setenv("HETMESH_LOG", "info", 1);  // the instances inherit it
  ProcessResult on = run_process({HETMESH_CLI, "demo", "--pin", "on"}, std::chrono::seconds(240));
  ProcessResult off = run_process({HETMESH_CLI, "demo", "--pin", "off"}, std::chrono::seconds(240));
  unsetenv("HETMESH_LOG");
  for (const ProcessResult* r : {&on, &off}) {
    EXPECT_EQ(r->exit_code, 0) << r->describe() << "\n" << r->out << r->err;
    EXPECT_NE(r->out.find("verified:"), std::string::npos) << r->out;
  }
  std::smatch pinned;
  ASSERT_TRUE(std::regex_search(
      on.out, pinned, std::regex("placed: attention 0: CPUs ([0-9,]+); ffn 0: CPUs ([0-9,]+)")))
      << on.out;
  const std::string attention = pinned[1], ffn = pinned[2];
  auto cpus = [](const std::string& list) {
    std::set<int> set;
    std::istringstream in(list);
    for (std::string cpu; std::getline(in, cpu, ',');)
      set.insert(std::stoi(cpu));
    return set;
  };
  for (int cpu : cpus(attention))
    EXPECT_EQ(cpus(ffn).count(cpu), 0u) << "CPU " << cpu << " given twice: " << on.out;
  EXPECT_NE(on.err.find("pinned to CPUs " + attention), std::string::npos) << on.err;
  EXPECT_NE(on.err.find("pinned to CPUs " + ffn), std::string::npos) << on.err;
  EXPECT_EQ(off.out.find("placed:"), std::string::npos) << off.out;
  EXPECT_EQ(off.err.find("pinned to CPUs"), std::string::npos) << off.err;
}

// ---- signals to the launcher ----

class InterruptTest : public LauncherTest, public testing::WithParamInterface<int> {};

// A stopped F keeps the job from finishing (nobody times out within the test); the signal must
// reach the running instances, and the stopped one is killed after the grace period.
TEST_P(InterruptTest, SignalToTheLauncherStopsEveryInstanceAndRemovesItsFolder) {
  const int signal = GetParam();
  std::string config = write_config("interrupt", 30000);
  ChildProcess demo({HETMESH_CLI, "demo", "--config", config});
  auto instances = wait_for_instances(demo.pid(), 4);
  ASSERT_EQ(instances.size(), 4u);
  ::kill(instances.at("ffn 1"), SIGSTOP);
  std::this_thread::sleep_for(milliseconds(200));  // the others are joining, or waiting on it
  auto start = Clock::now();
  demo.kill(signal);
  ProcessResult r = demo.wait(std::chrono::seconds(30));
  std::printf("[ figure ] %s to the launcher: it ended %.3f s later\n",
              signal == SIGTERM ? "SIGTERM" : "SIGINT", seconds_since(start));
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 128 + signal) << r.describe();
  EXPECT_TRUE(all_ended(instances, milliseconds(0))) << "an instance outlived the launcher";
  EXPECT_TRUE(demo_folders(demo.pid()).empty());
  fs::remove(config);
}

INSTANTIATE_TEST_SUITE_P(Signals, InterruptTest, testing::Values(SIGTERM, SIGINT),
                         [](const auto& p) { return p.param == SIGTERM ? "SIGTERM" : "SIGINT"; });

TEST_F(LauncherTest, InstancesDieWithAKilledLauncher) {
  std::string config = write_config("sigkill", 30000);
  ChildProcess demo({HETMESH_CLI, "demo", "--config", config});
  auto instances = wait_for_instances(demo.pid(), 4);
  ASSERT_EQ(instances.size(), 4u);
  ::kill(instances.at("ffn 1"), SIGSTOP);  // so the job cannot finish first
  auto start = Clock::now();
  demo.kill(SIGKILL);
  demo.wait(std::chrono::seconds(10));
  EXPECT_TRUE(all_ended(instances, milliseconds(30000))) << "instances outlived their launcher";
  std::printf("[ figure ] SIGKILL of the launcher: its instances were gone %.3f s later\n",
              seconds_since(start));
  for (const auto& folder : demo_folders(demo.pid()))  // a killed launcher cannot clean up
    fs::remove_all(folder);
  fs::remove(config);
}

// ---- a stopped instance ----

class StoppedInstanceTest : public LauncherTest, public testing::WithParamInterface<std::string> {};

// The job's overall limit is 4 timeouts (layers + 2): far beyond the stopped instance's detection
// (a timeout, or the launcher's limit of a timeout and 500 ms), however slowly the job starts.
TEST_P(StoppedInstanceTest, IsKilledAndTheJobEndsWithinItsTimeout) {
  constexpr int kTimeoutMs = 20000;
  const std::string stopped = GetParam();
  std::string config = write_config("sigstop", kTimeoutMs);
  auto start = Clock::now();
  ChildProcess demo({HETMESH_CLI, "demo", "--config", config});
  auto instances = wait_for_instances(demo.pid(), 4);
  ASSERT_EQ(instances.size(), 4u);
  ::kill(instances.at(stopped), SIGSTOP);
  ProcessResult r = demo.wait(std::chrono::seconds(300));
  double took = seconds_since(start);
  std::printf("[ figure ] SIGSTOP of %s: the job (timeout %d ms) ended %.3f s after it started\n",
              stopped.c_str(), kTimeoutMs, took);
  EXPECT_EQ(r.exit_code, 1) << r.describe();
  // Ended by the stopped instance's detection (a peer's timeout or heartbeat, or the launcher's
  // stopped limit), not by the job's overall limit, which kills what is left as "timed out".
  EXPECT_EQ(r.err.find("timed out and was killed"), std::string::npos) << r.err;
  EXPECT_TRUE(all_ended(instances, milliseconds(0))) << "the stopped one outlived the launcher";
  EXPECT_TRUE(demo_folders(demo.pid()).empty());
  fs::remove(config);
}

INSTANTIATE_TEST_SUITE_P(Instances, StoppedInstanceTest,
                         testing::Values("ffn 1", "attention 1", "attention 0"), [](const auto& p) {
                           std::string name = p.param;
                           std::replace(name.begin(), name.end(), ' ', '_');
                           return name;
                         });

// ---- the store's host dies ----

// This binary as a store's host: prints the store's address, then serves until killed.
int host_store() {
  TcpStoreServer server("127.0.0.1:0");
  std::printf("%s\n", server.address().c_str());
  std::fflush(stdout);
  for (;;)
    pause();
}

TEST_F(LauncherTest, InstancesInRendezvousEndSoonWhenTheStoresHostDies) {
  ChildProcess store_host({self_executable(), "--host-store"});
  std::string address = store_host.read_line(std::chrono::seconds(10));
  std::string config = write_config("store", 60000);
  // This host's share of a job whose store is elsewhere: its F instances wait in rendezvous for
  // the attention instances, which never come.
  fs::path err = fs::path(testing::TempDir()) / fmt::format("launcher-store-{}.err", getpid());
  ChildProcess demo({"/bin/sh", "-c",
                     fmt::format("exec '{}' demo --config '{}' --instances ffn --store {} 2>'{}'",
                                 HETMESH_CLI, config, address, err.string())});
  auto instances = wait_for_instances(demo.pid(), 2);
  ASSERT_EQ(instances.size(), 2u);
  {  // Both F instances are in rendezvous (they published their endpoints): not still connecting,
     // which would wait for a store that may not be up yet, as a start must.
    auto watcher = connect_tcp_store(address, std::chrono::seconds(10));
    for (int f = 0; f < 2; ++f)
      watcher->get(fmt::format("hetmesh/ffn/{}/epoch", f), std::chrono::seconds(60));
  }
  std::this_thread::sleep_for(milliseconds(100));  // and waiting for the attention instances
  auto start = Clock::now();
  store_host.kill(SIGKILL);
  store_host.wait(std::chrono::seconds(10));
  ProcessResult r = demo.wait(std::chrono::seconds(60));
  std::printf("[ figure ] the store's host killed: the job waiting on it ended %.3f s later\n",
              seconds_since(start));
  EXPECT_EQ(r.exit_code, 1) << r.describe();
  EXPECT_TRUE(all_ended(instances, milliseconds(0)));
  std::ifstream in(err);
  std::string errors((std::istreambuf_iterator<char>(in)), {});
  EXPECT_NE(errors.find("tcp store " + address), std::string::npos) << errors;  // names the store
  // Ended by the store's broken connection (closed or reset), not by waiting out the 60 s
  // rendezvous timeout.
  EXPECT_NE(errors.find("(is the store's host still running?)"), std::string::npos) << errors;
  EXPECT_EQ(errors.find("did not appear"), std::string::npos) << errors;
  EXPECT_TRUE(demo_folders(demo.pid()).empty());
  fs::remove(config);
  fs::remove(err);
}

// ---- LocalJob itself, with this binary's child roles ----

// This binary as an instance of a LocalJob: --role R --rank N --store S --out D ACTION, where
// ACTION is "sleep" (until killed), an exit status, or, as real instances of job "job" do,
// "fail" (publish a failure in S, then exit with 1) or "after-failure" (once a failure is
// published in S, exit with the status of an instance that another's failure stopped).
int run_child(int argc, char** argv) {
  if (argc < 10) return 2;
  if (std::strcmp(argv[9], "fail") == 0) {
    auto store = connect_tcp_store(argv[6], std::chrono::seconds(10));
    publish_job_failure(*store, "job", fmt::format("{}:{}: a planted failure", argv[2], argv[4]));
    return 1;
  }
  if (std::strcmp(argv[9], "after-failure") == 0) {
    auto store = connect_tcp_store(argv[6], std::chrono::seconds(10));
    store->get("job/failed", std::chrono::seconds(30));
    return afd::kExitAfterAnotherFailure;
  }
  if (std::strcmp(argv[9], "sleep") != 0) return std::atoi(argv[9]);
  for (;;)
    pause();
}

TEST(LocalJobTest, StoppedInstanceIsKilledAsFailedAndTheOthersAreStopped) {
  TcpStoreServer server("127.0.0.1:0");
  afd::LocalJob job({}, server.address(), testing::TempDir(), "job");
  job.start("attention", 0, {"sleep"});
  ChildProcess& ffn = job.start("ffn", 0, {"sleep"});
  ffn.kill(SIGSTOP);
  auto start = Clock::now();
  auto failures = job.wait(std::chrono::seconds(60), milliseconds(300));
  std::printf("[ figure ] a stopped instance (limit 300 ms): the job ended after %.3f s\n",
              seconds_since(start));
  ASSERT_EQ(failures.size(), 1u);
  EXPECT_EQ(failures[0].describe(),
            "ffn:0 failed (stopped by a signal for more than 300 ms: killed)");
}

TEST(LocalJobTest, FirstFailureStopsTheOthersAndItsConsequencesAreNotRootCauses) {
  TcpStoreServer server("127.0.0.1:0");
  afd::LocalJob job({}, server.address(), testing::TempDir(), "job");
  job.start("attention", 0, {"sleep"});
  job.start("attention", 1, {"after-failure"});
  job.start("ffn", 0, {"fail"});
  auto failures = job.wait(std::chrono::seconds(60));
  std::vector<std::string> explained = job.explain(failures);
  ASSERT_EQ(explained.size(), 2u) << fmt::format("{}", fmt::join(explained, " / "));
  EXPECT_EQ(explained[0], "ffn:0 failed (exit code 1)");
  EXPECT_EQ(explained[1], "1 instance(s) here stopped after that failure");
}

// ---- the mechanism, in one process ----

TEST(JobFailureTest, PublishedFailureEndsEveryRendezvousWaitWithItsReport) {
  TcpStoreServer server("127.0.0.1:0");
  auto store = connect_tcp_store(server.address(), std::chrono::seconds(5));
  Rendezvous bad(*store, "job", "ffn", 1);
  EXPECT_TRUE(bad.report_failure("device selector 'cpu:3': no such device"));
  EXPECT_FALSE(Rendezvous(*store, "job", "attention", 0).report_failure("a consequence"));
  auto report = job_failure(*store, "job");
  ASSERT_TRUE(report.has_value());
  EXPECT_EQ(report->rfind("ffn:1 on ", 0), 0u) << *report;
  EXPECT_NE(report->find(fmt::format("pid {}: device selector 'cpu:3'", getpid())),
            std::string::npos)
      << *report;

  Rendezvous waiting(*store, "job", "attention", 0);
  auto expect_job_failed = [&](const char* what, auto&& wait) {
    auto start = Clock::now();
    try {
      wait();
      ADD_FAILURE() << what << " returned";
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), kStatusJobFailed) << what << ": " << e.what();
      EXPECT_NE(std::string(e.what()).find("job 'job' failed: ffn:1 on "), std::string::npos)
          << e.what();
    }
    // The published failure, not the 60 s it was given: the status and the report say so.
    std::printf("[ figure ] %s ended %.3f s after it started\n", what, seconds_since(start));
  };
  expect_job_failed("fetch",
                    [&] { waiting.fetch("ffn", 0, "endpoint", std::chrono::seconds(60)); });
  expect_job_failed("wait_for_world",
                    [&] { waiting.wait_for_world(1, 2, std::chrono::seconds(60)); });
  expect_job_failed("barrier", [&] { barrier(*store, "b", 2, std::chrono::seconds(60), "job"); });
  expect_job_failed("wait_for_departure",
                    [&] { wait_for_departure(*store, "job", 1, 2, std::chrono::seconds(60)); });
  // Other jobs, and waits that name no job, do not see it.
  EXPECT_THROW(Rendezvous(*store, "other", "attention", 0).fetch("ffn", 0, "x", milliseconds(150)),
               Error);
  try {
    wait_for_key(*store, "job/none", milliseconds(250), "other");
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), HM_ERR_TIMEOUT);
    EXPECT_NE(std::string(e.what()).find("did not appear within 250 ms"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace hetmesh

int main(int argc, char** argv) {
  if (argc == 2 && std::strcmp(argv[1], "--host-store") == 0) return hetmesh::host_store();
  if (argc > 2 && std::strcmp(argv[1], "--role") == 0) return hetmesh::run_child(argc, argv);
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
