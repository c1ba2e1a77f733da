// The supervised run (supervise.hpp): a child hetmesh-cts per stretch of tests, a deadline per
// test.
#include "supervise.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace hetmesh::cts {
namespace {

using Clock = std::chrono::steady_clock;
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

// A failed record for the test the child was in when it hung or died.
TestRecord lost_test(const std::string& full_name, const std::vector<std::string>& rules,
                     const std::string& what, double seconds) {
  TestRecord r;
  size_t dot = full_name.find('.');
  r.suite = full_name.substr(0, dot);
  r.name = dot == std::string::npos ? "" : full_name.substr(dot + 1);
  r.result = TestRecord::failed;
  r.seconds = seconds;
  r.rules = rules;
  if (!rules.empty()) r.failed_rules = {rules.back()};
  r.message = fmt::format("{}{}; the kit went on with the next test",
                          rules.empty() ? "" : "[" + rules.back() + "] ", what);
  return r;
}

std::string describe_status(int status) {
  if (WIFSIGNALED(status))
    return fmt::format("signal {} ({})", WTERMSIG(status), strsignal(WTERMSIG(status)));
  return fmt::format("exit status {}", WEXITSTATUS(status));
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
  pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error(fmt::format("fork: {}", std::strerror(errno)));
  if (pid == 0) {
    ::setpgid(0, 0);  // its own group: a hang is ended with everything it started
    if (::dup2(pipe_fds[1], 3) < 0) ::_exit(127);
    ::execv(self.c_str(), argv.data());
    ::_exit(127);
  }
  ::setpgid(pid, pid);
  ::close(pipe_fds[1]);
  return {pid, pipe_fds[0]};
}

}  // namespace

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
                                       const std::vector<std::string>& args,
                                       std::chrono::seconds deadline) {
  // The user's filter (or all), less the tests already run, for each new child.
  std::string positive = "*";
  std::vector<std::string> rest;
  for (const auto& a : args) {
    if (a.rfind("--gtest_filter=", 0) == 0)
      positive = a.substr(15);
    else
      rest.push_back(a);
  }
  std::string negative;
  if (auto minus = positive.find('-'); minus != std::string::npos) {
    negative = positive.substr(minus + 1);
    positive = positive.substr(0, minus);
    if (positive.empty()) positive = "*";
  }
  std::vector<TestRecord> records;
  std::vector<std::string> done;
  for (;;) {
    std::vector<std::string> child_args = rest;
    std::string excluded = negative;
    for (const auto& name : done)
      excluded += (excluded.empty() ? "" : ":") + name;
    child_args.push_back("--gtest_filter=" + positive + (excluded.empty() ? "" : "-" + excluded));
    Child child = start(self, child_args);
    std::string buffer, current;
    std::vector<std::string> rules;
    auto started = Clock::now();
    bool hung = false;
    for (;;) {
      int wait_ms = -1;
      if (!current.empty()) {
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(started + deadline -
                                                                          Clock::now());
        if (left.count() <= 0) {
          hung = true;
          break;
        }
        wait_ms = static_cast<int>(left.count());
      }
      pollfd p{child.fd, POLLIN, 0};
      int ready = ::poll(&p, 1, wait_ms);
      if (ready < 0 && errno == EINTR) continue;
      if (ready == 0) continue;  // the deadline is checked above
      char chunk[65536];
      ssize_t n = ::read(child.fd, chunk, sizeof chunk);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;  // the child ended (or died)
      buffer.append(chunk, static_cast<size_t>(n));
      for (size_t end; (end = buffer.find('\n')) != std::string::npos;) {
        std::string line = buffer.substr(0, end);
        buffer.erase(0, end + 1);
        if (line.rfind("S ", 0) == 0) {
          current = line.substr(2);
          rules.clear();
          started = Clock::now();
        } else if (line.rfind("R ", 0) == 0) {
          rules.push_back(line.substr(2));
        } else if (line.rfind("E ", 0) == 0) {
          records.push_back(record_from(json::parse(line.substr(2))));
          done.push_back(records.back().full_name());
          current.clear();
        }
      }
    }
    if (hung) ::kill(-child.pid, SIGKILL);
    ::close(child.fd);
    int status = 0;
    while (::waitpid(child.pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (hung) ::kill(-child.pid, SIGKILL);  // anything it left in its group
    const double seconds = std::chrono::duration<double>(Clock::now() - started).count();
    if (current.empty()) {
      if (!hung && (WIFSIGNALED(status) || WEXITSTATUS(status) != 0) && records.empty())
        records.push_back(lost_test(
            "hetmesh-cts.Run", {"HM-R1"},
            "the kit's child ended before any test: " + describe_status(status), seconds));
      return records;  // every test ran
    }
    records.push_back(lost_test(
        current, rules,
        hung ? fmt::format("hung: not done within {} s (--test-timeout); killed", deadline.count())
             : fmt::format("crashed the kit's process: {}", describe_status(status)),
        seconds));
    fmt::print(stderr, "hetmesh-cts: {}: {}\n", current, one_line(records.back().message));
    done.push_back(current);
  }
}

}  // namespace hetmesh::cts
