// Tests of the conformance kit itself: it must catch a plugin whose capability bits lie, and apply
// known-failure lists as documented (listed failure = expected, listed pass = error).
#include <hetmesh/core/subprocess.hpp>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

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
  EXPECT_EQ(r.signal, 0) << "hetmesh-cts died: " << r.describe() << "\n" << r.out << r.err;
  return {r.exit_code, r.out};
}

fs::path write_file(const std::string& name, const std::string& text) {
  fs::path dir = fs::temp_directory_path() / ("hetmesh-cts-selftest-" + std::to_string(getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / name) << text;
  return dir / name;
}

const char* kIpcTests[] = {"IpcHandleOpensInAnotherProcess", "IpcExportRejectsForeignMemory",
                           "IpcOpenRejectsGarbageHandle"};

TEST(CtsSelfTest, CapabilityLieFailsExactlyTheGatedTests) {
  CtsRun r = run_cts({"--plugin", HETMESH_LIAR_PLUGIN});
  EXPECT_EQ(r.exit_code, 1) << r.out;
  for (const char* test : kIpcTests)
    EXPECT_NE(r.out.find(std::string("FAILED            Device/DeviceTest.") + test + "/liar_0"),
              std::string::npos)
        << test << " not reported as failed:\n"
        << r.out;
  EXPECT_NE(r.out.find("verdict: NOT CONFORMANT"), std::string::npos);
  EXPECT_EQ(r.out.find("FAILED            Device/DeviceTest.CopyRoundTrips"), std::string::npos)
      << "a test unrelated to the lie failed:\n"
      << r.out;
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

TEST(CtsSelfTest, RefusedPluginIsAFailure) {
  CtsRun r = run_cts({"--plugin", "/nonexistent/libhetmesh-device-ghost.so"});
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("REFUSED (requested): /nonexistent/libhetmesh-device-ghost.so"),
            std::string::npos)
      << r.out;
}

}  // namespace
