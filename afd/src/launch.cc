// Launching a job on this host (launch.hpp): the instances an invocation starts, its store, the
// child processes of a LocalJob and how they stop, and an instance's failure report.
#include <hetmesh/afd/launch.hpp>
#include <hetmesh/core/error.hpp>
#include <hetmesh/core/log.hpp>
#include <hetmesh/core/socket.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
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

int run_instance(const InstanceIdentity& who, const std::function<int()>& body) {
  std::string message;
  bool consequence = false;
  try {
    return body();
  } catch (const Error& e) {
    message = e.what();
    consequence = e.status() == kStatusJobFailed;
  } catch (const std::exception& e) {
    message = e.what();
  }
  std::string origin = fmt::format("{}:{}", who.role, who.rank);
  if (!consequence) {
    try {
      // Short: the store was up when the job started, so a refusal now means it is gone.
      auto store = connect_store(who.store, std::min(who.timeout, std::chrono::milliseconds(500)));
      Rendezvous rendezvous(*store, who.job, who.role, who.rank);
      consequence = !rendezvous.report_failure(message);
    } catch (const std::exception& e) {
      log(LogLevel::warn, "{}: cannot publish its failure: {}", origin, e.what());
    }
  }
  if (consequence) {
    log(LogLevel::info, "{}: stopped after another instance's failure: {}", origin, message);
    return kExitAfterAnotherFailure;
  }
  char host[256] = "?";
  gethostname(host, sizeof host - 1);
  std::fprintf(stderr, "hetmesh: error: %s:%d on %s pid %d: %s\n", who.role.c_str(), who.rank, host,
               static_cast<int>(getpid()), message.c_str());
  return 1;
}

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

namespace {}  // namespace

namespace {

// Whether `host` (an address or a name) is one of this machine's: an address of one of its
// interfaces (getifaddrs), a loopback address, or the wildcard. (Not "a socket binds to it":
// with ip_nonlocal_bind every address would be.)
bool is_this_host(const std::string& host) {
  std::vector<net::Address> addresses;
  try {
    addresses = net::resolve(host + ":0", /*passive=*/false, "[hosts] address");
  } catch (const Error&) {
    return false;
  }
  ifaddrs* interfaces = nullptr;
  if (getifaddrs(&interfaces) != 0) return false;
  bool mine = false;
  for (const net::Address& a : addresses) {
    const sockaddr* sa = a.get();
    if (net::is_loopback(a)) mine = true;
    if (sa->sa_family == AF_INET &&
        reinterpret_cast<const sockaddr_in*>(sa)->sin_addr.s_addr == htonl(INADDR_ANY))
      mine = true;
    if (sa->sa_family == AF_INET6 &&
        IN6_IS_ADDR_UNSPECIFIED(&reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr))
      mine = true;
    for (ifaddrs* i = interfaces; i && !mine; i = i->ifa_next) {
      if (!i->ifa_addr || i->ifa_addr->sa_family != sa->sa_family) continue;
      if (sa->sa_family == AF_INET)
        mine = reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr ==
               reinterpret_cast<const sockaddr_in*>(sa)->sin_addr.s_addr;
      else if (sa->sa_family == AF_INET6)
        mine = std::memcmp(&reinterpret_cast<const sockaddr_in6*>(i->ifa_addr)->sin6_addr,
                           &reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr,
                           sizeof(in6_addr)) == 0;
    }
  }
  freeifaddrs(interfaces);
  return mine;
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
    if (value == "here") {  // the instances whose [hosts] address is this machine's
      for (int r = 0; r < config.job.attention; ++r)
        if (is_this_host(config.hosts.attention.at(static_cast<size_t>(r)))) attention.insert(r);
      for (int r = 0; r < config.job.ffn; ++r)
        if (is_this_host(config.hosts.ffn.at(static_cast<size_t>(r)))) ffn.insert(r);
      if (attention.empty() && ffn.empty())
        throw Error(HM_ERR_INVALID_ARGUMENT,
                    "--instances here: no [hosts] address of the job is this machine's");
      continue;
    }
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

std::vector<std::string> InstancePlaces::args(bool attention_role, size_t index) const {
  const auto& places = attention_role ? attention : ffn;
  if (index >= places.size()) return {};
  std::vector<std::string> out;
  if (!places[index].cpus.empty())
    out.insert(out.end(), {"--cpus", fmt::format("{}", fmt::join(places[index].cpus, ","))});
  if (!places[index].nic.empty()) out.insert(out.end(), {"--nic", places[index].nic});
  return out;
}

std::string InstancePlaces::describe(const LocalInstances& local) const {
  std::vector<std::string> parts;
  for (bool attention_role : {true, false}) {
    const auto& ranks = attention_role ? local.attention : local.ffn;
    const auto& places = attention_role ? attention : ffn;
    for (size_t i = 0; i < ranks.size() && i < places.size(); ++i) {
      std::vector<std::string> what;
      if (!places[i].cpus.empty())
        what.push_back(fmt::format("CPUs {}", fmt::join(places[i].cpus, ",")));
      if (!places[i].nic.empty()) what.push_back("NIC " + places[i].nic);
      if (!what.empty())
        parts.push_back(fmt::format("{} {}: {}", attention_role ? "attention" : "ffn", ranks[i],
                                    fmt::join(what, ", ")));
    }
  }
  return fmt::format("{}", fmt::join(parts, "; "));
}

InstancePlaces place_instances(const JobConfig& config, const LocalInstances& local,
                               const std::string& pin) {
  if (pin != "auto" && pin != "on" && pin != "off")
    throw Error(HM_ERR_INVALID_ARGUMENT, fmt::format("--pin {}: expected auto, on or off", pin));
  std::vector<int> allowed;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0)
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
      if (CPU_ISSET(cpu, &set)) allowed.push_back(cpu);
  const size_t instances = local.attention.size() + local.ffn.size();
  int each = instances > 0 ? static_cast<int>(allowed.size() / instances) : 0;
  if (pin == "off" || (pin == "auto" && (each < 4 || !config.affinity.comm_cpus.empty()))) each = 0;
  // The instances whose NIC is "auto" (attention first).
  std::vector<bool> auto_nic;
  for (Role role : {Role::attention, Role::ffn})
    for (int rank : role == Role::attention ? local.attention : local.ffn)
      auto_nic.push_back(engine_spec(config, role, rank).transport.rdma_device == "auto");
  const bool nics = std::find(auto_nic.begin(), auto_nic.end(), true) != auto_nic.end();
  InstancePlaces out;
  out.attention.resize(local.attention.size());
  out.ffn.resize(local.ffn.size());
  if (each < 1 && !nics) return out;
  // Each instance's device's PCI bus id, attention first: its NUMA node and its nearest NIC.
  PluginRegistry plugins = load_plugins(config);
  std::vector<std::string> pci;
  for (int a : local.attention)
    pci.push_back(plugins.device(config.devices.attention.at(static_cast<size_t>(a)))
                      .properties()
                      .pci_bus_id);
  for (int f : local.ffn)
    pci.push_back(
        plugins.device(config.devices.ffn.at(static_cast<size_t>(f))).properties().pci_bus_id);
  const Topology& topology = Topology::of_this_machine();
  std::vector<std::vector<int>> cpus =
      each >= 1 ? assign_cpus(pci, topology, each, allowed) : std::vector<std::vector<int>>();
  std::vector<std::string> nic = nics ? assign_nics(pci, topology) : std::vector<std::string>();
  for (size_t i = 0; i < pci.size(); ++i) {
    InstancePlace& place =
        i < local.attention.size() ? out.attention[i] : out.ffn[i - local.attention.size()];
    if (i < cpus.size()) place.cpus = cpus[i];
    if (i < nic.size() && auto_nic[i]) place.nic = nic[i];
  }
  return out;
}

namespace {

// "host:port" of "http://host:port/...".
std::string url_host_port(const std::string& url) {
  std::string rest = url.substr(url.find("://") + 3);
  return rest.substr(0, rest.find('/'));
}

}  // namespace

JobStore::JobStore(const JobConfig& config, const std::string& join, bool whole_job,
                   const std::filesystem::path& folder) {
  std::optional<JobSecret> secret;
  std::string file = config.rendezvous.secret_file;
  if (!file.empty())
    secret = JobSecret::read_file(file);
  else if ((secret = JobSecret::from_environment()))
    file = std::getenv(JobSecret::kFileVariable);
  const bool etcd = config.rendezvous.kind == RendezvousKind::etcd;
  if (!secret && etcd && !whole_job)
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("this invocation starts part of a job that meets at etcd ({}): name "
                            "the job's secret file, [rendezvous] secret_file, which every "
                            "invocation reads (a secret made here would be this invocation's "
                            "alone, and the others' links would be refused)",
                            config.rendezvous.address));
  if (!secret && (join.empty() || etcd)) {
    // A job of this launcher's own gets a secret for it alone; one across hosts must name the
    // file every host reads, since nobody else could learn this one.
    const auto where =
        net::resolve(etcd ? url_host_port(config.rendezvous.address) : config.rendezvous.address,
                     /*passive=*/true, "store address");
    if (!net::is_loopback(where.front()))
      throw Error(HM_ERR_INVALID_ARGUMENT,
                  fmt::format("[rendezvous] address {} is reachable from other hosts: name the "
                              "job's secret file, [rendezvous] secret_file, which every host of "
                              "the job reads (made with: head -c 32 /dev/urandom | xxd -p -c 64 > "
                              "FILE; chmod 600 FILE)",
                              config.rendezvous.address));
    secret = JobSecret::generate();
    file = (folder / "job.secret").string();
    secret->write_file(file);
  }
  if (secret) {
    secret_file_ = std::filesystem::absolute(file).string();
    ::setenv(JobSecret::kFileVariable, secret_file_.c_str(), 1);
  }
  if (etcd) {  // nothing to host: every invocation meets at etcd
    address_ = config.rendezvous.address;
    return;
  }
  if (!join.empty()) {
    address_ = join;
    return;
  }
  // One config for every host: the host whose address the store has hosts it, the others join.
  const std::string& at = config.rendezvous.address;
  if (!is_this_host(at.substr(0, at.rfind(':'))) && !at.ends_with(":0")) {
    address_ = at;
    return;
  }
  server_ = std::make_unique<TcpStoreServer>(config.rendezvous.address, secret);
  address_ = server_->address();
}

std::string InstanceFailure::describe() const {
  if (!reason.empty()) return fmt::format("{}:{} failed ({})", role, rank, reason);
  if (after_another)
    return fmt::format("{}:{} stopped after another instance's failure", role, rank);
  return fmt::format("{}:{} failed ({})", role, rank, result.describe());
}

std::string describe_share(const LocalInstances& local, const JobStore& store) {
  auto ranks = [](const std::vector<int>& r) {
    return r.empty() ? std::string("none") : fmt::format("{}", fmt::join(r, ","));
  };
  return fmt::format("here: attention {}, ffn {}; rendezvous store {} ({}){}",
                     ranks(local.attention), ranks(local.ffn), store.address(),
                     store.hosted() ? "hosted here" : "joined",
                     store.hosted() && !store.secret_file().empty()
                         ? fmt::format("; job secret in {} (other invocations: {}=FILE)",
                                       store.secret_file(), JobSecret::kFileVariable)
                         : "");
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
