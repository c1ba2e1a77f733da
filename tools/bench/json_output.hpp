// Where a benchmark's --json goes: a file, checked writable before the benchmark runs (it must not
// run for minutes and then fail to save), or "-": standard output, with the benchmark's table
// moved to standard error meanwhile, so that what a pipe reads is the JSON alone.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

namespace hetmesh::cli {

class JsonOutput {
 public:
  // Throws Error(INVALID_ARGUMENT) naming the path and why it cannot be written.
  explicit JsonOutput(std::string path);
  ~JsonOutput();
  JsonOutput(const JsonOutput&) = delete;
  JsonOutput& operator=(const JsonOutput&) = delete;

  // Writes `results` (and, for a file, says where on the table's stream).
  void write(const nlohmann::json& results);

 private:
  std::string path_;
  int saved_stdout_ = -1;  // with "-": the real standard output, while fd 1 is standard error
};

}  // namespace hetmesh::cli
