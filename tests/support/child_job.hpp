// A job of the test binary's own child processes (LocalJob: each started as `--role ROLE --rank
// RANK --store STORE --out DIR` plus the test's arguments) meeting through a real TCP store, and
// what they printed.
#pragma once

#include "child_output.hpp"

#include <hetmesh/afd/local_job.hpp>
#include <hetmesh/core/rendezvous.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

namespace hetmesh::test {

struct ChildJob {
  TcpStoreServer store{"127.0.0.1:0"};
  afd::LocalJob instances{{}, store.address(), testing::TempDir()};
};

inline std::string joined(const std::vector<std::string>& lines) {
  std::string out;
  for (const auto& line : lines)
    out += line + "\n";
  return out;
}

// Some line contains `text`.
inline bool has_line(const std::vector<std::string>& lines, const std::string& text) {
  return std::any_of(lines.begin(), lines.end(),
                     [&](const std::string& l) { return l.find(text) != std::string::npos; });
}

}  // namespace hetmesh::test
