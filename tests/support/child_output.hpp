// Reading what a child process of a multi-process test printed.
#pragma once

#include <hetmesh/core/error.hpp>
#include <hetmesh/core/subprocess.hpp>

#include <chrono>
#include <string>
#include <vector>

namespace hetmesh::test {

// The child's output lines until it closes its stdout (it exited), or until none comes within
// `each` (then what came so far).
inline std::vector<std::string> lines_until_exit(ChildProcess& child,
                                                 std::chrono::milliseconds each) {
  std::vector<std::string> lines;
  try {
    for (;;)
      lines.push_back(child.read_line(each));
  } catch (const Error&) {
  }
  return lines;
}

// The last of them, "" if none.
inline std::string last_line_until_exit(ChildProcess& child, std::chrono::milliseconds each) {
  std::vector<std::string> lines = lines_until_exit(child, each);
  return lines.empty() ? std::string() : lines.back();
}

}  // namespace hetmesh::test
