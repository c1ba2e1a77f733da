#include "json_output.hpp"

#include <hetmesh/core/error.hpp>

#include <fmt/format.h>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

namespace hetmesh::cli {

JsonOutput::JsonOutput(std::string path) : path_(std::move(path)) {
  if (path_ == "-") {
    std::fflush(stdout);
    saved_stdout_ = ::dup(STDOUT_FILENO);
    if (saved_stdout_ < 0 || ::dup2(STDERR_FILENO, STDOUT_FILENO) < 0)
      throw Error(
          HM_ERR_INVALID_ARGUMENT,
          fmt::format("--json -: cannot set standard output aside: {}", std::strerror(errno)));
    return;
  }
  // Opened for appending, so that an existing file is kept until the results replace it.
  int fd = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0)
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("--json {}: cannot write there: {}", path_, std::strerror(errno)));
  ::close(fd);
}

JsonOutput::~JsonOutput() {
  if (saved_stdout_ < 0) return;
  std::fflush(stdout);
  ::dup2(saved_stdout_, STDOUT_FILENO);
  ::close(saved_stdout_);
}

void JsonOutput::write(const nlohmann::json& results) {
  const std::string text = results.dump(2) + "\n";
  if (saved_stdout_ >= 0) {
    std::fflush(stdout);
    size_t done = 0;
    while (done < text.size()) {
      ssize_t n = ::write(saved_stdout_, text.data() + done, text.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0)
        throw Error(
            HM_ERR_INVALID_ARGUMENT,
            fmt::format("--json -: writing standard output failed: {}", std::strerror(errno)));
      done += static_cast<size_t>(n);
    }
    return;
  }
  std::ofstream out(path_, std::ios::trunc);
  out << text;
  out.close();
  if (!out)
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("--json {}: writing failed: {}", path_, std::strerror(errno)));
  fmt::print("json: {}\n", path_);
}

}  // namespace hetmesh::cli
