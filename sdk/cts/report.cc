#include "report.hpp"
#include "supervise.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <fnmatch.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <mutex>
#include <set>

namespace hetmesh::cts {
namespace {

// The rules the running test named. Checks may fail on a test's worker threads, hence the lock.
struct RuleLog {
  std::mutex mutex;
  std::vector<std::string> named;
};

RuleLog& rule_log() {
  static RuleLog* log = new RuleLog;
  return *log;
}

std::string current_rule() {
  std::lock_guard lock(rule_log().mutex);
  return rule_log().named.empty() ? std::string() : rule_log().named.back();
}

void add_unique(std::vector<std::string>* list, const std::string& item) {
  if (std::find(list->begin(), list->end(), item) == list->end()) list->push_back(item);
}

}  // namespace

std::string source_file(const char* path) {
  if (path == nullptr) return "?";
  const char* slash = std::strrchr(path, '/');
  return slash ? slash + 1 : path;
}

void check_rule(const char* id) {
  {
    std::lock_guard lock(rule_log().mutex);
    rule_log().named.push_back(id);
  }
  report_rule(id);  // to the supervising parent, if any: a test that hangs or crashes names it
}

std::string TestRecord::rule_tag() const {
  const std::vector<std::string>& shown = failed_rules.empty() ? rules : failed_rules;
  if (shown.empty()) return "[no rule]";
  std::vector<std::string> unique;
  for (const auto& rule : shown)
    add_unique(&unique, rule);
  return fmt::format("[{}]", fmt::join(unique, ", "));
}

void Recorder::OnTestStart(const testing::TestInfo& info) {
  report_start(fmt::format("{}.{}", info.test_suite_name(), info.name()));
  std::lock_guard lock(rule_log().mutex);
  rule_log().named.clear();
}

void Recorder::OnTestPartResult(const testing::TestPartResult& part) {
  if (part.failed() || part.skipped()) {
    if (!pending_message_.empty()) pending_message_ += "\n";
    std::string rule = part.failed() ? current_rule() : std::string();
    if (part.failed()) add_unique(&pending_failed_rules_, rule.empty() ? "no rule" : rule);
    pending_message_ +=
        fmt::format("{}{}:{}: {}", rule.empty() ? "" : "[" + rule + "] ",
                    source_file(part.file_name()), part.line_number(), part.message());
  }
}

void Recorder::OnTestEnd(const testing::TestInfo& info) {
  TestRecord record;
  record.suite = info.test_suite_name();
  record.name = info.name();
  const testing::TestResult* result = info.result();
  record.result = result->Failed()    ? TestRecord::failed
                  : result->Skipped() ? TestRecord::skipped
                                      : TestRecord::passed;
  record.seconds = static_cast<double>(result->elapsed_time()) / 1000.0;
  record.message = std::move(pending_message_);
  pending_message_.clear();
  record.failed_rules = std::move(pending_failed_rules_);
  pending_failed_rules_.clear();
  {
    std::lock_guard lock(rule_log().mutex);
    for (const auto& rule : rule_log().named)
      add_unique(&record.rules, rule);
  }
  records_.push_back(std::move(record));
  report_record(records_.back());
}

void Expectations::load_if_present(const std::string& path, const std::string& owner) {
  if (std::ifstream(path).good()) load(path, owner);
}

void Expectations::load(const std::string& path, const std::string& owner) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read expectations file " + path);
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    std::string reason = fmt::format("listed in {}:{}", path, number);
    if (size_t hash = line.find('#'); hash != std::string::npos) {
      std::string comment = line.substr(hash + 1);
      line.resize(hash);
      comment.erase(0, comment.find_first_not_of(" \t"));
      if (!comment.empty()) reason += ": " + comment;
    }
    line.erase(0, line.find_first_not_of(" \t"));
    line.erase(line.find_last_not_of(" \t\r") + 1);
    if (line.empty()) continue;
    if (line.find_first_of(" \t") != std::string::npos)
      throw std::runtime_error(
          fmt::format("{}:{}: '{}' is not a single test-name glob", path, number, line));
    entries_.push_back({line, owner, reason});
  }
}

const std::string* Expectations::match(const std::string& full_name) const {
  for (const Entry& e : entries_) {
    if (fnmatch(e.glob.c_str(), full_name.c_str(), 0) != 0) continue;
    if (!e.owner.empty()) {
      auto involved = plugins_in_test(full_name);
      if (std::find(involved.begin(), involved.end(), e.owner) == involved.end()) continue;
    }
    return &e.reason;
  }
  return nullptr;
}

std::string device_part(const std::string& name) {
  size_t slash = name.rfind('/');
  return slash == std::string::npos ? "" : name.substr(slash + 1);
}

std::string Verdict::may_follow(const TestRecord& r) const {
  if (is_foundation(r.full_name())) return "";
  // A pair's devices ("cpu_0__asic_stub_1") each may carry a failed copy.
  std::string devices = device_part(r.name);
  for (size_t start = 0; start < devices.size();) {
    size_t end = std::min(devices.find("__", start), devices.size());
    auto it = first_foundation_failure.find(devices.substr(start, end - start));
    if (it != first_foundation_failure.end() && !it->second.empty())
      return fmt::format("  (may follow from {})", it->second);
    start = end + 2;
  }
  return "";
}

std::vector<std::string> plugins_in_test(const std::string& name) {
  std::vector<std::string> plugins;
  size_t slash = name.rfind('/');
  if (slash == std::string::npos) return plugins;
  std::string param = name.substr(slash + 1);
  size_t start = 0;
  while (start < param.size()) {
    size_t end = param.find("__", start);
    if (end == std::string::npos) end = param.size();
    std::string token = param.substr(start, end - start);  // "asic_stub_1"
    size_t underscore = token.rfind('_');
    if (underscore != std::string::npos && underscore + 1 < token.size() &&
        token.find_first_not_of("0123456789", underscore + 1) == std::string::npos)
      plugins.push_back(token.substr(0, underscore));
    start = end + 2;
  }
  return plugins;
}

bool is_foundation(const std::string& full_name) {
  return full_name.rfind("Device/DeviceTest.Copy", 0) == 0 ||
         full_name.rfind("Device/DeviceTest.Fill", 0) == 0;
}

int Verdict::count(Outcome o) const {
  return static_cast<int>(std::count(outcomes.begin(), outcomes.end(), o));
}

Verdict judge(const std::vector<TestRecord>& records, const Expectations& expectations) {
  Verdict v;
  for (const TestRecord& r : records) {
    const std::string* listed = expectations.match(r.full_name());
    Outcome o = r.result == TestRecord::skipped   ? Outcome::skip
                : r.result == TestRecord::not_run ? Outcome::not_run
                : r.result == TestRecord::failed ? (listed ? Outcome::expected_fail : Outcome::fail)
                : listed                         ? Outcome::unexpected_pass
                                                 : Outcome::pass;
    v.outcomes.push_back(o);
    v.notes.push_back(listed ? *listed : std::string());
    auto plugins = plugins_in_test(r.full_name());
    std::string group = plugins.empty() ? "loader" : plugins.size() > 1 ? "pairs" : plugins[0];
    v.by_group[group][o]++;
    if (r.rules.empty() && o != Outcome::not_run) v.unruled.push_back(r.full_name());
    // A failure on a device whose copy or fill test failed before may be that one's.
    if (o == Outcome::fail || o == Outcome::expected_fail) {
      std::string& first = v.first_foundation_failure[device_part(r.name)];
      if (is_foundation(r.full_name()) && first.empty()) first = r.full_name();
    }
  }
  return v;
}

namespace {

std::string xml_escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20 && c != '\n' && c != '\t')
          out += ' ';
        else
          out += c;
    }
  }
  return out;
}

}  // namespace

void write_junit(const std::string& path, const std::vector<TestRecord>& records,
                 const Verdict& verdict) {
  std::map<std::string, std::vector<size_t>> suites;
  for (size_t i = 0; i < records.size(); ++i)
    suites[records[i].suite].push_back(i);
  std::ofstream out(path);
  if (!out) {
    fmt::print(stderr, "hetmesh-cts: cannot write {}\n", path);
    return;
  }
  out << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  out << fmt::format("<testsuites name=\"hetmesh-cts\" tests=\"{}\" failures=\"{}\">\n",
                     records.size() + verdict.refused_requested.size(),
                     verdict.count(Outcome::fail) + verdict.count(Outcome::unexpected_pass) +
                         verdict.count(Outcome::not_run) + verdict.refused_requested.size());
  for (const auto& [suite, indices] : suites) {
    int failures = 0, skipped = 0;
    for (size_t i : indices) {
      Outcome o = verdict.outcomes[i];
      failures += o == Outcome::fail || o == Outcome::unexpected_pass || o == Outcome::not_run;
      skipped += o == Outcome::skip || o == Outcome::expected_fail;
    }
    out << fmt::format("  <testsuite name=\"{}\" tests=\"{}\" failures=\"{}\" skipped=\"{}\">\n",
                       xml_escape(suite), indices.size(), failures, skipped);
    for (size_t i : indices) {
      const TestRecord& r = records[i];
      out << fmt::format("    <testcase classname=\"{}\" name=\"{}\" time=\"{:.3f}\"",
                         xml_escape(r.suite), xml_escape(r.name), r.seconds);
      switch (verdict.outcomes[i]) {
        case Outcome::pass:
          out << "/>\n";
          continue;
        case Outcome::skip:
          out << fmt::format(">\n      <skipped message=\"{}\"/>\n", xml_escape(r.message));
          break;
        case Outcome::expected_fail:
          out << fmt::format(">\n      <skipped message=\"expected failure: {}\"/>\n",
                             xml_escape(verdict.notes[i]));
          out << fmt::format("      <system-out>{}</system-out>\n", xml_escape(r.message));
          break;
        case Outcome::fail:
          out << fmt::format(">\n      <failure message=\"failed {}{}\">{}</failure>\n",
                             xml_escape(r.rule_tag()), xml_escape(verdict.may_follow(r)),
                             xml_escape(r.message));
          break;
        case Outcome::not_run:
          out << fmt::format(">\n      <failure message=\"{}\"/>\n", xml_escape(r.message));
          break;
        case Outcome::unexpected_pass:
          out << fmt::format(
              ">\n      <failure message=\"unexpectedly passed {}: {}; remove it from the "
              "list\"/>\n",
              xml_escape(r.rule_tag()), xml_escape(verdict.notes[i]));
          break;
      }
      out << "    </testcase>\n";
    }
    out << "  </testsuite>\n";
  }
  if (!verdict.refused_requested.empty()) {  // a requested plugin that was refused fails the run
    out << fmt::format("  <testsuite name=\"RequestedPlugins\" tests=\"{0}\" failures=\"{0}\">\n",
                       verdict.refused_requested.size());
    for (const auto& refused : verdict.refused_requested)
      out << fmt::format(
          "    <testcase classname=\"RequestedPlugins\" name=\"Loaded\">"
          "<failure message=\"refused: {}\"/></testcase>\n",
          xml_escape(refused));
    out << "  </testsuite>\n";
  }
  out << "</testsuites>\n";
}

void print_summary(const Environment& env, const std::vector<TestRecord>& records,
                   const Verdict& verdict, const std::vector<std::string>& requested_plugins) {
  fmt::print("\n==== hetmesh-cts summary (host ABI {}.{}) ====\n", HM_DEVICE_PLUGIN_ABI_MAJOR,
             HM_DEVICE_PLUGIN_ABI_MINOR);
  for (const auto& plugin : env.registry.plugins()) {
    fmt::print("plugin {} {}  ABI {}.{} (negotiated {}.{})  {}\n", plugin->name(),
               plugin->version(), HM_DEVICE_PLUGIN_ABI_MAJOR, plugin->plugin_abi_minor(),
               HM_DEVICE_PLUGIN_ABI_MAJOR, plugin->negotiated_abi_minor(), plugin->path());
    if (plugin->device_count() == 0) fmt::print("  (no devices: nothing to test)\n");
    for (const auto& device : env.devices)
      if (device.plugin_ptr() == plugin)
        fmt::print("  {:<12} {}\n    capabilities: {}\n", device.selector(),
                   device.properties().name, capability_names(device.properties().capabilities));
  }
  for (const auto& r : env.registry.refused()) {
    bool requested = std::find(requested_plugins.begin(), requested_plugins.end(), r.path) !=
                     requested_plugins.end();
    fmt::print("{} {}\n  {}\n", requested ? "REFUSED (requested):" : "refused:", r.path, r.reason);
  }
  fmt::print("\n{:<14} {:>6} {:>6} {:>14} {:>6} {:>16} {:>8}\n", "group", "pass", "skip",
             "expected-fail", "FAIL", "UNEXPECTED-PASS", "NOT-RUN");
  for (const auto& [group, counts] : verdict.by_group) {
    auto n = [&](Outcome o) { return counts.count(o) ? counts.at(o) : 0; };
    fmt::print("{:<14} {:>6} {:>6} {:>14} {:>6} {:>16} {:>8}\n", group, n(Outcome::pass),
               n(Outcome::skip), n(Outcome::expected_fail), n(Outcome::fail),
               n(Outcome::unexpected_pass), n(Outcome::not_run));
  }
  fmt::print("{:<14} {:>6} {:>6} {:>14} {:>6} {:>16} {:>8}\n", "total",
             verdict.count(Outcome::pass), verdict.count(Outcome::skip),
             verdict.count(Outcome::expected_fail), verdict.count(Outcome::fail),
             verdict.count(Outcome::unexpected_pass), verdict.count(Outcome::not_run));
  // Each line names the test, then the ABI rules (device_plugin.h) its failing checks verify.
  for (size_t i = 0; i < verdict.outcomes.size(); ++i) {
    const TestRecord& r = records[i];
    if (verdict.outcomes[i] == Outcome::fail)
      fmt::print("FAILED            {} {}{}\n", r.full_name(), r.rule_tag(), verdict.may_follow(r));
    if (verdict.outcomes[i] == Outcome::not_run)
      fmt::print("NOT RUN           {}: {}\n", r.full_name(), r.message);
    if (verdict.outcomes[i] == Outcome::unexpected_pass)
      fmt::print("UNEXPECTED PASS   {} {} ({}): remove it from the known-failure list\n",
                 r.full_name(), r.rule_tag(), verdict.notes[i]);
    if (verdict.outcomes[i] == Outcome::expected_fail)
      fmt::print("expected failure  {} {} ({})\n", r.full_name(), r.rule_tag(), verdict.notes[i]);
  }
  for (const auto& name : verdict.unruled)
    fmt::print("NO RULE           {}: the test names no ABI rule (a bug of hetmesh-cts)\n", name);
  for (const auto& refused : verdict.refused_requested)
    fmt::print(
        "REFUSED           {}: a plugin named with --plugin was not loaded, so none of it "
        "was tested\n",
        refused);
  fmt::print("\nverdict: {}\n", verdict.conformant() ? "CONFORMANT" : "NOT CONFORMANT");
}

}  // namespace hetmesh::cts
