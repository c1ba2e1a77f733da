// A launcher's child processes and how they stop (local_job.hpp).
#include <hetmesh/afd/local_job.hpp>

#include <hetmesh/core/error.hpp>
#include <hetmesh/core/log.hpp>
#include <hetmesh/core/rendezvous.hpp>

#include <fmt/format.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <fstream>
#include <optional>
#include <thread>

namespace hetmesh::afd {
namespace {

// Whether the child has exited, without reaping it (WNOWAIT): ChildProcess::wait still can.
bool has_exited(const ChildProcess& child) {
  siginfo_t info{};
  if (waitid(P_PID, static_cast<id_t>(child.pid()), &info, WEXITED | WNOHANG | WNOWAIT) != 0)
    return true;  // not our child any more: nothing left to wait for
  return info.si_pid == child.pid();
}

// Whether the child is stopped by a signal (SIGSTOP, SIGTSTP...): state 'T' in /proc/PID/stat.
bool is_stopped(const ChildProcess& child) {
  std::ifstream stat(fmt::format("/proc/{}/stat", child.pid()));
  std::string line;
  std::getline(stat, line);
  auto end_of_name = line.rfind(')');  // the name may hold spaces and parentheses
  return end_of_name != std::string::npos && end_of_name + 2 < line.size() &&
         line[end_of_name + 2] == 'T';
}

// The first SIGINT or SIGTERM (0: none yet), and how many arrived.
std::atomic<int> g_signal{0};
std::atomic<int> g_signals{0};
static_assert(std::atomic<int>::is_always_lock_free, "used from a signal handler");

void on_interrupt(int signal) {
  int none = 0;
  g_signal.compare_exchange_strong(none, signal);
  g_signals.fetch_add(1);
}

// How long the instances get to end on their own, after another's failure or an interruption.
constexpr std::chrono::milliseconds kFailureGrace{100};
constexpr std::chrono::milliseconds kInterruptGrace{1000};

}  // namespace

InterruptGuard::InterruptGuard() {
  g_signal = 0;
  g_signals = 0;
  struct sigaction action {};
  action.sa_handler = on_interrupt;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, &previous_[0]);
  sigaction(SIGTERM, &action, &previous_[1]);
}

InterruptGuard::~InterruptGuard() {
  sigaction(SIGINT, &previous_[0], nullptr);
  sigaction(SIGTERM, &previous_[1], nullptr);
}

int InterruptGuard::signal() {
  return g_signal.load();
}

FolderRemover::~FolderRemover() {
  std::error_code ignored;
  std::filesystem::remove_all(folder_, ignored);
}

std::string InstanceFailure::describe() const {
  if (!reason.empty()) return fmt::format("{}:{} failed ({})", role, rank, reason);
  if (after_another)
    return fmt::format("{}:{} stopped after another instance's failure", role, rank);
  return fmt::format("{}:{} failed ({})", role, rank, result.describe());
}

LocalJob::LocalJob(std::vector<std::string> command, std::string store, std::string out,
                   std::string job)
    : command_(std::move(command)),
      store_(std::move(store)),
      out_(std::move(out)),
      job_(std::move(job)) {}

ChildProcess& LocalJob::start(const std::string& role, int rank,
                              const std::vector<std::string>& extra,
                              std::function<void(const std::string&)> on_line) {
  std::vector<std::string> argv = {self_executable()};
  argv.insert(argv.end(), command_.begin(), command_.end());
  for (const std::string& arg :
       {std::string("--role"), role, std::string("--rank"), std::to_string(rank),
        std::string("--store"), store_, std::string("--out"), out_})
    argv.push_back(arg);
  argv.insert(argv.end(), extra.begin(), extra.end());
  Instance instance{role, rank, extra, std::make_unique<ChildProcess>(argv), std::move(on_line)};
  instance.output_open = static_cast<bool>(instance.on_line);
  instances_.push_back(std::move(instance));
  return *instances_.back().process;
}

// Hands the lines the instance has printed to its on_line; with until_closed (it has exited),
// every line up to the end of its output.
void LocalJob::read_output(Instance& instance, bool until_closed) {
  while (instance.output_open) {
    try {
      instance.on_line(
          instance.process->read_line(std::chrono::milliseconds(until_closed ? 1000 : 1)));
    } catch (const Error& e) {
      if (e.status() == HM_ERR_TIMEOUT && !until_closed) return;
      instance.output_open = false;  // closed, or an exited instance's child holds it open
    }
  }
}

void LocalJob::replace(const std::string& role, int rank) {
  replace_.emplace_back(role, rank);
}

void LocalJob::start_replacements() {
  for (const auto& [role, rank] : std::exchange(replace_, {})) {
    auto old = std::find_if(instances_.begin(), instances_.end(), [&](const Instance& i) {
      return i.role == role && i.rank == rank && !i.reaped;
    });
    if (old == instances_.end()) continue;  // it has ended already
    old->process->kill(SIGKILL);
    old->process->wait(std::chrono::seconds(5));  // dead before its replacement starts
    old->reaped = true;
    std::vector<std::string> extra = old->extra;
    auto on_line = old->on_line;
    start(role, rank, extra, std::move(on_line));  // invalidates `old`
    ++replaced_;
  }
}

std::vector<InstanceFailure> LocalJob::wait(std::chrono::milliseconds limit,
                                            std::chrono::milliseconds stopped_limit) {
  const Clock::time_point deadline = Clock::now() + limit;
  std::optional<Clock::time_point> kill_at;  // when the instances still running get SIGKILL
  std::vector<InstanceFailure> failures;
  auto stop_others = [&](Clock::time_point now, std::chrono::milliseconds grace) {
    if (!kill_at || now + grace < *kill_at) kill_at = now + grace;
  };
  for (;;) {
    if (interrupted_ == 0 && !kill_at) start_replacements();
    Clock::time_point now = Clock::now();
    if (int signal = InterruptGuard::signal(); signal != 0 && interrupted_ == 0) {
      interrupted_ = signal;
      for (Instance& instance : instances_) {
        if (instance.reaped) continue;
        instance.process->kill(signal);
        instance.process->kill(SIGCONT);  // a stopped instance acts on it too
      }
      stop_others(now, kInterruptGrace);
    }
    if (interrupted_ != 0 && g_signals.load() > 1) stop_others(now, std::chrono::milliseconds(0));
    bool running = false;
    for (Instance& instance : instances_) {
      if (instance.reaped) continue;
      read_output(instance, false);
      if (has_exited(*instance.process)) {
        read_output(instance, true);
        ProcessResult result = instance.process->wait(std::chrono::milliseconds(0));
        instance.reaped = true;
        if (interrupted_ != 0 || (result.signal == 0 && result.exit_code == 0)) continue;
        bool after_another = result.signal == 0 && result.exit_code == kExitAfterAnotherFailure;
        failures.push_back({instance.role, instance.rank, result, after_another, {}});
        if (result.signal != 0) publish_failure(instance, failures.back());  // it crashed
        stop_others(now, kFailureGrace);
        continue;
      }
      std::string reason;
      if (kill_at && now >= *kill_at) {
        // Stopped for another's failure or an interruption: not reported.
      } else if (now >= deadline) {
        reason = fmt::format("still running after {} ms: killed", limit.count());
      } else if (!is_stopped(*instance.process)) {
        instance.stopped_since.reset();
        running = true;
        continue;
      } else if (!instance.stopped_since) {
        instance.stopped_since = now;
        running = true;
        continue;
      } else if (now - *instance.stopped_since < stopped_limit) {
        running = true;
        continue;
      } else {
        reason =
            fmt::format("stopped by a signal for more than {} ms: killed", stopped_limit.count());
      }
      instance.process->kill(SIGKILL);  // also ends a stopped process
      ProcessResult result = instance.process->wait(std::chrono::seconds(5));
      instance.reaped = true;
      if (reason.empty()) continue;
      failures.push_back({instance.role, instance.rank, result, false, reason});
      publish_failure(instance, failures.back());
      stop_others(now, kFailureGrace);
    }
    if (!running) return failures;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

// An instance that crashed, or that this launcher killed, could not say why itself: the launcher
// says it for it, so that the others stop as after any failure and do not report the broken
// connections it leaves as root causes. (One that exited with an error tried to itself.)
void LocalJob::publish_failure(const Instance& instance, const InstanceFailure& failure) {
  if (failure_published_) return;
  failure_published_ = true;
  char host[256] = "?";
  gethostname(host, sizeof host - 1);
  std::string why = failure.reason.empty() ? failure.result.describe() : failure.reason;
  try {
    auto store = connect_store(store_, std::chrono::milliseconds(500));
    publish_job_failure(*store, job_,
                        fmt::format("{}:{} on {} pid {}: {}", instance.role, instance.rank, host,
                                    instance.process->pid(), why));
  } catch (const std::exception& e) {
    log(LogLevel::info, "cannot publish the failure of {}:{}: {}", instance.role, instance.rank,
        e.what());
  }
}

std::vector<std::string> LocalJob::explain(const std::vector<InstanceFailure>& failures) const {
  std::vector<std::string> lines;
  int after = 0;
  for (const InstanceFailure& failure : failures) {
    if (failure.after_another)
      ++after;
    else
      lines.push_back(failure.describe());
  }
  if (lines.empty() && after > 0) {
    std::string report = "its report could not be read from the store";
    try {
      auto store = connect_store(store_, std::chrono::milliseconds(2000));
      report = job_failure(*store, job_).value_or("no instance published its failure");
    } catch (const std::exception& e) {
      report += fmt::format(" ({})", e.what());
    }
    lines.push_back(fmt::format("the job failed: {}", report));
  }
  if (after > 0)
    lines.push_back(fmt::format("{} instance(s) here stopped after that failure", after));
  return lines;
}

}  // namespace hetmesh::afd
