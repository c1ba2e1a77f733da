// Logging for the core and, through hm_host_api.log, for plugins.
// The level comes from HETMESH_LOG (error, warn, info, debug); the default is warn.
#pragma once

#include <fmt/format.h>

#include <functional>
#include <string_view>

namespace hetmesh {

enum class LogLevel { error = 0, warn = 1, info = 2, debug = 3 };

using LogSink = std::function<void(LogLevel, std::string_view)>;

bool log_enabled(LogLevel level);
void log_message(LogLevel level, std::string_view message);
// Replaces the sink (stderr by default); returns the previous one. For embedding and tests.
LogSink set_log_sink(LogSink sink);

template <typename... Args>
void log(LogLevel level, fmt::format_string<Args...> format, Args&&... args) {
  if (log_enabled(level)) log_message(level, fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace hetmesh
