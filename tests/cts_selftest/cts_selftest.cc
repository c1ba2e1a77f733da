// Tests of the conformance kit itself: it must catch a plugin whose capability bits lie and each
// vendor bug planted in a correct plugin, name the ABI rule (HM-R<n>) each failure breaks, and
// apply known-failure lists as documented (listed failure = expected, listed pass = error).
#include <hetmesh/core/subprocess.hpp>

#include <gtest/gtest.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

namespace {

namespace fs = std::filesystem;

struct CtsRun {
  int exit_code;
  std::string out;
};

CtsRun run_cts(const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {HETMESH_CTS_PATH, "--gtest_filter=Device/*"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  hetmesh::ProcessResult r = hetmesh::run_process(argv, std::chrono::minutes(5));
  // ctest takes a test whose output holds GoogleTest's skip marker for skipped, so a failure of
  // ours that quotes the kit's output would pass unseen: quote it with the marker defused.
  for (std::string* text : {&r.out, &r.err})
    for (size_t at; (at = text->find("[  SKIPPED ]")) != std::string::npos;)
      text->replace(at, 12, "[  skipped ]");
  EXPECT_EQ(r.signal, 0) << "hetmesh-cts died: " << r.describe() << "\n" << r.out << r.err;
  return {r.exit_code, r.out};
}

// This process's scratch folder, removed when the process exits.
const fs::path& scratch_dir() {
  static const struct Scratch {
    fs::path path =
        fs::temp_directory_path() / ("hetmesh-cts-selftest-" + std::to_string(getpid()));
    Scratch() { fs::create_directories(path); }
    ~Scratch() {
      std::error_code ignored;
      fs::remove_all(path, ignored);
    }
  } scratch;
  return scratch.path;
}

fs::path write_file(const std::string& name, const std::string& text) {
  std::ofstream(scratch_dir() / name) << text;
  return scratch_dir() / name;
}

// The summary lines that start with `prefix` ("FAILED ", "expected failure ").
std::vector<std::string> lines_starting(const std::string& out, const std::string& prefix) {
  std::vector<std::string> lines;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);)
    if (line.rfind(prefix, 0) == 0) lines.push_back(line);
  return lines;
}

// Each such line names the rule(s) its failing checks verify: "<test> [HM-R16]".
void expect_every_line_names_a_rule(const std::string& out, const std::string& prefix) {
  static const std::regex kRuleTag(R"(\[HM-R[0-9]+(, HM-R[0-9]+)*\])");
  auto lines = lines_starting(out, prefix);
  EXPECT_FALSE(lines.empty()) << "no '" << prefix << "' line:\n" << out;
  for (const auto& line : lines)
    EXPECT_TRUE(std::regex_search(line, kRuleTag)) << "names no ABI rule: " << line;
}

// The liar claims HM_CAP_IPC with NULL IPC slots: each of these fails, breaking HM-R16 (a set bit
// is a promise, its slot is not NULL).
const char* kIpcTests[] = {"IpcHandleOpensInAnotherProcess",
                           "IpcHandleOfPinnedMemoryOpensInAnotherProcess",
                           "IpcExportRejectsForeignMemory", "IpcOpenRejectsGarbageHandle"};

TEST(CtsSelfTest, CapabilityLieFailsExactlyTheGatedTests) {
  CtsRun r = run_cts({"--plugin", HETMESH_LIAR_PLUGIN});
  EXPECT_EQ(r.exit_code, 1) << r.out;
  for (const char* test : kIpcTests)
    EXPECT_NE(
        r.out.find(std::string("FAILED            Device/DeviceTest.") + test + "/liar_0 [HM-R16]"),
        std::string::npos)
        << test << " not reported as failed with rule HM-R16:\n"
        << r.out;
  expect_every_line_names_a_rule(r.out, "FAILED ");
  EXPECT_NE(r.out.find("verdict: NOT CONFORMANT"), std::string::npos);
  EXPECT_EQ(r.out.find("FAILED            Device/DeviceTest.CopyRoundTrips"), std::string::npos)
      << "a test unrelated to the lie failed:\n"
      << r.out;
  EXPECT_EQ(r.out.find("NO RULE "), std::string::npos) << "a kit test names no rule:\n" << r.out;
}

TEST(CtsSelfTest, ListedFailuresAreExpected) {
  fs::path list = write_file("liar.expected",
                             "# the liar's IPC bit is false\n"
                             "Device/DeviceTest.Ipc*/liar_0  # claims IPC\n");
  CtsRun r = run_cts({"--plugin", HETMESH_LIAR_PLUGIN, "--expectations", list.string()});
  EXPECT_EQ(r.exit_code, 0) << r.out;
  for (const char* test : kIpcTests)
    EXPECT_NE(r.out.find(std::string("expected failure  Device/DeviceTest.") + test + "/liar_0"),
              std::string::npos)
        << r.out;
  expect_every_line_names_a_rule(r.out, "expected failure ");
  EXPECT_NE(r.out.find("verdict: CONFORMANT"), std::string::npos);
}

TEST(CtsSelfTest, ListedTestThatPassesIsAnError) {
  fs::path list = write_file("stale.expected",
                             "Device/DeviceTest.Ipc*/liar_0\n"
                             "Device/DeviceTest.StreamLifecycle/liar_0\n");
  CtsRun r = run_cts({"--plugin", HETMESH_LIAR_PLUGIN, "--expectations", list.string()});
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("UNEXPECTED PASS   Device/DeviceTest.StreamLifecycle/liar_0"),
            std::string::npos)
      << r.out;
}

TEST(CtsSelfTest, PluginShippedListIsFoundBesideTheLibrary) {
  fs::path dir = write_file("placeholder", "").parent_path() / "shipped";
  fs::create_directories(dir);
  fs::path plugin = dir / "libhetmesh-device-liar.so";
  fs::copy_file(HETMESH_LIAR_PLUGIN, plugin, fs::copy_options::overwrite_existing);
  std::ofstream(plugin.string() + ".cts-expected") << "Device/DeviceTest.Ipc*  # known lie\n";
  CtsRun r = run_cts({"--plugin", plugin.string()});
  EXPECT_EQ(r.exit_code, 0) << r.out;
}

// A plugin that hangs one slot and crashes in another (vendor bugs that used to hang the kit or
// take it down with no summary): each test that meets them fails, naming the test, its device and
// the rule it was checking; the tests after them still run; the summary and JUnit are written.
TEST(CtsSelfTest, AHangingOrCrashingPluginFailsThoseTestsAndTheRunGoesOn) {
  const std::string junit = (scratch_dir() / "supervised.xml").string();
  hetmesh::ProcessResult r = hetmesh::run_process(
      {"/usr/bin/env", "HM_TEST_LIAR_HANG=1", "HM_TEST_LIAR_CRASH=1", HETMESH_CTS_PATH, "--plugin",
       HETMESH_LIAR_PLUGIN, "--test-timeout", "20", "--junit", junit},
      std::chrono::minutes(5));
  for (std::string* text : {&r.out, &r.err})
    for (size_t at; (at = text->find("[  SKIPPED ]")) != std::string::npos;)
      text->replace(at, 12, "[  skipped ]");
  EXPECT_EQ(r.signal, 0) << r.describe();
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_NE(r.err.find("HostCallbacksRunInStreamOrder/liar_0: [HM-R31] hung: not done within 20 s"),
            std::string::npos)
      << r.err;
  // A signal, or under AddressSanitizer (whose handler takes the signal) its exit status.
  EXPECT_NE(r.err.find("EventTimingMeasuresElapsedTime/liar_0: [HM-R32] crashed the kit's "
                       "process: "),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.out.find("FAILED            Device/DeviceTest.HostCallbacksRunInStreamOrder/liar_0 "
                       "[HM-R31]"),
            std::string::npos)
      << r.out;
  // The tests after the crash and the hang ran: the IPC lies, which come later, are found.
  EXPECT_NE(r.out.find("FAILED            Device/DeviceTest.IpcOpenRejectsGarbageHandle/liar_0"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("verdict: NOT CONFORMANT"), std::string::npos) << r.out;
  std::stringstream xml;
  xml << std::ifstream(junit).rdbuf();
  EXPECT_NE(xml.str().find("hung: not done within 20 s"), std::string::npos) << xml.str();
}

// A plugin named with --plugin that is refused makes the run NOT CONFORMANT, in the printed
// verdict, the exit code and the JUnit file alike: nothing of it was tested.
TEST(CtsSelfTest, RefusedPluginIsAFailure) {
  const std::string junit = (scratch_dir() / "refused.xml").string();
  CtsRun r = run_cts({"--plugin", "/nonexistent/libhetmesh-device-ghost.so", "--junit", junit});
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("REFUSED (requested): /nonexistent/libhetmesh-device-ghost.so"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("verdict: NOT CONFORMANT"), std::string::npos) << r.out;
  std::stringstream xml;
  xml << std::ifstream(junit).rdbuf();
  EXPECT_NE(xml.str().find("<testsuite name=\"RequestedPlugins\" tests=\"1\" failures=\"1\">"),
            std::string::npos)
      << xml.str();
}

// The deliberately broken ABI plugins are the loader tests' subject: their refusals are checked
// there, not printed as warnings of every run.
TEST(CtsSelfTest, TheBrokenAbiPluginsAreNotWarnedAbout) {
  std::vector<std::string> argv = {HETMESH_CTS_PATH, "--gtest_filter=Abi*:Abi/*"};
  hetmesh::ProcessResult r = hetmesh::run_process(argv, std::chrono::minutes(5));
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ((r.out + r.err).find("refused plugin"), std::string::npos) << r.out << r.err;
  EXPECT_NE(r.out.find("verdict: CONFORMANT"), std::string::npos) << r.out;
}

// Where every wait of a plugin hangs, the kit stops testing it after --max-hangs hung tests: the
// rest of its tests are NOT RUN (a failure), instead of each costing --test-timeout.
TEST(CtsSelfTest, APluginWhoseWaitsAllHangIsGivenUpAfterMaxHangs) {
  hetmesh::ProcessResult r = hetmesh::run_process(
      {"/usr/bin/env", "HM_TEST_PLANT=every_wait_hangs", HETMESH_CTS_PATH, "--plugin",
       HETMESH_PLANTED_PLUGIN, "--test-timeout", "5", "--max-hangs", "2"},
      std::chrono::minutes(5));
  EXPECT_EQ(r.exit_code, 1) << r.describe() << r.out << r.err;
  // The planted plugin's own hangs (a test of no plugin that is slow on a loaded machine is not
  // one of them).
  std::regex hung(R"(/planted_\d+: \[[^\]]*\] hung: not done within 5 s)");
  auto hangs =
      std::distance(std::sregex_iterator(r.err.begin(), r.err.end(), hung), std::sregex_iterator());
  EXPECT_EQ(hangs, 2) << r.err;
  // The copy tests run first, so they are the ones that hang.
  EXPECT_NE(r.out.find("FAILED            Device/DeviceTest.CopyRoundTripsAtOddSizesAndOffsets/"
                       "planted_0 [HM-R25]"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("NOT RUN           Device/DeviceTest.StreamLifecycle/planted_0: not run: "
                       "plugin planted hung in 2 tests (--max-hangs)"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("verdict: NOT CONFORMANT"), std::string::npos) << r.out;
}

// A copy that drops its last byte fails most tests, since they check their results through
// copies: the copy tests run first and name the fault, and every later failure on that device
// says it may follow from them.
TEST(CtsSelfTest, FailuresAfterABrokenCopySayTheyMayFollowFromIt) {
  hetmesh::ProcessResult r =
      hetmesh::run_process({"/usr/bin/env", "HM_TEST_PLANT=copy_drops_last_byte", HETMESH_CTS_PATH,
                            "--plugin", HETMESH_PLANTED_PLUGIN, "--test-timeout", "60"},
                           std::chrono::minutes(10));
  EXPECT_EQ(r.exit_code, 1) << r.describe() << r.out << r.err;
  auto failed = lines_starting(r.out, "FAILED ");
  ASSERT_GT(failed.size(), 2u) << r.out;
  EXPECT_NE(failed.front().find("Device/DeviceTest.Copy"), std::string::npos)
      << "the first failure is not a copy test's: " << failed.front();
  int marked = 0;
  for (const auto& line : failed) {
    const std::string test = line.substr(18, line.find(' ', 18) - 18);
    if (test.rfind("Device/DeviceTest.Copy", 0) == 0 ||
        test.rfind("Device/DeviceTest.Fill", 0) == 0)
      continue;
    EXPECT_NE(line.find("(may follow from Device/DeviceTest.Copy"), std::string::npos) << line;
    ++marked;
  }
  EXPECT_GT(marked, 0) << r.out;
  std::smatch path;
  EXPECT_FALSE(std::regex_search(r.out, path, std::regex(R"(/\w+\.cc:\d+)")))
      << "a source file named with the build machine's folders: " << path.str();
  EXPECT_EQ(r.out.find("Note: Google Test filter"), std::string::npos) << r.out;
}

// A child that hangs after its tests (a runtime's exit handler that never returns) is stopped
// after --test-timeout and named, where the kit used to wait for it forever.
TEST(CtsSelfTest, AChildThatHangsAtExitIsStoppedAndNamed) {
  hetmesh::ProcessResult r =
      hetmesh::run_process({"/usr/bin/env", "HM_TEST_PLANT=exit_hangs", HETMESH_CTS_PATH,
                            "--plugin", HETMESH_PLANTED_PLUGIN, "--test-timeout", "5"},
                           std::chrono::minutes(5));
  EXPECT_FALSE(r.timed_out) << r.out << r.err;
  EXPECT_EQ(r.exit_code, 1) << r.describe() << r.out << r.err;
  EXPECT_NE(r.out.find("FAILED            hetmesh-cts.Exit [HM-R9]"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("the kit's child hung after its tests"), std::string::npos) << r.err;
}

// Once the run's budget is spent, the test running is stopped and nothing more runs.
TEST(CtsSelfTest, TheBudgetEndsTheRun) {
  hetmesh::ProcessResult r = hetmesh::run_process(
      {"/usr/bin/env", "HM_TEST_PLANT=every_wait_hangs", HETMESH_CTS_PATH, "--plugin",
       HETMESH_PLANTED_PLUGIN, "--test-timeout", "600", "--budget", "3"},
      std::chrono::minutes(5));
  EXPECT_EQ(r.exit_code, 1) << r.describe() << r.out << r.err;
  EXPECT_NE(r.out.find("NOT RUN           Device/DeviceTest.StreamLifecycle/planted_0: not run: "
                       "the run's budget of 3 s was spent (--budget)"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("verdict: NOT CONFORMANT"), std::string::npos) << r.out;
}

// A kit ended from outside (a CI job's timeout sends SIGTERM; SIGKILL leaves it no say) leaves
// none of its processes: not the child running a hung test, nor what that child started.
class KilledKit : public testing::TestWithParam<int> {};

TEST_P(KilledKit, LeavesNoProcessBehind) {
  const std::string mark =
      "HM_TEST_KIT_MARK=" + std::to_string(getpid()) + "-" + std::to_string(GetParam());
  hetmesh::ChildProcess kit({"/usr/bin/env", "HM_TEST_PLANT=every_wait_hangs", mark,
                             HETMESH_CTS_PATH, "--plugin", HETMESH_PLANTED_PLUGIN, "--test-timeout",
                             "600"});
  // The first test's start: the copy test that hangs.
  for (std::string line; line.find("[ RUN      ]") == std::string::npos;)
    line = kit.read_line(std::chrono::minutes(2));
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  kit.kill(GetParam());
  hetmesh::ProcessResult ended = kit.wait(std::chrono::seconds(30));
  EXPECT_FALSE(ended.timed_out);
  std::vector<std::string> left;
  for (int tries = 0; tries < 100; ++tries) {
    left.clear();
    for (const auto& entry : fs::directory_iterator("/proc")) {
      std::ifstream environ(entry.path() / "environ");
      std::string text((std::istreambuf_iterator<char>(environ)), {});
      if (text.find(mark) != std::string::npos) left.push_back(entry.path().filename());
    }
    if (left.empty()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(left.empty()) << left.size() << " of the kit's processes still run, first pid "
                            << left.front();
}

INSTANTIATE_TEST_SUITE_P(Kit, KilledKit, testing::Values(SIGTERM, SIGKILL),
                         [](const testing::TestParamInfo<int>& param) {
                           return param.param == SIGTERM ? std::string("SIGTERM")
                                                         : std::string("SIGKILL");
                         });

// ---- planted bugs (planted_plugin.cc): asic_stub with one vendor mistake each ----

struct Planted {
  const char* bug;
  const char* caught_by;  // a FAILED line of the summary: test, device and rule
};

// Where the kit catches each bug. One line per bug; the run may fail other tests too.
const Planted kPlanted[] = {
    {"event_rerecord_ignored",
     "Device/DeviceTest.EventRecordedAgainCapturesTheNewWork/planted_0 [HM-R29]"},
    {"elapsed_in_microseconds", "Device/DeviceTest.EventTimingIsInMilliseconds/planted_0 [HM-R32]"},
    {"elapsed_of_pending_ok",
     "Device/DeviceTest.EventTimingOfAPendingEventIsNotReady/planted_0 [HM-R32]"},
    {"event_query_always_ok",
     "Device/DeviceTest.BlockedStreamReportsNotReadyAndTimesOut/planted_0 [HM-R28]"},
    {"copy_past_end",
     "Device/DeviceTest.CopyLeavesTheBytesAroundTheDestinationAlone/planted_0 [HM-R25]"},
    {"fill_past_end", "Device/DeviceTest.FillSetsExactlyTheRange/planted_0 [HM-R25]"},
    {"peer_copy_dropped",
     "Pair/PairTest.PeerCopyMovesEveryByteBetweenDevices/planted_0__planted_1 [HM-R25]"},
    {"write_value_low_16_bits", "Device/DeviceTest.WriteValueKeepsAll32Bits/planted_0 [HM-R34]"},
    {"write_value_at_enqueue",
     "Device/DeviceTest.WriteValueIsOrderedAfterPriorWork/planted_0 [HM-R34]"},
    {"geq_not_cyclic", "Device/DeviceTest.WaitValueConditions/planted_0 [HM-R35]"},
    {"write_value_through_device_pointer",
     "Device/DeviceTest.WriteValueLandsInEveryKindOfMemoryItAccepts/planted_0 [HM-R34]"},
    {"wait_value_through_device_pointer",
     "Device/DeviceTest.WaitValueHoldsOnEveryKindOfMemoryItAccepts/planted_0 [HM-R35]"},
    {"ipc_interior_refused",
     "Device/DeviceTest.IpcHandleOfAnInteriorPointerOpensTheWholeAllocation/planted_0 [HM-R36]"},
    {"ipc_device_memory_as_host",
     "Device/DeviceTest.IpcHandleOpensInAnotherProcess/planted_0 [HM-R38]"},
    {"ipc_pinned_kind_of_minor_0",
     "Device/DeviceTest.IpcHandleOfPinnedMemoryOpensInAnotherProcess/planted_0 [HM-R38]"},
    {"device_index_at_count", "Device/DeviceTest.RejectsInvalidDeviceIndex/planted_0 [HM-R12]"},
    {"copy_drops_last_byte",
     "Device/DeviceTest.CopyRoundTripsAtOddSizesAndOffsets/planted_0 [HM-R25]"},
    {"ipc_host_kind_to_old_host",
     "Device/DeviceTest.IpcMappingIsReportedInTheHostsMinor/planted_0 [HM-R38]"},
    {"free_of_foreign_ok",
     "Device/DeviceTest.ForeignPointersAreInvalidArguments/planted_0 [HM-R12]"},
    {"alloc_null_out_ok", "Device/DeviceTest.AllocRejectsBadArguments/planted_0 [HM-R12]"},
    {"null_stream_ok", "Device/DeviceTest.StreamRejectsBadArguments/planted_0 [HM-R13]"},
    {"event_bad_device_ok", "Device/DeviceTest.EventSlotsRejectBadArguments/planted_0 [HM-R12]"},
    {"callback_at_enqueue",
     "Device/DeviceTest.HostCallbackRunsAfterPriorWorkAndHoldsLaterWork/planted_0 [HM-R31]"},
    {"last_error_shared", "Device/DeviceTest.LastErrorIsPerThread/planted_0 [HM-R11]"},
    {"last_error_stale", "Device/DeviceTest.LastErrorNamesTheFailingCall/planted_0 [HM-R11]"},
    {"dmabuf_whole_allocation",
     "Device/DeviceTest.DmabufExportOfASubRangeCoversThatRange/planted_0 [HM-R39]"},
    {"unknown_option_accepted", "Device/DeviceTest.UnknownOptionFailsInitialize/planted_0 [HM-R8]"},
    {"entry_starts_thread",
     "Device/DeviceTest.EntryPointStartsNoThreadAndIsIdempotent/planted_0 [HM-R2]"},
    {"cross_device_wait_dropped",
     "Pair/PairTest.EventOnOneDeviceOrdersWorkOnAnother/planted_0__planted_1 [HM-R30]"},
    {"finite_sync_waits_forever",
     "Device/DeviceTest.BlockedStreamReportsNotReadyAndTimesOut/planted_0 [HM-R28]"},
    {"false_host_addressable",
     "Device/DeviceTest.HostAddressableDeviceMemoryIsReadableByTheHost/planted_0 [HM-R18]"},
    {"racy_allocation_table", "Device/DeviceTest.AllocFreeStormFromManyThreads/planted_0 [HM-R19]"},
    {"pointer_query_of_foreign_crashes",
     "Device/DeviceTest.PointerQueryOfForeignMemoryIsUnknown/planted_0 [HM-R24]"},
    {"extension_ignores_min_version",
     "Device/DeviceTest.NamedExtensionsHonourTheirVersion/planted_0 [HM-R41]"},
};

// The whole kit over the planted plugin with `bug` (none: ""). A hung test costs --test-timeout,
// which no test that passes comes near on a loaded machine.
hetmesh::ProcessResult run_planted(const std::string& bug) {
  hetmesh::ProcessResult r =
      hetmesh::run_process({"/usr/bin/env", "HM_TEST_PLANT=" + bug, HETMESH_CTS_PATH, "--plugin",
                            HETMESH_PLANTED_PLUGIN, "--test-timeout", "30"},
                           std::chrono::minutes(10));
  for (std::string* text : {&r.out, &r.err})
    for (size_t at; (at = text->find("[  SKIPPED ]")) != std::string::npos;)
      text->replace(at, 12, "[  skipped ]");
  EXPECT_EQ(r.signal, 0) << "hetmesh-cts died: " << r.describe();
  return r;
}

// Without a bug the wrapper is asic_stub: conformant, so every failure below is its bug's.
TEST(CtsSelfTest, PlantedPluginWithoutABugIsConformant) {
  hetmesh::ProcessResult r = run_planted("");
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("verdict: CONFORMANT"), std::string::npos) << r.out;
}

void PrintTo(const Planted& planted, std::ostream* out) {
  *out << planted.bug;
}

class PlantedBug : public testing::TestWithParam<Planted> {};

TEST_P(PlantedBug, IsCaughtNamingItsRule) {
  const Planted& p = GetParam();
  hetmesh::ProcessResult r = run_planted(p.bug);
  const std::regex exports_dmabuf(R"(\n +capabilities: [a-z_|]*dmabuf_export)");
  if (std::string(p.bug).rfind("dmabuf", 0) == 0 && !std::regex_search(r.out, exports_dmabuf))
    GTEST_SKIP() << "asic_stub exports no dma-buf here (no /dev/udmabuf): nothing to plant in";
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_NE(r.out.find("verdict: NOT CONFORMANT"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(std::string("FAILED            ") + p.caught_by), std::string::npos)
      << p.bug << " was not caught by " << p.caught_by << ":\n"
      << r.out << r.err;
  expect_every_line_names_a_rule(r.out, "FAILED ");
}

INSTANTIATE_TEST_SUITE_P(Kit, PlantedBug, testing::ValuesIn(kPlanted),
                         [](const testing::TestParamInfo<Planted>& param) {
                           return std::string(param.param.bug);
                         });

}  // namespace
