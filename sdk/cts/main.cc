// hetmesh-cts: runs the conformance suite over every device the loader finds (or the plugins
// named with --plugin), applies each plugin's known-failure list, writes JUnit XML and prints a
// summary. Exit status 0 means conformant: no unexpected failure, no unexpected pass, no test left
// unrun. The tests run in a child process under a deadline each and a budget for the run
// (supervise.hpp): a plugin that hangs or crashes a test fails that test, and the run goes on.
#include "cts.hpp"
#include "entry_probe.hpp"
#include "ipc_peer.hpp"
#include "printer.hpp"
#include "report.hpp"
#include "supervise.hpp"

#include <hetmesh/core/subprocess.hpp>

#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

const char kUsage[] = R"(usage: hetmesh-cts [options] [gtest options]

  --plugin PATH        test this plugin file (repeatable); nothing else is loaded
  --expectations FILE  known failures (repeatable), in addition to each plugin's own
                       <plugin .so path>.cts-expected file
  --junit FILE         write JUnit XML here
  --test-timeout S     fail a test that runs longer than S seconds, and go on (default 120)
  --max-hangs N        run no more tests of a plugin whose tests hung N times (default 3)
  --budget S           run no more tests once the run took S seconds (default 1800): each
                       test left is NOT RUN, and the verdict NOT CONFORMANT
  --extension NAME     also check the named extension's table where a plugin answers it
                       (repeatable; hetmesh's own plugins' extensions are always checked)
  --gtest_filter=...   and the other GoogleTest options select and repeat tests

Known-failure files hold one test-name glob per line, '#' starts a comment. A listed test that
fails is an expected failure; a listed test that passes is an error; an unlisted failure fails.
)";

struct Options {
  std::vector<std::string> plugins;
  std::vector<std::string> expectation_files;
  std::vector<std::string> extensions;
  std::string junit;
  hetmesh::cts::Limits limits;
  std::string tests_file;               // in the supervised child: the tests it runs
  int report_fd = -1;                   // in the supervised child: where its reports go
  std::vector<std::string> child_args;  // what a child gets: --plugin and GoogleTest's options
  bool unsupervised = false;            // listing or help: GoogleTest answers, nothing runs
};

int positive(const std::string& option, const std::string& text) {
  size_t used = 0;
  int number = 0;
  try {
    number = std::stoi(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || number <= 0)
    throw std::runtime_error(option + " takes a whole number above 0, not '" + text + "'");
  return number;
}

// Takes our options out of argv, leaving GoogleTest's.
bool parse(int& argc, char** argv, Options* options) {
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&](std::vector<std::string>* list, std::string* one) {
      if (i + 1 >= argc) throw std::runtime_error(arg + " needs a value");
      if (list)
        list->push_back(argv[++i]);
      else
        *one = argv[++i];
    };
    if (arg == "--plugin") {
      value(&options->plugins, nullptr);
      options->child_args.insert(options->child_args.end(), {"--plugin", options->plugins.back()});
    } else if (arg == "--expectations") {
      value(&options->expectation_files, nullptr);
    } else if (arg == "--extension") {
      value(&options->extensions, nullptr);
      options->child_args.insert(options->child_args.end(),
                                 {"--extension", options->extensions.back()});
    } else if (arg == "--junit") {
      value(nullptr, &options->junit);
    } else if (arg == "--test-timeout" || arg == "--budget" || arg == "--max-hangs") {
      std::string text;
      value(nullptr, &text);
      int number = positive(arg, text);
      if (arg == "--test-timeout") options->limits.per_test = std::chrono::seconds(number);
      if (arg == "--budget") options->limits.budget = std::chrono::seconds(number);
      if (arg == "--max-hangs") options->limits.max_hangs = number;
    } else if (arg.rfind("--cts-report-fd=", 0) == 0) {
      options->report_fd = std::stoi(arg.substr(16));
    } else if (arg.rfind("--cts-tests-file=", 0) == 0) {
      options->tests_file = arg.substr(17);
    } else {
      if (arg == "-h" || arg == "--help") std::fputs(kUsage, stdout);
      if (arg == "-h" || arg == "--help" || arg.rfind("--gtest_list_tests", 0) == 0)
        options->unsupervised = true;
      options->child_args.push_back(arg);
      argv[kept++] = argv[i];
    }
  }
  argc = kept;
  return true;
}

// Leaves without running exit handlers: a plugin's (a vendor runtime's) that hangs never holds the
// kit once its output is written. The child that runs the tests exits normally, so that such a
// handler is seen there and named (hetmesh-cts.Exit).
[[noreturn]] void leave(int status) {
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(status);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace hetmesh;
  if (argc >= 2 && std::strcmp(argv[1], "--cts-ipc-peer") == 0)
    return cts::run_ipc_peer(argc, argv);
  if (argc >= 2 && std::strcmp(argv[1], "--cts-entry-probe") == 0)
    return cts::run_entry_probe(argc, argv);

  Options options;
  try {
    parse(argc, argv, &options);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hetmesh-cts: %s\n%s", e.what(), kUsage);
    return 2;
  }

  PluginLoadOptions load;
  load.explicit_paths = options.plugins;
  load.search = options.plugins.empty();
  load.isolate = true;  // a plugin that crashes while starting is reported, not fatal
  cts::Environment& env = cts::env();
  env.registry = PluginRegistry::load(load);
  env.devices = env.registry.devices();
  env.self = self_executable();
  env.extensions.insert(env.extensions.end(), options.extensions.begin(), options.extensions.end());

  cts::Expectations expectations;
  try {
    for (const auto& plugin : env.registry.plugins())
      expectations.load_if_present(plugin->path() + ".cts-expected", plugin->name());
    for (const auto& file : options.expectation_files)
      expectations.load(file, "");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hetmesh-cts: %s\n", e.what());
    leave(2);
  }

  std::vector<cts::TestRecord> records;
  if (options.report_fd >= 0 || options.unsupervised) {  // the child, or GoogleTest's own answers
    testing::InitGoogleTest(&argc, argv);
    if (!options.tests_file.empty()) cts::run_only_tests_listed_in(options.tests_file);
    if (options.report_fd >= 0) cts::use_brief_printer();
    auto* recorder = new cts::Recorder;  // owned by gtest's listener list
    testing::UnitTest::GetInstance()->listeners().Append(recorder);
    if (options.report_fd >= 0) cts::report_to(options.report_fd);
    int gtest_status = RUN_ALL_TESTS();
    if (options.report_fd >= 0) return gtest_status;
    leave(gtest_status);  // a listing or the help
  }
  try {
    records = cts::run_supervised(env.self, options.child_args, options.limits);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hetmesh-cts: cannot run the tests: %s\n", e.what());
    leave(2);
  }

  cts::Verdict verdict = cts::judge(records, expectations);
  for (const auto& r : env.registry.refused())
    for (const auto& p : options.plugins)
      if (r.path == p) verdict.refused_requested.push_back(r.path + ": " + r.reason);
  if (!options.junit.empty()) cts::write_junit(options.junit, records, verdict);
  cts::print_summary(env, records, verdict, options.plugins);
  leave(verdict.conformant() ? 0 : 1);
}
