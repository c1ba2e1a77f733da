// The kit never hangs and never crashes: the tests run in a child hetmesh-cts that reports each
// test's start, the rules it names and its record on a pipe; this process holds every test to a
// deadline and the whole run to a budget. A test that passes its deadline, or that takes the child
// down (a plugin's crash), is recorded as failed, naming the test (its device or pair) and the rule
// it was checking, and a new child goes on with the tests after it. A plugin whose tests hung
// `max_hangs` times is tested no further, and once the budget is spent nothing more runs: the tests
// left are recorded as not run, so a plugin whose every wait hangs is judged within the budget.
// The copy and fill tests run first: most others check their results with copies, so where a copy
// is wrong the summary can say which later failures may follow from it (report.hpp).
#pragma once

#include "report.hpp"

#include <chrono>
#include <string>
#include <vector>

namespace hetmesh::cts {

struct Limits {
  std::chrono::seconds per_test{120};  // --test-timeout
  std::chrono::seconds budget{1800};   // --budget: the whole run
  int max_hangs = 3;                   // --max-hangs: per plugin
};

// In the child: reports to `fd` as the tests run ("S <test>", "R <rule>", "E <record JSON>").
void report_to(int fd);
// What the Recorder and check_rule tell the parent, if there is one (else nothing).
void report_start(const std::string& full_name);
void report_rule(const char* id);
void report_record(const TestRecord& record);

// In the child: the tests to run, one full name per line in `path`, as GoogleTest's filter.
void run_only_tests_listed_in(const std::string& path);

// In the parent: lists the tests `self` would run with `args` (the GoogleTest options, filter
// included, and ours), runs them in children within `limits`, and returns every test's record.
// Kills the running child's process group if this process is told to end (SIGTERM, SIGINT,
// SIGHUP: a CI job's timeout), and the child dies with this process in any case.
std::vector<TestRecord> run_supervised(const std::string& self,
                                       const std::vector<std::string>& args, const Limits& limits);

}  // namespace hetmesh::cts
