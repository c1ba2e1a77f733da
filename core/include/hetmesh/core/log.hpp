// Logging for the core and, through hm_host_api.log, for plugins.
//
// Every line names where it came from, so the lines of a job's processes can be told apart:
//   [hetmesh W 2026-05-01T10:00:00.123Z node1 pid=4242 ffn:1] message
// (level, UTC time to the millisecond, host, pid, and the instance's role:rank once
// set_log_identity was called). Lines go to stderr, and also to HETMESH_LOG_FILE if set.
//
// Environment, read once, by the first use of the log (or init_logging):
//   HETMESH_LOG       error | warn | info | debug, any case; the default is warn. Another value is
//                     warned about once and the default is used.
//   HETMESH_LOG_FILE  also append every line to this file; "%p" in it becomes the pid, so each
//                     process of a job gets its own file. A file that cannot be opened is one
//                     warning, never fatal.
// A HETMESH_* variable that no part of hetmesh reads (a typo) is warned about once per process.
#pragma once

#include <fmt/format.h>

#include <functional>
#include <string>
#include <string_view>

// Exported from the library, which hides every other symbol (core/README.md, "Exports").
#pragma GCC visibility push(default)

namespace hetmesh {

enum class LogLevel { error = 0, warn = 1, info = 2, debug = 3 };

using LogSink = std::function<void(LogLevel, std::string_view)>;

// Reads the environment and gives its warnings now rather than at the first log line; a
// program's main calls it so that a typo in a variable is reported even by a quiet run.
void init_logging();

bool log_enabled(LogLevel level);
// Never throws (it is called from catch handlers and threads' last resorts): a line that cannot be
// written as asked (out of memory, a sink that throws) becomes a fixed line on stderr.
void log_message(LogLevel level, std::string_view message) noexcept;
// That fixed line, for a line whose words could not even be formatted.
void log_unformatted(LogLevel level) noexcept;
// Replaces the sink (stderr and the log file by default); returns the previous one. The sink gets
// the bare message, without the prefix. For embedding and tests.
LogSink set_log_sink(LogSink sink);

// Names this process in every later line, e.g. "ffn:1" (an AFD job's instance: role:rank).
void set_log_identity(std::string_view identity);
// The line as the default sink writes it (no newline): the prefix, then `message`.
std::string format_log_line(LogLevel level, std::string_view message);

template <typename... Args>
void log(LogLevel level, fmt::format_string<Args...> format, Args&&... args) noexcept {
  if (!log_enabled(level)) return;
  try {
    log_message(level, fmt::format(format, std::forward<Args>(args)...));
  } catch (...) {  // out of memory for the words
    log_unformatted(level);
  }
}

}  // namespace hetmesh

#pragma GCC visibility pop
