#include "printer.hpp"

#include "report.hpp"

#include <gtest/gtest.h>

#include <cstdio>
#include <memory>

namespace hetmesh::cts {
namespace {

// Forwards every event to GoogleTest's printer but the two it would print unwanted text for.
class BriefPrinter : public testing::TestEventListener {
 public:
  explicit BriefPrinter(testing::TestEventListener* inner) : inner_(inner) {}

  void OnTestProgramStart(const testing::UnitTest& u) override { inner_->OnTestProgramStart(u); }
  void OnTestIterationStart(const testing::UnitTest& u, int) override {
    if (GTEST_FLAG_GET(shuffle))
      std::printf("Note: Randomizing tests' orders with a seed of %d .\n", u.random_seed());
    std::printf("[==========] Running %d tests.\n", u.test_to_run_count());
    std::fflush(stdout);
  }
  void OnEnvironmentsSetUpStart(const testing::UnitTest& u) override {
    inner_->OnEnvironmentsSetUpStart(u);
  }
  void OnEnvironmentsSetUpEnd(const testing::UnitTest& u) override {
    inner_->OnEnvironmentsSetUpEnd(u);
  }
  // GoogleTest calls both the suite and the legacy test-case events; its printer implements one
  // of the two, depending on its version: forward both.
  void OnTestSuiteStart(const testing::TestSuite& s) override { inner_->OnTestSuiteStart(s); }
#ifndef GTEST_REMOVE_LEGACY_TEST_CASEAPI_
  void OnTestCaseStart(const testing::TestCase& s) override {
    inner_->OnTestCaseStart(s);
  }
  void OnTestCaseEnd(const testing::TestCase& s) override {
    inner_->OnTestCaseEnd(s);
  }
#endif
  void OnTestStart(const testing::TestInfo& t) override {
    inner_->OnTestStart(t);
  }
  void OnTestDisabled(const testing::TestInfo& t) override {
    inner_->OnTestDisabled(t);
  }
  void OnTestPartResult(const testing::TestPartResult& part) override {
    if (part.type() == testing::TestPartResult::kSuccess) return;
    std::printf("%s:%d: %s\n%s\n", source_file(part.file_name()).c_str(), part.line_number(),
                part.skipped() ? "Skipped" : "Failure", part.message());
    std::fflush(stdout);
  }
  void OnTestEnd(const testing::TestInfo& t) override {
    inner_->OnTestEnd(t);
  }
  void OnTestSuiteEnd(const testing::TestSuite& s) override {
    inner_->OnTestSuiteEnd(s);
  }
  void OnEnvironmentsTearDownStart(const testing::UnitTest& u) override {
    inner_->OnEnvironmentsTearDownStart(u);
  }
  void OnEnvironmentsTearDownEnd(const testing::UnitTest& u) override {
    inner_->OnEnvironmentsTearDownEnd(u);
  }
  void OnTestIterationEnd(const testing::UnitTest& u, int i) override {
    inner_->OnTestIterationEnd(u, i);
  }
  void OnTestProgramEnd(const testing::UnitTest& u) override {
    inner_->OnTestProgramEnd(u);
  }

 private:
  std::unique_ptr<testing::TestEventListener> inner_;
};

}  // namespace

void use_brief_printer() {
  testing::TestEventListeners& listeners = testing::UnitTest::GetInstance()->listeners();
  testing::TestEventListener* inner = listeners.Release(listeners.default_result_printer());
  if (inner != nullptr) listeners.Append(new BriefPrinter(inner));  // owned by the list
}

}  // namespace hetmesh::cts
