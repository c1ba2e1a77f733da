// The supervised run (supervise.hpp): a child hetmesh-cts per stretch of tests, a deadline per
// test, a budget for the run.
#include "supervise.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <hetmesh/core/subprocess.hpp>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

namespace hetmesh::cts {
namespace {

using Clock = std::chrono::steady_clock;
constexpr std::chrono::seconds kLeastOutsideATest{30};
using nlohmann::json;

int g_report_fd = -1;

void send_line(const std::string& line) {
  if (g_report_fd < 0) return;
  std::string text = line + "\n";
  for (size_t done = 0; done < text.size();) {
    ssize_t n = ::write(g_report_fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // the parent went: nothing to tell
    done += static_cast<size_t>(n);
  }
}

std::string one_line(std::string text) {
  for (char& c : text)
    if (c == '\n') c = ' ';
  return text;
}

TestRecord record_from(const json& j) {
  TestRecord r;
  r.suite = j.at("suite").get<std::string>();
  r.name = j.at("name").get<std::string>();
  r.result = static_cast<TestRecord::Result>(j.at("result").get<int>());
  r.message = j.at("message").get<std::string>();
  r.seconds = j.at("seconds").get<double>();
  r.rules = j.at("rules").get<std::vector<std::string>>();
  r.failed_rules = j.at("failed_rules").get<std::vector<std::string>>();
  return r;
}

TestRecord named_record(const std::string& full_name, TestRecord::Result result,
                        std::string message) {
  TestRecord r;
  size_t dot = full_name.find('.');
  r.suite = full_name.substr(0, dot);
  r.name = dot == std::string::npos ? "" : full_name.substr(dot + 1);
  r.result = result;
  r.message = std::move(message);
  return r;
}

// A failed record for the test the child was in when it hung or died.
TestRecord lost_test(const std::string& full_name, const std::vector<std::string>& rules,
                     const std::string& what, double seconds) {
  TestRecord r = named_record(full_name, TestRecord::failed, "");
  r.seconds = seconds;
  r.rules = rules;
  if (!rules.empty()) r.failed_rules = {rules.back()};
  r.message = fmt::format("{}{}", rules.empty() ? "" : "[" + rules.back() + "] ", what);
  return r;
}

std::string describe_status(int status) {
  if (WIFSIGNALED(status))
    return fmt::format("signal {} ({})", WTERMSIG(status), strsignal(WTERMSIG(status)));
  return fmt::format("exit status {}", WEXITSTATUS(status));
}

// The running child's process group and the file of its tests, for the handler of a signal that
// ends this process (which may use only async-signal-safe calls).
volatile sig_atomic_t g_child_group = 0;
char g_list_file[4096] = "";

void end_with_the_child(int signal) {
  if (g_child_group > 0) ::kill(-g_child_group, SIGKILL);
  if (g_list_file[0] != '\0') ::unlink(g_list_file);
  ::signal(signal, SIG_DFL);
  ::raise(signal);
}

// The file that names a child's tests: made with mkstemp (no name another user could plant), gone
// with this object or with a signal that ends the kit.
class ListFile {
 public:
  ListFile() {
    std::string pattern = (std::filesystem::temp_directory_path() / "hetmesh-cts-XXXXXX").string();
    if (pattern.size() >= sizeof g_list_file) throw std::runtime_error("TMPDIR is too long");
    int fd = ::mkstemp(pattern.data());
    if (fd < 0)
      throw std::runtime_error(fmt::format("mkstemp {}: {}", pattern, std::strerror(errno)));
    ::close(fd);
    path_ = pattern;
    std::memcpy(g_list_file, path_.c_str(), path_.size() + 1);
  }
  ~ListFile() {
    g_list_file[0] = '\0';
    ::unlink(path_.c_str());
  }
  ListFile(const ListFile&) = delete;
  ListFile& operator=(const ListFile&) = delete;
  void write(const std::vector<std::string>& names) const {
    std::ofstream out(path_, std::ios::trunc);
    for (const auto& name : names)
      out << name << "\n";
    if (!out) throw std::runtime_error("cannot write " + path_);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

void end_children_with_this_process() {
  struct sigaction action {};
  action.sa_handler = end_with_the_child;
  sigemptyset(&action.sa_mask);
  for (int signal : {SIGTERM, SIGINT, SIGHUP})
    ::sigaction(signal, &action, nullptr);
}

struct Child {
  pid_t pid = -1;
  int fd = -1;  // the report pipe's read end
};

Child start(const std::string& self, const std::vector<std::string>& args) {
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0)
    throw std::runtime_error(fmt::format("pipe: {}", std::strerror(errno)));
  std::vector<std::string> words = {self};
  words.insert(words.end(), args.begin(), args.end());
  words.push_back(fmt::format("--cts-report-fd={}", 3));
  std::vector<char*> argv;
  for (auto& w : words)
    argv.push_back(w.data());
  argv.push_back(nullptr);
  const pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error(fmt::format("fork: {}", std::strerror(errno)));
  if (pid == 0) {
    ::setpgid(0, 0);  // its own group: a hang is ended with everything it started
    // A kit killed outright (SIGKILL) takes its child along.
    if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || ::getppid() != parent) ::_exit(127);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);  // whatever this thread blocks
    // The report pipe as fd 3, open across exec (dup2 onto itself would keep O_CLOEXEC).
    if (pipe_fds[1] == 3 ? ::fcntl(3, F_SETFD, 0) < 0 : ::dup2(pipe_fds[1], 3) < 0) ::_exit(127);
    ::execv(self.c_str(), argv.data());
    ::_exit(127);
  }
  ::setpgid(pid, pid);
  g_child_group = pid;
  ::close(pipe_fds[1]);
  return {pid, pipe_fds[0]};
}

// The full names GoogleTest lists for `args`, in the order it runs them.
std::vector<std::string> list_tests(const std::string& self, const std::vector<std::string>& args) {
  std::vector<std::string> argv = {self};
  argv.insert(argv.end(), args.begin(), args.end());
  argv.push_back("--gtest_list_tests");
  ProcessResult listed = run_process(argv, std::chrono::minutes(2));
  if (listed.exit_code != 0)
    throw std::runtime_error(fmt::format("listing the tests failed ({}): {}", listed.describe(),
                                         listed.out + listed.err));
  std::vector<std::string> names;
  std::istringstream in(listed.out);
  std::string suite;
  for (std::string line; std::getline(in, line);) {
    line = line.substr(0, line.find("  #"));  // a parameter's description
    if (line.empty()) continue;
    if (line[0] != ' ') {
      suite = line.back() == '.' ? line.substr(0, line.size() - 1) : "";
    } else if (!suite.empty()) {
      line.erase(0, line.find_first_not_of(' '));
      names.push_back(suite + "." + line);
    }
  }
  return names;
}

// GoogleTest lists disabled tests but runs them only when asked to.
bool disabled(const std::string& full_name) {
  for (size_t at = full_name.find("DISABLED_"); at != std::string::npos;
       at = full_name.find("DISABLED_", at + 1))
    if (at == 0 || full_name[at - 1] == '/' || full_name[at - 1] == '.') return true;
  return false;
}

// This run's share of `names` where GTEST_TOTAL_SHARDS and GTEST_SHARD_INDEX say so (as GoogleTest
// deals them, by position), taken out of the environment so that the children run all they get.
std::vector<std::string> this_shard(std::vector<std::string> names) {
  const char* total = std::getenv("GTEST_TOTAL_SHARDS");
  const char* index = std::getenv("GTEST_SHARD_INDEX");
  if (total == nullptr || index == nullptr) return names;
  const long shards = std::strtol(total, nullptr, 10), mine = std::strtol(index, nullptr, 10);
  ::unsetenv("GTEST_TOTAL_SHARDS");
  ::unsetenv("GTEST_SHARD_INDEX");
  if (shards <= 1 || mine < 0 || mine >= shards) return names;
  std::vector<std::string> kept;
  for (size_t i = 0; i < names.size(); ++i)
    if (static_cast<long>(i % static_cast<size_t>(shards)) == mine) kept.push_back(names[i]);
  return kept;
}

// A hang counts against a plugin only in a test of that plugin alone: in a pair of two plugins the
// kit cannot tell which one hung.
std::vector<std::string> hang_owners(const std::string& full_name) {
  std::vector<std::string> plugins = plugins_in_test(full_name);
  std::sort(plugins.begin(), plugins.end());
  plugins.erase(std::unique(plugins.begin(), plugins.end()), plugins.end());
  return plugins.size() == 1 ? plugins : std::vector<std::string>{};
}

}  // namespace

void run_only_tests_listed_in(const std::string& path) {
  std::ifstream in(path);
  std::string filter;
  for (std::string name; std::getline(in, name);)
    if (!name.empty()) filter += (filter.empty() ? "" : ":") + name;
  GTEST_FLAG_SET(filter, filter.empty() ? std::string("-*") : filter);
}

void report_to(int fd) {
  g_report_fd = fd;
}

void report_start(const std::string& full_name) {
  send_line("S " + full_name);
}

void report_rule(const char* id) {
  send_line(fmt::format("R {}", id));
}

void report_record(const TestRecord& r) {
  send_line("E " + json{{"suite", r.suite},
                        {"name", r.name},
                        {"result", static_cast<int>(r.result)},
                        {"message", r.message},
                        {"seconds", r.seconds},
                        {"rules", r.rules},
                        {"failed_rules", r.failed_rules}}
                       .dump());
}

std::vector<TestRecord> run_supervised(const std::string& self,
                                       const std::vector<std::string>& args, const Limits& limits) {
  end_children_with_this_process();
  const auto run_started = Clock::now();
  const auto budget_ends = run_started + limits.budget;
  // The copy and fill tests first (report.hpp's is_foundation), then the rest, each in the order
  // GoogleTest lists them.
  bool run_disabled = false;
  std::vector<std::string> rest;
  for (const auto& a : args) {
    if (a.rfind("--gtest_also_run_disabled_tests", 0) == 0) run_disabled = true;
    if (a.rfind("--gtest_filter=", 0) != 0) rest.push_back(a);
  }
  std::vector<std::vector<std::string>> phases(2);
  for (const auto& name : this_shard(list_tests(self, args)))
    if (run_disabled || !disabled(name)) phases[is_foundation(name) ? 0 : 1].push_back(name);

  ListFile list;
  std::vector<TestRecord> records;
  std::set<std::string> done;
  std::map<std::string, int> hangs;             // per plugin
  std::map<std::string, std::string> given_up;  // plugin -> why
  std::string stopped;                          // why no more tests run at all, once they don't
  // Why a test is not to run any more; "" while it may run.
  auto barred = [&](const std::string& name) -> std::string {
    if (!stopped.empty()) return stopped;
    for (const auto& plugin : plugins_in_test(name))
      if (auto it = given_up.find(plugin); it != given_up.end()) return it->second;
    return "";
  };
  const std::string out_of_budget =
      fmt::format("not run: the run's budget of {} s was spent (--budget)", limits.budget.count());
  for (const auto& phase : phases) {
    for (;;) {
      std::vector<std::string> pending;
      for (const auto& name : phase) {
        if (done.count(name)) continue;
        if (std::string why = barred(name); !why.empty()) {
          records.push_back(named_record(name, TestRecord::not_run, why));
          done.insert(name);
        } else {
          pending.push_back(name);
        }
      }
      if (pending.empty()) break;
      list.write(pending);
      std::vector<std::string> child_args = rest;
      child_args.push_back("--cts-tests-file=" + list.path());
      const size_t done_before = done.size();
      Child child = start(self, child_args);
      std::string buffer, current;
      std::vector<std::string> rules;
      // Each test has --test-timeout, and so has the child (at least 30 s) to start its first test,
      // to go from one to the next and to end (a runtime's start or exit that hangs).
      auto started = Clock::now();
      enum { ran, hung, budget_spent } end = ran;
      for (;;) {
        // Outside a test (starting, between tests, exiting) a loaded machine gets 30 s at least:
        // a child that starts under a sanitizer probes its plugins first.
        const auto test_ends =
            started +
            (current.empty() ? std::max(limits.per_test, kLeastOutsideATest) : limits.per_test);
        const auto deadline = std::min(test_ends, budget_ends);
        const auto now = Clock::now();
        if (now >= deadline) {
          end = budget_ends <= test_ends ? budget_spent : hung;
          break;
        }
        const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - now);
        pollfd p{child.fd, POLLIN, 0};
        int ready = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 1 << 30)));
        if (ready < 0 && errno == EINTR) continue;
        if (ready == 0) continue;  // the deadline is checked above
        char chunk[65536];
        ssize_t n = ::read(child.fd, chunk, sizeof chunk);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;  // the child ended (or died)
        buffer.append(chunk, static_cast<size_t>(n));
        for (size_t at; (at = buffer.find('\n')) != std::string::npos;) {
          std::string line = buffer.substr(0, at);
          buffer.erase(0, at + 1);
          if (line.rfind("S ", 0) == 0) {
            current = line.substr(2);
            rules.clear();
            started = Clock::now();
          } else if (line.rfind("R ", 0) == 0) {
            rules.push_back(line.substr(2));
          } else if (line.rfind("E ", 0) == 0) {
            records.push_back(record_from(json::parse(line.substr(2))));
            done.insert(records.back().full_name());
            current.clear();
            started = Clock::now();
          }
        }
      }
      if (end != ran) ::kill(-child.pid, SIGKILL);
      ::close(child.fd);
      int status = 0;
      while (::waitpid(child.pid, &status, 0) < 0 && errno == EINTR) {
      }
      if (end != ran) ::kill(-child.pid, SIGKILL);  // anything it left in its group
      g_child_group = 0;
      const double seconds = std::chrono::duration<double>(Clock::now() - started).count();
      if (end == budget_spent) stopped = out_of_budget;
      if (current.empty()) {
        // Between tests. GoogleTest exits 1 when a test failed; anything else is the child's own
        // failure (a plugin's exit-time code that crashed or hung, a child that never started).
        const bool before_any = done.size() == done_before;
        const bool failed =
            end == hung || WIFSIGNALED(status) || (WIFEXITED(status) && WEXITSTATUS(status) > 1);
        if ((failed || before_any) && end != budget_spent) {
          records.push_back(
              lost_test(before_any ? "hetmesh-cts.Start" : "hetmesh-cts.Exit",
                        {before_any ? "HM-R7" : "HM-R9"},
                        fmt::format("the kit's child {} {}: {}", end == hung ? "hung" : "ended",
                                    before_any ? "before its first test" : "after its tests",
                                    end == hung ? fmt::format("nothing for {:.0f} s", seconds)
                                                : describe_status(status)),
                        seconds));
          fmt::print(stderr, "hetmesh-cts: {}: {}\n", records.back().full_name(),
                     one_line(records.back().message));
          // No child can run the tests this one could not start: they are not run.
          if (before_any) stopped = "not run: " + records.back().message;
        }
        continue;
      }
      TestRecord lost;
      if (end == budget_spent) {
        lost = named_record(current, TestRecord::not_run,
                            fmt::format("not finished when the run's budget of {} s was spent "
                                        "(--budget); killed",
                                        limits.budget.count()));
        lost.seconds = seconds;
      } else {
        lost = lost_test(
            current, rules,
            (end == hung ? fmt::format("hung: not done within {} s (--test-timeout); killed",
                                       limits.per_test.count())
                         : fmt::format("crashed the kit's process: {}", describe_status(status))) +
                "; the kit went on with the next test",
            seconds);
      }
      records.push_back(lost);
      fmt::print(stderr, "hetmesh-cts: {}: {}\n", current, one_line(lost.message));
      done.insert(current);
      if (end == hung) {
        for (const auto& plugin : hang_owners(current))
          if (++hangs[plugin] >= limits.max_hangs && !given_up.count(plugin)) {
            given_up[plugin] = fmt::format(
                "not run: plugin {} hung in {} tests (--max-hangs), so its other tests were not "
                "run",
                plugin, hangs[plugin]);
            fmt::print(stderr, "hetmesh-cts: {}\n", given_up[plugin]);
          }
      }
    }
  }
  return records;
}

}  // namespace hetmesh::cts
