// Launching a job on this host (launch.hpp): the instances an invocation starts, its store, and
// the child processes of a LocalJob.
#include <hetmesh/afd/launch.hpp>
#include <hetmesh/core/error.hpp>

#include <fmt/format.h>

#include <sys/wait.h>

#include <algorithm>
#include <charconv>
#include <csignal>
#include <optional>
#include <set>
#include <thread>

namespace hetmesh::afd {
namespace {

int parse_rank(std::string_view text, const std::string& value) {
  int rank = -1;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), rank);
  if (ec != std::errc() || end != text.data() + text.size() || rank < 0)
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("--instances {}: '{}' is not a rank", value, text));
  return rank;
}

// Whether the child has exited, without reaping it (WNOWAIT): ChildProcess::wait still can.
bool has_exited(const ChildProcess& child) {
  siginfo_t info{};
  if (waitid(P_PID, static_cast<id_t>(child.pid()), &info, WEXITED | WNOHANG | WNOWAIT) != 0)
    return true;  // not our child any more: nothing left to wait for
  return info.si_pid == child.pid();
}

}  // namespace

LocalInstances parse_instances(const std::vector<std::string>& values, const JobConfig& config) {
  std::set<int> attention, ffn;
  auto all = [](std::set<int>& ranks, int count) {
    for (int r = 0; r < count; ++r)
      ranks.insert(r);
  };
  if (values.empty()) {
    all(attention, config.job.attention);
    all(ffn, config.job.ffn);
  }
  for (const std::string& value : values) {
    std::string_view role = value, list;
    if (auto colon = value.find(':'); colon != std::string::npos) {
      role = std::string_view(value).substr(0, colon);
      list = std::string_view(value).substr(colon + 1);
    }
    bool is_attention = role == "attention";
    if (!is_attention && role != "ffn")
      throw Error(HM_ERR_INVALID_ARGUMENT,
                  fmt::format("--instances {}: the role is 'attention' or 'ffn'", value));
    std::set<int>& ranks = is_attention ? attention : ffn;
    int count = is_attention ? config.job.attention : config.job.ffn;
    if (list.empty()) {
      all(ranks, count);
      continue;
    }
    while (!list.empty()) {
      auto comma = list.find(',');
      std::string_view item = list.substr(0, comma);
      list = comma == std::string_view::npos ? std::string_view() : list.substr(comma + 1);
      auto dash = item.find('-');
      int first = parse_rank(item.substr(0, dash), value);
      int last = dash == std::string_view::npos ? first : parse_rank(item.substr(dash + 1), value);
      if (last < first || last >= count)
        throw Error(HM_ERR_INVALID_ARGUMENT,
                    fmt::format("--instances {}: the job has {} {} instance(s), ranks 0..{}", value,
                                count, is_attention ? "attention" : "ffn", count - 1));
      for (int r = first; r <= last; ++r)
        ranks.insert(r);
    }
  }
  return {{attention.begin(), attention.end()}, {ffn.begin(), ffn.end()}};
}

JobStore::JobStore(const JobConfig& config, const std::string& join) {
  if (!join.empty()) {
    address_ = join;
    return;
  }
  server_ = std::make_unique<TcpStoreServer>(config.rendezvous.address);
  address_ = server_->address();
}

std::string InstanceFailure::describe() const {
  return fmt::format("{}:{} failed ({})", role, rank, result.describe());
}

LocalJob::LocalJob(std::vector<std::string> command, std::string store, std::string out)
    : command_(std::move(command)), store_(std::move(store)), out_(std::move(out)) {}

ChildProcess& LocalJob::start(const std::string& role, int rank,
                              const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {self_executable()};
  argv.insert(argv.end(), command_.begin(), command_.end());
  for (const std::string& arg :
       {std::string("--role"), role, std::string("--rank"), std::to_string(rank),
        std::string("--store"), store_, std::string("--out"), out_})
    argv.push_back(arg);
  argv.insert(argv.end(), extra.begin(), extra.end());
  instances_.push_back({role, rank, std::make_unique<ChildProcess>(argv)});
  return *instances_.back().process;
}

std::vector<InstanceFailure> LocalJob::wait(std::chrono::milliseconds limit) {
  // After a failure, the others get this long to end on their own (then their failures are
  // reported too, e.g. both ends of a broken connection) before they are killed.
  constexpr std::chrono::milliseconds kGrace{100};
  const Clock::time_point deadline = Clock::now() + limit;
  std::optional<Clock::time_point> stop_at;
  std::vector<InstanceFailure> failures;
  for (;;) {
    bool running = false;
    for (Instance& instance : instances_) {
      if (instance.reaped) continue;
      const Clock::time_point now = Clock::now();
      if (!has_exited(*instance.process)) {
        if (stop_at && now >= *stop_at) {  // stopped for another's failure: not reported
          instance.process->kill(SIGKILL);
          instance.process->wait(limit);
          instance.reaped = true;
          continue;
        }
        if (now < deadline) {
          running = true;
          continue;
        }
      }
      // Exited: reaped at once. Past the deadline: killed, and reported as timed out.
      ProcessResult result = instance.process->wait(std::chrono::milliseconds(0));
      instance.reaped = true;
      if (result.timed_out || result.signal != 0 || result.exit_code != 0) {
        failures.push_back({instance.role, instance.rank, result});
        if (!stop_at) stop_at = now + kGrace;
      }
    }
    if (!running) return failures;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

}  // namespace hetmesh::afd
