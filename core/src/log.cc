#include <hetmesh/core/log.hpp>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace hetmesh {
namespace {

LogLevel level_from_environment() {
  const char* value = std::getenv("HETMESH_LOG");
  if (value == nullptr) return LogLevel::warn;
  if (std::strcmp(value, "error") == 0) return LogLevel::error;
  if (std::strcmp(value, "info") == 0) return LogLevel::info;
  if (std::strcmp(value, "debug") == 0) return LogLevel::debug;
  return LogLevel::warn;
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

struct LogState {
  LogLevel threshold = level_from_environment();
  std::mutex mutex;
  LogSink sink;
};

LogState& state() {
  static LogState* s = new LogState;  // never destroyed: plugins may log during exit
  return *s;
}

}  // namespace

bool log_enabled(LogLevel level) {
  return level <= state().threshold;
}

void log_message(LogLevel level, std::string_view message) {
  LogState& s = state();
  std::lock_guard lock(s.mutex);
  if (s.sink) {
    s.sink(level, message);
  } else {
    std::fprintf(stderr, "[hetmesh %s] %.*s\n", tag(level), static_cast<int>(message.size()),
                 message.data());
  }
}

LogSink set_log_sink(LogSink sink) {
  LogState& s = state();
  std::lock_guard lock(s.mutex);
  std::swap(s.sink, sink);
  return sink;
}

}  // namespace hetmesh
