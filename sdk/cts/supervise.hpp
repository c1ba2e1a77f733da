// The kit never hangs and never crashes: the tests run in a child hetmesh-cts that reports each
// test's start, the rules it names and its record on a pipe; this process holds every test to a
// deadline. A test that passes it, or that takes the child down (a plugin's crash), is recorded as
// failed, naming the test (its device or pair) and the rule it was checking, and a new child goes
// on with the tests after it. The summary and the JUnit file are then written from the records.
#pragma once

#include "report.hpp"

#include <chrono>
#include <string>
#include <vector>

namespace hetmesh::cts {

// In the child: reports to `fd` as the tests run ("S <test>", "R <rule>", "E <record JSON>").
void report_to(int fd);
// What the Recorder and check_rule tell the parent, if there is one (else nothing).
void report_start(const std::string& full_name);
void report_rule(const char* id);
void report_record(const TestRecord& record);

// In the parent: runs `self` with `args` (the GoogleTest options, filter included, and ours),
// each test within `deadline`, and returns every test's record.
std::vector<TestRecord> run_supervised(const std::string& self,
                                       const std::vector<std::string>& args,
                                       std::chrono::seconds deadline);

}  // namespace hetmesh::cts
