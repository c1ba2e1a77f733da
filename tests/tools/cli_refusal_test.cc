// The real `hetmesh` binary refuses, at once and in words, what cannot work: a job too big for
// this machine's memory (the demo and bench afd), a missing or unusable temporary folder, and any
// other exception: one "hetmesh: error: ..." line and exit code 1, never an abort (exit 134) or
// std::bad_alloc after minutes of swapping. And it keeps an operator's conventions: --version,
// exit code 2 for usage errors, --json - and unwritable --json paths, `hetmesh config --print`.
#include <hetmesh/afd/job.hpp>
#include <hetmesh/core/subprocess.hpp>

#include "test_support.hpp"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>

namespace hetmesh {
namespace {

using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

struct CliRun {
  ProcessResult result;
  double seconds = 0;
};

// Runs `hetmesh` with `args` (or, `bare`, the command `args`), with "NAME=value" `environment`
// added.
CliRun run_cli(const std::vector<std::string>& args,
               const std::vector<std::string>& environment = {},
               std::chrono::milliseconds limit = std::chrono::seconds(60), bool bare = false) {
  std::vector<std::string> argv = {"/usr/bin/env"};
  argv.insert(argv.end(), environment.begin(), environment.end());
  if (!bare) argv.push_back(HETMESH_CLI);
  argv.insert(argv.end(), args.begin(), args.end());
  auto start = Clock::now();
  CliRun run{run_process(argv, limit), 0};
  run.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return run;
}

// Exit code 1 and one "hetmesh: error: " line on stderr that contains each of `parts`.
void expect_refused(const CliRun& run, const std::vector<std::string>& parts) {
  EXPECT_EQ(run.result.signal, 0) << run.result.describe() << "\n" << run.result.err;
  EXPECT_EQ(run.result.exit_code, 1) << run.result.describe() << "\n" << run.result.err;
  // One error line (a child may warn first, e.g. that it could not publish its failure).
  const std::string& err = run.result.err;
  size_t at = err.rfind("hetmesh: error: ", 0) == 0 ? 0 : err.find("\nhetmesh: error: ");
  EXPECT_NE(at, std::string::npos) << err;
  EXPECT_EQ(err.find("hetmesh: error: ", at == std::string::npos ? 0 : at + 16), std::string::npos)
      << "more than one error line:\n"
      << err;
  for (const std::string& part : parts)
    EXPECT_NE(run.result.err.find(part), std::string::npos) << "missing \"" << part << "\" in:\n"
                                                            << run.result.err;
  EXPECT_EQ(run.result.err.find("bad_alloc"), std::string::npos) << run.result.err;
}

double available_gib() {
  return static_cast<double>(afd::available_memory_bytes()) / (1024.0 * 1024 * 1024);
}

TEST(CliRefusal, StepMeshConfigIsRefusedAtOnceWhereItDoesNotFit) {
  // Its demo model (fp32 expert weights) is about 25 GiB per instance, 4 instances.
  if (available_gib() > 130) GTEST_SKIP() << "this machine has room for it";
  std::string config = std::string(HETMESH_EXAMPLE_CONFIG_DIR) + "/stepmesh-2a2f.toml";
  CliRun run = run_cli({"demo", "--config", config});
  expect_refused(run, {config + ": this job needs about ", "GiB of memory on this machine",
                       "attention 0: ", "ffn 1: ", "is available (", "the demo model's weights"});
  // Up front: before any instance starts (a benchmark figure, not an assertion on time).
  EXPECT_EQ(run.result.out.find("progress"), std::string::npos) << run.result.out;
  std::printf("refused after %.3f s\n", run.seconds);
}

TEST(CliRefusal, ShapeTooBigToAllocateIsAnErrorNotAnAbort) {
  test::TempDir dir;
  std::ofstream(dir.file("big.toml")) << "[model]\nhidden = 65536\n";
  CliRun run = run_cli({"demo", "--config", dir.file("big.toml")});
  expect_refused(run, {dir.file("big.toml") + ": this job needs about ", "is available"});
  // bench afd counts the engines' slots: 8 + 8 instances of 100 to 200 GiB of slots each.
  std::ofstream(dir.file("slots.toml")) << "[job]\nattention = 8\nffn = 8\nmicro_batches = 11\n"
                                           "[model]\nexperts = 8\ntokens = 131072\nhidden = 4096\n";
  if (available_gib() > 2000) GTEST_SKIP() << "this machine has room for the bench job";
  run = run_cli({"bench", "afd", "--config", dir.file("slots.toml")});
  expect_refused(run, {dir.file("slots.toml") + ": this job needs about ", "attention 7: "});
}

// A store that other hosts can reach needs the secret every host reads: a launcher refuses to host
// one on 0.0.0.0 with a secret of its own making that nobody else could learn, and names the key.
TEST(CliRefusal, AStoreBeyondLoopbackWithoutASecretFileIsRefused) {
  fs::path config = fs::path(testing::TempDir()) / fmt::format("wide-{}.toml", getpid());
  std::ofstream(config) << "[rendezvous]\naddress = \"0.0.0.0:0\"\n";
  CliRun run = run_cli({"demo", "--config", config.string()});
  expect_refused(run, {"[rendezvous] address 0.0.0.0:0 is reachable from other hosts",
                       "[rendezvous] secret_file"});
  fs::remove(config);
}

// A file the user names is read only when it is a regular file of a config's size: /dev/zero, a
// FIFO (whose open would wait for a writer), a folder and a 5 MiB file as the config, and a FIFO
// or /dev/zero as the job's secret file, are each refused at once, in words; none hangs the
// command or eats the machine's memory (60 s is only the bound that says "it hung").
TEST(CliRefusal, FilesThatAreNotRegularOrTooBigAreRefusedAtOnce) {
  test::TempDir dir;
  const std::string fifo = dir.file("fifo"), big = dir.file("big.toml");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  std::ofstream(big) << "# " << std::string(5 << 20, 'x') << "\n";
  const std::pair<std::string, std::string> configs[] = {
      {"/dev/zero", "hetmesh: error: config /dev/zero is a character device, not a regular file"},
      {fifo, "hetmesh: error: config " + fifo + " is a FIFO, not a regular file"},
      {dir.path().string(),
       "hetmesh: error: config " + dir.path().string() + " is a directory, not a regular file"},
      {big,
       "hetmesh: error: config " + big + " is 5242883 bytes; the most hetmesh reads is 4194304"},
  };
  for (const auto& [path, said] : configs) {
    SCOPED_TRACE(path);
    CliRun run = run_cli({"demo", "--config", path});
    EXPECT_FALSE(run.result.timed_out) << "hung on " << path;
    expect_refused(run, {said});
    run = run_cli({"config", "--print", "--config", path});
    expect_refused(run, {said});
  }
  for (const std::string& secret : {fifo, std::string("/dev/zero")}) {
    SCOPED_TRACE(secret);
    CliRun run = run_cli({"demo"}, {std::string("HETMESH_JOB_SECRET_FILE=") + secret});
    EXPECT_FALSE(run.result.timed_out) << "hung on " << secret;
    expect_refused(
        run, {"hetmesh: error: job secret file " + secret + " is a ", ", not a regular file"});
  }
}

TEST(CliRefusal, MissingTemporaryFolderIsNamed) {
  CliRun run = run_cli({"demo"}, {"TMPDIR=/nonexistent"});
  expect_refused(run, {"the temporary folder /nonexistent (from TMPDIR=/nonexistent) does not "
                       "exist; set TMPDIR to an existing folder you can write to"});
  run = run_cli({"bench", "afd", "--iterations", "1", "--no-bare"}, {"TMPDIR=/nonexistent"});
  expect_refused(run, {"/nonexistent", "TMPDIR"});
}

TEST(CliRefusal, TemporaryFolderThatIsAFileIsNamed) {
  test::TempDir dir;
  std::ofstream(dir.file("file")) << "x";
  CliRun run = run_cli({"demo"}, {"TMPDIR=" + dir.file("file")});
  expect_refused(run, {fmt::format("the temporary folder {} (from TMPDIR={}) is not a folder",
                                   dir.file("file"), dir.file("file"))});
}

// A plugin in the folders that crashes its process in initialize() (another vendor's broken
// runtime): a job whose devices do not name it never loads it, so it runs; `hetmesh info`, which
// looks at every plugin in a child first, names it.
TEST(CliConventions, AJobLoadsOnlyThePluginsItsDevicesName) {
  test::TempDir dir;
  fs::create_symlink(test::cts_plugin_path("abi_init_crashes"),
                     dir.file("libhetmesh-device-abi_init_crashes.so"));
  const std::string path = "HETMESH_PLUGIN_PATH=" + dir.path().string();
  CliRun run = run_cli(
      {"demo", "--config", std::string(HETMESH_EXAMPLE_CONFIG_DIR) + "/1a1f-cpu-ipc.toml"}, {path});
  EXPECT_EQ(run.result.exit_code, 0) << run.result.describe() << "\n" << run.result.err;
  EXPECT_NE(run.result.out.find("verified: final hidden states"), std::string::npos)
      << run.result.out;
  run = run_cli({"info"}, {path});
  EXPECT_EQ(run.result.exit_code, 0) << run.result.describe() << "\n" << run.result.err;
  EXPECT_NE((run.result.out + run.result.err).find("abi_init_crashes"), std::string::npos)
      << run.result.out;
}

// Out of descriptors (a real RLIMIT_NOFILE of 10, set by the shell before exec): the error names
// what was being created, for whom, and what to do, not a bare "pipe: Too many open files".
TEST(CliRefusal, RunningOutOfDescriptorsNamesWhatAndWhatToDo) {
#if defined(__SANITIZE_ADDRESS__)
  // The sanitizers' runtime needs descriptors of its own: at 10 its checks fail before hetmesh
  // gets to say anything ("memory cannot be printed").
  GTEST_SKIP() << "not under the sanitizers: their runtime needs descriptors of its own";
#endif
  CliRun run =
      run_cli({"/bin/sh", "-c", std::string("ulimit -n 10 && exec ") + HETMESH_CLI + " demo"}, {},
              std::chrono::seconds(60), /*bare=*/true);
  expect_refused(run, {"hetmesh: error: starting ", ": creating its ",
                       "Too many open files (this process is out of file descriptors: raise its "
                       "limit, ulimit -n)"});
}

// Out of address space (a real RLIMIT_AS, set by the shell before exec): at every limit, from one
// too small to start an instance's threads to one where only the launcher's own allocations fail
// (the demo's single-process reference after the job ran, bench afd's memcpy baselines), a job
// that cannot run says what it could not do (a thread it could not start, memory it could not
// allocate and for what) in one error line; no instance aborts (a constructor that had started
// one thread and failed to start the next once did: "terminate called without an active
// exception"), and no std::bad_alloc reaches the command's last resort unnamed ("out of memory
// (an allocation failed)", as the demo's reference model and bench afd's serial baseline did).
TEST(CliRefusal, RunningOutOfAddressSpaceIsNamedNeverAnAbort) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "not under the sanitizers: their shadow memory needs more address space";
#endif
  int refused = 0;
  for (const char* command : {"bench afd --iterations 20 --no-bare", "demo"})
    for (const char* kib : {"120000", "150000", "200000", "250000", "350000", "400000", "600000"}) {
      SCOPED_TRACE(std::string("ulimit -v ") + kib + ": hetmesh " + command);
      CliRun run =
          run_cli({"/bin/sh", "-c",
                   std::string("ulimit -v ") + kib + " && exec " + HETMESH_CLI + " " + command},
                  {}, std::chrono::seconds(120), /*bare=*/true);
      EXPECT_FALSE(run.result.timed_out);
      EXPECT_EQ(run.result.err.find("terminate called"), std::string::npos) << run.result.err;
      EXPECT_EQ(run.result.err.find("Aborted"), std::string::npos) << run.result.err;
      EXPECT_EQ(run.result.signal, 0) << run.result.describe();
      if (run.result.exit_code == 0) continue;  // that much was enough here
      ++refused;
      EXPECT_EQ(run.result.exit_code, 1) << run.result.describe();
      // The first error line (an instance's, or the command's own) says what failed, not a bare
      // errno text after the instance's name ("attention:0 on vm pid 6297: Resource temporarily
      // unavailable", as a thread that could not start said) nor an allocation it does not name:
      // a thread, an allocation with what it was for, a mapping with its size, or a store that
      // did not answer (which fails first at a given limit depends on the machine and its load).
      const std::string& err = run.result.err;
      const size_t at = err.find("hetmesh: error: ");
      ASSERT_NE(at, std::string::npos) << err;
      const std::string line = err.substr(at, err.find('\n', at) - at);
      EXPECT_FALSE(std::regex_match(line, std::regex(R"(hetmesh: error: (\S+ on \S+ pid \d+: )?)"
                                                     R"([A-Z][a-z ]+)")))
          << line;
      EXPECT_EQ(line.find("std::"), std::string::npos) << line;
      EXPECT_EQ(line.find("bad_alloc"), std::string::npos) << line;
      EXPECT_EQ(err.find("(an allocation failed)"), std::string::npos) << err;
    }
  EXPECT_GT(refused, 0) << "no limit was low enough to fail the job";
}

TEST(CliRefusal, AnyExceptionIsPrintedNotAborted) {
  // A child's rank beyond the job's: std::out_of_range from the device list, not a hetmesh::Error.
  CliRun run = run_cli(
      {"demo", "--role", "ffn", "--rank", "5", "--store", "127.0.0.1:1", "--out", "/nonexistent"});
  expect_refused(run, {});
}

// Across hosts, the --listen end serves one region, sized by its own --sizes: a measuring end
// whose sizes go further is told so at once, not by a write's bounds check.
TEST(CliRefusal, AListenEndTooSmallForTheSizesIsNamed) {
  ChildProcess listener({HETMESH_CLI, "bench", "transport", "--transport", "tcp", "--listen",
                         "127.0.0.1:0", "--sizes", "4K"});
  std::string line = listener.read_line(std::chrono::seconds(30));
  auto at = line.find("serving at ");
  ASSERT_NE(at, std::string::npos) << line;
  std::string address = line.substr(at + 11, line.find(';', at) - at - 11);
  CliRun run = run_cli({"bench", "transport", "--transport", "tcp", "--connect", address, "--sizes",
                        "1M", "--iterations", "10"});
  expect_refused(run, {"serves 4096 bytes (the largest of its --sizes)", "reach 1048576"});
}

// ---- the conventions an operator expects of the command (ucx_info, ibv_devinfo, nccl-tests) ----

TEST(CliConventions, VersionIsPrintedAndExitsZero) {
  CliRun run = run_cli({"--version"});
  EXPECT_EQ(run.result.exit_code, 0) << run.result.err;
  EXPECT_EQ(run.result.out, "hetmesh " + std::string(HETMESH_VERSION) + "\n");
}

TEST(CliConventions, UsageErrorsExitTwoAndNameWhatWasWrong) {
  CliRun unknown = run_cli({"frobnicate"});
  EXPECT_EQ(unknown.result.exit_code, 2);
  EXPECT_NE(
      unknown.result.err.find("unknown command 'frobnicate' (commands: demo, run, info, bench"),
      std::string::npos)
      << unknown.result.err;
  CliRun nested = run_cli({"bench", "latency"});
  EXPECT_EQ(nested.result.exit_code, 2);
  EXPECT_NE(nested.result.err.find("unknown command 'bench latency' (commands: transport, afd"),
            std::string::npos)
      << nested.result.err;
  CliRun option = run_cli({"info", "--no-such-option"});
  EXPECT_EQ(option.result.exit_code, 2);
  EXPECT_NE(option.result.err.find("--no-such-option"), std::string::npos) << option.result.err;
  CliRun value = run_cli({"bench", "afd", "--iterations", "many"});
  EXPECT_EQ(value.result.exit_code, 2) << value.result.err;
  EXPECT_EQ(run_cli({}).result.exit_code, 2);  // no command at all
  EXPECT_EQ(run_cli({"--help"}).result.exit_code, 0);
}

TEST(CliConventions, InfoSaysItsVersionWhereItSearchedAndWhyAPluginHasNoDevices) {
  const std::string dir = HETMESH_TEST_PLUGIN_DIR;
  CliRun run = run_cli({"info"}, {"HETMESH_PLUGIN_PATH=" + dir, "HETMESH_ASIC_STUB_DEVICES=0"});
  ASSERT_EQ(run.result.exit_code, 0) << run.result.err;
  EXPECT_EQ(run.result.out.rfind("hetmesh " + std::string(HETMESH_VERSION) + ", host ABI", 0), 0u)
      << run.result.out;
  EXPECT_NE(run.result.out.find("searched:\n  HETMESH_PLUGIN_PATH: " + dir), std::string::npos)
      << run.result.out;
  EXPECT_NE(run.result.out.find("(no devices: "), std::string::npos) << run.result.out;
  CliRun json = run_cli({"info", "--json"}, {"HETMESH_ASIC_STUB_DEVICES=0"});
  EXPECT_NE(json.result.out.find("\"hetmesh_version\": \"" + std::string(HETMESH_VERSION)),
            std::string::npos);
  EXPECT_NE(json.result.out.find("\"no_devices_because\""), std::string::npos);
}

TEST(CliConventions, JsonToAnUnwritablePathIsRefusedBeforeTheBenchmarkRuns) {
  CliRun run = run_cli({"bench", "transport", "--transport", "tcp", "--sizes", "4K", "--iterations",
                        "10", "--json", "/proc/no-such-folder/out.json"});
  expect_refused(run, {"--json /proc/no-such-folder/out.json: cannot write there"});
  EXPECT_EQ(run.result.out.find("one-way"), std::string::npos) << "it measured first:\n"
                                                               << run.result.out;
}

TEST(CliConventions, JsonDashIsTheOnlyThingOnStandardOutput) {
  CliRun run = run_cli({"bench", "transport", "--transport", "tcp", "--sizes", "4K", "--iterations",
                        "10", "--json", "-"});
  ASSERT_EQ(run.result.exit_code, 0) << run.result.err;
  EXPECT_EQ(run.result.out.front(), '{') << run.result.out;
  EXPECT_EQ(run.result.out.find("json:"), std::string::npos) << run.result.out;
  EXPECT_NE(run.result.err.find("4K"), std::string::npos) << "the table goes to stderr:\n"
                                                          << run.result.err;
}

TEST(CliConventions, ConfigPrintShowsTheEffectiveConfig) {
  test::TempDir dir;
  std::ofstream(dir.file("job.toml")) << "[job]\nffn = 3\n[devices]\nffn = \"asic_stub:0\"\n";
  CliRun run = run_cli({"config", "--print", "--config", dir.file("job.toml")});
  ASSERT_EQ(run.result.exit_code, 0) << run.result.err;
  EXPECT_NE(run.result.out.find("ffn = 3"), std::string::npos) << run.result.out;
  EXPECT_NE(run.result.out.find("ffn = \"asic_stub:0\""), std::string::npos) << run.result.out;
  EXPECT_NE(run.result.out.find("[rendezvous]"), std::string::npos) << run.result.out;
  EXPECT_NE(run.result.out.find("micro_batches = 3"), std::string::npos) << "defaults filled in";
  std::ofstream(dir.file("bad.toml")) << "[job]\nffm = 3\n";
  expect_refused(run_cli({"config", "--print", "--config", dir.file("bad.toml")}), {"ffm"});
}

}  // namespace
}  // namespace hetmesh
