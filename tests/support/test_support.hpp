// Helpers shared by the unit tests: errors thrown, build-tree paths, scoped environment variables,
// temp folders, captured log lines.
#pragma once

#include <hetmesh/core/error.hpp>
#include <hetmesh/core/log.hpp>

#include <gtest/gtest.h>

#include <sys/resource.h>

#include <chrono>

#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <optional>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

namespace hetmesh::test {

// Runs `fn` and returns the message of the hetmesh::Error it throws, checking its status; a test
// failure if it throws none.
template <typename Fn>
std::string error_of(Fn fn, hm_status expected) {
  try {
    fn();
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), expected) << status_name(e.status()) << ": " << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no hetmesh::Error was thrown";
  return {};
}

// Plugins of the build tree (absolute paths passed by tests/CMakeLists.txt to hetmesh_unit_test).
#ifdef HETMESH_TEST_PLUGIN_DIR
inline std::string plugin_path(const std::string& name) {
  return std::string(HETMESH_TEST_PLUGIN_DIR) + "/libhetmesh-device-" + name + ".so";
}
inline std::string cts_plugin_path(const std::string& name) {
  return std::string(HETMESH_TEST_CTS_PLUGIN_DIR) + "/libhetmesh-device-" + name + ".so";
}
inline std::string probe_path() {
  return HETMESH_TEST_PROBE;
}
#endif

// Sets (or, with nullopt, unsets) an environment variable and restores the old state on exit.
class ScopedEnv {
 public:
  ScopedEnv(std::string name, std::optional<std::string> value) : name_(std::move(name)) {
    if (const char* old = std::getenv(name_.c_str())) old_ = old;
    if (value)
      setenv(name_.c_str(), value->c_str(), 1);
    else
      unsetenv(name_.c_str());
  }
  ~ScopedEnv() {
    if (old_)
      setenv(name_.c_str(), old_->c_str(), 1);
    else
      unsetenv(name_.c_str());
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_;
  std::optional<std::string> old_;
};

// A fresh folder under the system temp folder, removed with its contents on exit.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "hetmesh-test-XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) ADD_FAILURE() << "mkdtemp failed";
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

// Captures log lines (from every thread) for the test's lifetime.
class LogCapture {
 public:
  LogCapture() {
    previous_ = set_log_sink([this](LogLevel, std::string_view line) {
      std::lock_guard lock(mutex_);
      lines_.emplace_back(line);
    });
  }
  ~LogCapture() { set_log_sink(previous_); }
  // Waits for a line containing `text` (as long as no loaded machine takes to log it).
  bool saw(const std::string& text) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (std::chrono::steady_clock::now() < deadline) {
      {
        std::lock_guard lock(mutex_);
        for (const auto& line : lines_)
          if (line.find(text) != std::string::npos) return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }
  std::string all() {
    std::lock_guard lock(mutex_);
    std::string out;
    for (const auto& line : lines_)
      out += line + "\n";
    return out;
  }

 private:
  LogSink previous_;
  std::mutex mutex_;
  std::vector<std::string> lines_;
};

// Raises this process's soft limit on open descriptors to `wanted` (no higher than the hard
// limit); false if the hard limit is lower.
inline bool raise_descriptor_limit(rlim_t wanted) {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_max < wanted) return false;
  if (limit.rlim_cur >= wanted) return true;
  limit.rlim_cur = wanted;
  return setrlimit(RLIMIT_NOFILE, &limit) == 0;
}

// ASan turns a SIGSEGV into a report and exit code 1; a child started after this (a probe, or a
// death test in the "threadsafe" style) dies of the signal itself, as it does without sanitizers.
inline std::string asan_options_keeping_segv() {
  const char* old = std::getenv("ASAN_OPTIONS");
  return (old && *old ? std::string(old) + ":" : std::string()) + "handle_segv=0";
}

}  // namespace hetmesh::test
