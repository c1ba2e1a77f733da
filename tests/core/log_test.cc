// The log: every line's prefix (level, UTC time, host, pid, role:rank), HETMESH_LOG in any case,
// the warnings about a bad HETMESH_LOG value and an unknown HETMESH_* variable (exactly once), the
// per-pid HETMESH_LOG_FILE, and plugin lines through the host's sink. The environment is read
// once per process, so those cases run this binary again as a child with the variables set.
#include <hetmesh/core/log.hpp>
#include <hetmesh/core/plugin.hpp>
#include <hetmesh/core/subprocess.hpp>

#include "test_support.hpp"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <iostream>
#include <regex>
#include <sstream>

namespace hetmesh {
namespace {

// The child: prints its pid on stdout, logs two lines at each level, then two as "ffn:1".
int child_main() {
  std::cout << getpid() << std::endl;
  for (int i = 0; i < 2; ++i) {
    log(LogLevel::error, "line at error");
    log(LogLevel::warn, "line at warn");
    log(LogLevel::info, "line at info");
    log(LogLevel::debug, "line at debug");
  }
  set_log_identity("ffn:1");
  log(LogLevel::warn, "line as ffn 1");
  // A plugin's own line (asic_stub says how many devices it made, at debug level).
  PluginLoadOptions options;
  options.search = false;
  options.explicit_paths = {test::plugin_path("asic_stub")};
  PluginRegistry::load(options);
  return 0;
}

struct Child {
  ProcessResult result;
  int pid = 0;
  const std::string& err() const { return result.err; }
};

// Runs the child with `environment` ("NAME=value" each) added to this process's.
Child run_child(const std::vector<std::string>& environment) {
  std::vector<std::string> argv = {"/usr/bin/env"};
  argv.insert(argv.end(), environment.begin(), environment.end());
  argv.push_back(self_executable());
  argv.push_back("--log-child");
  Child child{run_process(argv, std::chrono::seconds(30)), 0};
  EXPECT_EQ(child.result.exit_code, 0) << child.result.describe() << "\n" << child.result.err;
  child.pid = std::atoi(child.result.out.c_str());
  return child;
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1))
    ++n;
  return n;
}

std::string host() {
  char name[256] = {};
  gethostname(name, sizeof name - 1);
  return name;
}

// "[hetmesh W 2026-05-01T10:00:00.123Z host pid=42 ffn:1] text"
std::regex line_pattern(char tag, int pid, const std::string& identity, const std::string& text) {
  return std::regex(
      fmt::format(R"(\[hetmesh {} \d{{4}}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{{3}}Z {} pid={}{}\] {})",
                  tag, host(), pid, identity.empty() ? "" : " " + identity, text));
}

TEST(LogPrefix, NamesTimeHostPidAndOnceSetTheInstance) {
  std::string line = format_log_line(LogLevel::warn, "hello");
  EXPECT_TRUE(std::regex_match(line, line_pattern('W', getpid(), "", "hello"))) << line;
  // The time is UTC, now (this minute or the one before, if the clock turned in between).
  std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char minute[32];
  std::strftime(minute, sizeof minute, "%Y-%m-%dT%H:%M", &utc);
  std::time_t before = now - 60;
  gmtime_r(&before, &utc);
  char previous[32];
  std::strftime(previous, sizeof previous, "%Y-%m-%dT%H:%M", &utc);
  EXPECT_TRUE(line.find(minute) != std::string::npos || line.find(previous) != std::string::npos)
      << line << " is not UTC now (" << minute << ")";

  set_log_identity("attention:3");
  line = format_log_line(LogLevel::error, "bye");
  set_log_identity("");
  EXPECT_TRUE(std::regex_match(line, line_pattern('E', getpid(), "attention:3", "bye"))) << line;
}

TEST(LogChild, EveryLineOnStderrCarriesThePrefix) {
  Child child = run_child({"HETMESH_LOG=debug"});
  std::istringstream lines(child.err());
  int seen = 0;
  for (std::string line; std::getline(lines, line); ++seen)
    EXPECT_TRUE(std::regex_search(
        line, std::regex(fmt::format(R"(^\[hetmesh [EWID] \S+Z {} pid={}( ffn:1)?\] )", host(),
                                     child.pid))))
        << line;
  EXPECT_GE(seen, 9) << child.err();
  EXPECT_TRUE(
      std::regex_search(child.err(), line_pattern('W', child.pid, "ffn:1", "line as ffn 1")))
      << child.err();
  // The plugin's line went through the host's sink: the same prefix, with the instance.
  EXPECT_TRUE(
      std::regex_search(child.err(), line_pattern('D', child.pid, "ffn:1", "plugin: asic_stub: ")))
      << child.err();
}

TEST(LogChild, LevelTakesAnyCase) {
  for (const char* value : {"INFO", "info", "Info", "iNfO"}) {
    Child child = run_child({fmt::format("HETMESH_LOG={}", value)});
    EXPECT_EQ(count(child.err(), "line at info"), 2u) << value << "\n" << child.err();
    EXPECT_EQ(count(child.err(), "line at debug"), 0u) << value << "\n" << child.err();
    EXPECT_EQ(count(child.err(), "HETMESH_LOG="), 0u) << value << "\n" << child.err();
  }
  Child debug = run_child({"HETMESH_LOG=Debug"});
  EXPECT_EQ(count(debug.err(), "line at debug"), 2u) << debug.err();
  Child error = run_child({"HETMESH_LOG=ERROR"});
  EXPECT_EQ(count(error.err(), "line at error"), 2u) << error.err();
  EXPECT_EQ(count(error.err(), "line at warn"), 0u) << error.err();
}

TEST(LogChild, UnknownLevelIsWarnedAboutOnceAndTheDefaultUsed) {
  Child child = run_child({"HETMESH_LOG=verbose"});
  EXPECT_EQ(count(child.err(),
                  "HETMESH_LOG=\"verbose\" is not a log level (accepted, in any "
                  "case: error, warn, info, debug); using warn"),
            1u)
      << child.err();
  EXPECT_EQ(count(child.err(), "line at warn"), 2u) << child.err();
  EXPECT_EQ(count(child.err(), "line at info"), 0u) << child.err();
}

TEST(LogChild, UnknownVariableIsWarnedAboutOnce) {
  Child child = run_child({"HETMESH_LOGG=debug", "HETMESH_PLUGIN_PATH=/nowhere"});
  EXPECT_EQ(count(child.err(),
                  "unknown environment variable HETMESH_LOGG (ignored; did you mean "
                  "HETMESH_LOG?)"),
            1u)
      << child.err();
  EXPECT_EQ(count(child.err(), "unknown environment variable"), 1u)
      << child.err();                                                 // not the known
  EXPECT_EQ(count(child.err(), "line at debug"), 0u) << child.err();  // HETMESH_LOGG is not read
}

TEST(LogChild, LogFileHasOneFilePerPid) {
  test::TempDir dir;
  std::string pattern = dir.file("job-%p.log");
  Child first = run_child({"HETMESH_LOG_FILE=" + pattern});
  Child second = run_child({"HETMESH_LOG_FILE=" + pattern});
  ASSERT_NE(first.pid, second.pid);
  for (const Child* child : {&first, &second}) {
    std::ifstream in(dir.file(fmt::format("job-{}.log", child->pid)));
    ASSERT_TRUE(in) << "no log file for pid " << child->pid;
    std::string text{std::istreambuf_iterator<char>(in), {}};
    EXPECT_EQ(count(text, "line at warn"), 2u) << text;
    EXPECT_TRUE(std::regex_search(text, line_pattern('W', child->pid, "ffn:1", "line as ffn 1")))
        << text;
    EXPECT_EQ(count(child->err(), "line at warn"), 2u) << "stderr still gets the lines";
  }
}

TEST(LogChild, LogFileThatCannotBeOpenedIsOneWarning) {
  Child child = run_child({"HETMESH_LOG_FILE=/nonexistent/folder/x-%p.log"});
  EXPECT_EQ(count(child.err(), fmt::format("HETMESH_LOG_FILE: cannot open "
                                           "/nonexistent/folder/x-{}.log: No such file or "
                                           "directory; logging to stderr only",
                                           child.pid)),
            1u)
      << child.err();
  EXPECT_EQ(count(child.err(), "line at warn"), 2u) << child.err();
}

}  // namespace
}  // namespace hetmesh

int main(int argc, char** argv) {
  if (argc == 2 && std::strcmp(argv[1], "--log-child") == 0) return hetmesh::child_main();
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
