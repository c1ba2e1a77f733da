// Outcome bookkeeping for hetmesh-cts: the ABI rule each check verifies, known failures, the
// verdict, JUnit XML and the summary.
#pragma once

#include "cts.hpp"

#include <map>
#include <string>
#include <vector>

namespace hetmesh::cts {

struct TestRecord {
  std::string suite;  // "Device/DeviceTest"
  std::string name;   // "CopyRoundTrips/cpu_0"
  // not_run: the supervisor did not run it (its plugin hung too often, or the budget ran out).
  enum Result { passed, skipped, failed, not_run } result = passed;
  std::string
      message;  // failure, skip or not-run text, each failure led by its rule: "[HM-R12] ..."
  double seconds = 0;
  std::vector<std::string> rules;         // every rule the test named (HM_RULE), in order
  std::vector<std::string> failed_rules;  // the rules of its failing checks
  std::string full_name() const { return suite + "." + name; }
  // "[HM-R12]": the rules of the failing checks, else every rule the test named.
  std::string rule_tag() const;
};

// Collects results as GoogleTest reports them.
class Recorder : public testing::EmptyTestEventListener {
 public:
  void OnTestStart(const testing::TestInfo& info) override;
  void OnTestPartResult(const testing::TestPartResult& part) override;
  void OnTestEnd(const testing::TestInfo& info) override;
  const std::vector<TestRecord>& records() const { return records_; }

 private:
  std::string pending_message_;
  std::vector<std::string> pending_failed_rules_;
  std::vector<TestRecord> records_;
};

// Known failures: test-name globs, each owned by a plugin (applies to tests involving it) or
// global (owner "").
class Expectations {
 public:
  void load(const std::string& path, const std::string& owner);  // throws on unreadable file
  void load_if_present(const std::string& path, const std::string& owner);
  // The matching entry's reason (or "listed in FILE"), or nullptr.
  const std::string* match(const std::string& full_name) const;

 private:
  struct Entry {
    std::string glob, owner, reason;
  };
  std::vector<Entry> entries_;
};

enum class Outcome { pass, skip, expected_fail, fail, unexpected_pass, not_run };

struct Verdict {
  std::vector<Outcome> outcomes;                           // parallel to the records
  std::vector<std::string> notes;                          // parallel: reason for expected failures
  std::map<std::string, std::map<Outcome, int>> by_group;  // plugin name, "pairs", "loader"
  std::vector<std::string> unruled;  // tests that named no rule: a bug of the kit itself
  // Plugins named with --plugin that the loader refused ("path: reason"): nothing of theirs was
  // tested, so the run cannot vouch for them.
  std::vector<std::string> refused_requested;
  // Per device parameter ("planted_0"), the first copy or fill test of it that failed.
  std::map<std::string, std::string> first_foundation_failure;
  int count(Outcome o) const;
  // "  (may follow from <test>)" for a failure on a device whose copy or fill test failed, or "".
  std::string may_follow(const TestRecord& r) const;
  bool conformant() const {
    return count(Outcome::fail) == 0 && count(Outcome::unexpected_pass) == 0 &&
           count(Outcome::not_run) == 0 && unruled.empty() && refused_requested.empty();
  }
};

// Plugins a test involves, from its parameter suffix ("cpu_0__asic_stub_1" -> cpu, asic_stub).
std::vector<std::string> plugins_in_test(const std::string& name);
// The copy and fill tests (HM-R25), which run first: most other tests check their results through
// copies, so a device's later failures may follow from a failed one, and the summary says so.
bool is_foundation(const std::string& full_name);

// A test's parameter: "cpu_0", "cpu_0__asic_stub_1", or "" for an unparameterised test.
std::string device_part(const std::string& name);
// The file name of a source path, without the build machine's folders.
std::string source_file(const char* path);

Verdict judge(const std::vector<TestRecord>& records, const Expectations& expectations);
void write_junit(const std::string& path, const std::vector<TestRecord>& records,
                 const Verdict& verdict);
void print_summary(const Environment& env, const std::vector<TestRecord>& records,
                   const Verdict& verdict, const std::vector<std::string>& requested_plugins);

}  // namespace hetmesh::cts
