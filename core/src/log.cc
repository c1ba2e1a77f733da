// The log (log.hpp): the level and log file from the environment, the prefix that names the
// process, and the default sink (stderr plus the optional file).
#include <hetmesh/core/log.hpp>

#include "environment.hpp"

#include <unistd.h>

#include <array>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <mutex>
#include <optional>
#include <vector>

namespace hetmesh {
namespace {

constexpr std::array<std::string_view, 4> kLevelNames = {"error", "warn", "info", "debug"};

bool equal_ignoring_case(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(a[i])) != b[i]) return false;
  return true;
}

std::optional<LogLevel> parse_level(std::string_view text) {
  for (size_t i = 0; i < kLevelNames.size(); ++i)
    if (equal_ignoring_case(text, kLevelNames[i])) return static_cast<LogLevel>(i);
  return std::nullopt;
}

const char* tag(LogLevel level) {
  switch (level) {
    case LogLevel::error:
      return "E";
    case LogLevel::warn:
      return "W";
    case LogLevel::info:
      return "I";
    default:
      return "D";
  }
}

std::string host_name() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0 || name[0] == '\0') return "?";
  return name;
}

// HETMESH_LOG_FILE with every "%p" replaced by the pid.
std::string expand_pid(std::string path) {
  std::string pid = std::to_string(getpid());
  for (size_t at = path.find("%p"); at != std::string::npos; at = path.find("%p", at + pid.size()))
    path.replace(at, 2, pid);
  return path;
}

struct LogState {
  LogLevel threshold = LogLevel::warn;
  std::string host = host_name();
  std::mutex mutex;
  std::string identity;  // guarded by mutex
  LogSink sink;          // guarded by mutex
  FILE* file = nullptr;  // HETMESH_LOG_FILE, never closed: plugins may log during exit

  LogState() {
    // What is wrong with the environment is told once, on stderr, as the process starts logging.
    std::vector<std::string> warnings;
    if (const char* value = std::getenv("HETMESH_LOG"); value != nullptr) {
      if (auto level = parse_level(value))
        threshold = *level;
      else
        warnings.push_back(
            fmt::format("HETMESH_LOG=\"{}\" is not a log level (accepted, in any case: error, "
                        "warn, info, debug); using warn",
                        value));
    }
    if (const char* value = std::getenv("HETMESH_LOG_FILE"); value != nullptr && *value != '\0') {
      std::string path = expand_pid(value);
      file = std::fopen(path.c_str(), "a");
      if (file == nullptr)
        warnings.push_back(
            fmt::format("HETMESH_LOG_FILE: cannot open {}: {}; logging to stderr "
                        "only",
                        path, std::strerror(errno)));
    }
    for (std::string& warning : unknown_environment_warnings())
      warnings.push_back(std::move(warning));
    for (const std::string& warning : warnings)
      write(format_log_line(LogLevel::warn, warning, ""));
  }

  void write(const std::string& line) const {
    std::fprintf(stderr, "%s\n", line.c_str());
    if (file) std::fprintf(file, "%s\n", line.c_str()), std::fflush(file);
  }

  std::string format_log_line(LogLevel level, std::string_view message,
                              std::string_view who) const {
    auto now = std::chrono::system_clock::now();
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count();
    std::time_t seconds = static_cast<std::time_t>(ms / 1000);
    std::tm utc{};
    gmtime_r(&seconds, &utc);
    char when[32];
    std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &utc);
    return fmt::format("[hetmesh {} {}.{:03}Z {} pid={}{}{}] {}", tag(level), when, ms % 1000, host,
                       getpid(), who.empty() ? "" : " ", who, message);
  }
};

LogState& state() {
  static LogState* s = new LogState;  // never destroyed: plugins may log during exit
  return *s;
}

}  // namespace

void init_logging() {
  state();
}

bool log_enabled(LogLevel level) {
  return level <= state().threshold;
}

void log_message(LogLevel level, std::string_view message) noexcept {
  try {
    LogState& s = state();
    std::lock_guard lock(s.mutex);
    if (s.sink)
      s.sink(level, message);
    else
      s.write(s.format_log_line(level, message, s.identity));
  } catch (...) {
    log_unformatted(level);
  }
}

void log_unformatted(LogLevel level) noexcept {
  static constexpr std::string_view kLines[] = {
      "[hetmesh E] an error line could not be written (out of memory?)\n",
      "[hetmesh W] a warning line could not be written (out of memory?)\n",
      "[hetmesh I] an info line could not be written (out of memory?)\n",
      "[hetmesh D] a debug line could not be written (out of memory?)\n"};
  const std::string_view line = kLines[static_cast<size_t>(level) % 4];
  [[maybe_unused]] ssize_t n = ::write(STDERR_FILENO, line.data(), line.size());
}

LogSink set_log_sink(LogSink sink) {
  LogState& s = state();
  std::lock_guard lock(s.mutex);
  std::swap(s.sink, sink);
  return sink;
}

void set_log_identity(std::string_view identity) {
  LogState& s = state();
  std::lock_guard lock(s.mutex);
  s.identity = identity;
}

std::string format_log_line(LogLevel level, std::string_view message) {
  LogState& s = state();
  std::lock_guard lock(s.mutex);
  return s.format_log_line(level, message, s.identity);
}

}  // namespace hetmesh
