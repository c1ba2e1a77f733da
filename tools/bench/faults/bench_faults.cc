// `hetmesh bench faults`: what a dead or hung peer costs the survivors. Runs a small AFD job of
// its own instances (2A2F by default, F answering through a device stream) again and again; in
// each run, once attention 0 has done a few rounds, one instance (a rank 1, of the role chosen, or
// alternately A and F) is sent SIGKILL or SIGSTOP. A lost F ends the job (every survivor reports
// when its engine gave up); a lost A is contained (the other As finish their rounds, the Fs serve
// them to the end). Printed per transport: survivors that crashed (must be 0), hung or ended
// without naming a peer (must be 0), those contained, and the time from the signal to each
// survivor's error (p50, p99, max). With --replace, a new process takes the victim's role and rank
// at once and rejoins the running job: the As push again what a lost F owed, nobody fails, and it
// prints, besides, the time from the replacement's start to its first good round trip (the first
// round trip completed by every F, the replacement included, at each A that lost an F; at the
// replacement itself when it is an A). The times are CLOCK_MONOTONIC in every process of this
// host, so they subtract exactly.
#include "commands.hpp"

#include <hetmesh/afd/engine.hpp>
#include <hetmesh/afd/instance.hpp>
#include <hetmesh/afd/job.hpp>
#include <hetmesh/afd/local_job.hpp>
#include <hetmesh/core/error.hpp>
#include <hetmesh/core/log.hpp>
#include <hetmesh/core/percentile.hpp>
#include <hetmesh/core/rendezvous.hpp>
#include <hetmesh/core/subprocess.hpp>

#include <fmt/format.h>

#include <csignal>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <random>

namespace hetmesh::cli {
namespace {

using afd::AttentionEngine;
using afd::EngineSpec;
using afd::FfnEngine;
using afd::now_ns;
using afd::Role;

struct FaultOptions {
  std::vector<std::string> transports{"ipc", "tcp"};
  int runs = 20;
  int attention = 2, ffn = 2;
  std::string victim = "both";  // "ffn", "attention" or "both" (alternating)
  std::string signal = "kill";  // "kill" (SIGKILL) or "stop" (SIGSTOP)
  int timeout_ms = 1000;        // the engines' bound on every wait: what a stopped peer costs
  int rounds = 200;             // per A, then it leaves
  std::string ffn_device = "asic_stub:0";
  bool replace = false;  // start a replacement of the victim at once
  // internal: the instance roles
  std::string role;
  int rank = 0;
  std::string store, out, transport;
};

// The job every instance runs: A on cpu:0, F on --ffn-device, small slots, the engines' every wait
// (and the heartbeat) bounded by --timeout-ms.
afd::JobConfig job_of(const FaultOptions& o) {
  afd::JobConfig c;
  c.job.attention = o.attention;
  c.job.ffn = o.ffn;
  c.job.micro_batches = 3;
  c.job.timeout = c.job.join_timeout = c.job.io_timeout = c.job.heartbeat =
      std::chrono::milliseconds(o.timeout_ms);
  c.model.tokens = 16;
  c.model.hidden = 256;
  c.model.top_k = 2;
  c.model.a2f_dtype = c.model.f2a_dtype = afd::Dtype::bf16;
  c.devices.attention.assign(static_cast<size_t>(o.attention), "cpu:0");
  c.devices.ffn.assign(static_cast<size_t>(o.ffn), o.ffn_device);
  c.transport.kind = parse_transport_kind(o.transport);
  return c;
}

// How long a replacement may take to join: what an A waits for it, and what an F may idle
// meanwhile (the job pauses while a lost F is replaced; verbs on soft-RoCE takes seconds).
constexpr std::chrono::milliseconds kJoinLimit{10000};

// An instance: serves or pushes until its engine fails, then prints "error <ns> <message>". With
// --replace it recovers instead, printing "lost <ns> <message>" when it first finds a peer lost
// and, at an A, "good <ns>" at its first good round trip after that (or, a replacement, its first).
int run_instance(const FaultOptions& o) {
  set_log_identity(fmt::format("{}:{}", o.role, o.rank));
  try {
    const Role role = o.role == "ffn" ? Role::ffn : Role::attention;
    auto instance = afd::open_instance(job_of(o), role, o.rank, {.store = o.store});
    const EngineSpec& spec = instance->spec();
    if (role == Role::ffn) {
      FfnEngine& engine = instance->ffn();
      Stream stream = instance->device().create_stream();
      bool noticed = false;
      while (auto batch = engine.get_batch(o.replace ? kJoinLimit : spec.timeout)) {
        for (const auto& part : batch->parts)
          stream.copy(part.output, part.tokens_data(), uint64_t{part.tokens} * spec.hidden * 2);
        engine.respond(*batch, &stream);
        if (o.replace && !noticed && !engine.lost_attention().empty()) {
          noticed = true;
          std::cout << "lost " << now_ns() << " " << engine.lost_attention().front() << std::endl;
        }
      }
      return 0;  // every A is gone, one cleanly: served to the end
    }
    AttentionEngine& engine = instance->attention();
    bool lost = false, good = false;
    // With --replace: a push refused or a round trip failed for a lost F goes again once the
    // replacement is in (docs/failures.md).
    auto recover = [&](const Error& e) {
      if (!o.replace || e.status() != kStatusPeerLost) throw e;
      if (!lost) std::cout << "lost " << now_ns() << " " << e.what() << std::endl;
      lost = true;
      if (!engine.wait_for_peers(kJoinLimit))
        throw Error(HM_ERR_TIMEOUT, fmt::format("no replacement joined after: {}", e.what()));
    };
    std::vector<AttentionEngine::Handle> handles(static_cast<size_t>(spec.micro_batches));
    auto push = [&](int mb) {
      for (;;) {
        try {
          handles[static_cast<size_t>(mb)] = engine.push_pull(mb, spec.tokens);
          return;
        } catch (const Error& e) {
          recover(e);
        }
      }
    };
    for (int round = 0; round < o.rounds; ++round) {
      for (int mb = 0; mb < spec.micro_batches; ++mb)
        push(mb);
      for (int mb = 0; mb < spec.micro_batches; ++mb) {
        for (;;) {
          try {
            engine.wait(handles[static_cast<size_t>(mb)], spec.timeout);
            break;
          } catch (const Error& e) {
            recover(e);
            push(mb);
          }
        }
        if (o.replace && !good && (lost || engine.epoch() > 1)) {
          good = true;
          std::cout << "good " << now_ns() << std::endl;
        }
      }
      std::cout << "round " << round << std::endl;
    }
    engine.finish();
    return 0;
  } catch (const std::exception& e) {
    std::cout << "error " << now_ns() << " " << e.what() << std::endl;
    return 1;
  }
}

struct Tally {
  int runs = 0, survivors = 0, crashed = 0, unnamed = 0, hung = 0, contained = 0;
  std::vector<double> to_error_ms;
  std::vector<double> to_good_ms;     // --replace: the replacement's start to a good round trip
  std::vector<std::string> examples;  // one error line per kind of victim, for the reader
};

// One run: start the job, hit one instance mid-run, collect every survivor's end.
void run_once(const FaultOptions& o, const std::string& transport, const char* victim_role,
              const std::filesystem::path& out, Tally& tally) {
  TcpStoreServer store("127.0.0.1:0");
  afd::LocalJob job({"bench", "faults"}, store.address(), out.string());
  struct Child {
    std::string role;
    int rank;
    ChildProcess* process;
  };
  std::vector<Child> children;
  auto start = [&](const char* role, int rank) {
    std::vector<std::string> args = {"--transport-of-instance",
                                     transport,
                                     "--attention",
                                     std::to_string(o.attention),
                                     "--ffn",
                                     std::to_string(o.ffn),
                                     "--timeout-ms",
                                     std::to_string(o.timeout_ms),
                                     "--ffn-device",
                                     o.ffn_device};
    if (o.replace) args.push_back("--replace");
    children.push_back({role, rank, &job.start(role, rank, args)});
  };
  for (int r = 0; r < o.ffn; ++r)
    start("ffn", r);
  for (int r = 0; r < o.attention; ++r)
    start("attention", r);
  const auto wait = std::chrono::milliseconds(30000);
  ChildProcess& first = *children[static_cast<size_t>(o.ffn)].process;
  for (int round = 0; round < 3; ++round)
    if (first.read_line(wait).rfind("round", 0) != 0)
      throw Error(HM_ERR_INTERNAL, "attention 0 did not start its rounds");
  ChildProcess* hit = nullptr;
  for (auto& c : children)
    if (c.role == victim_role && c.rank == 1) hit = c.process;
  int64_t signalled = now_ns();
  hit->kill(o.signal == "stop" ? SIGSTOP : SIGKILL);
  ++tally.runs;
  int64_t replaced = 0;
  if (o.replace) {
    replaced = now_ns();
    start(victim_role, 1);
  }
  // A timestamp after `prefix` in `line`, in ms since `since`.
  auto ms_after = [](const std::string& line, size_t prefix, int64_t since) {
    return static_cast<double>(std::stoll(line.substr(prefix)) - since) / 1e6;
  };
  for (auto& c : children) {
    if (c.process == hit) continue;
    std::string error;
    try {
      for (;;) {
        std::string line = c.process->read_line(wait);
        if (line.rfind("error ", 0) == 0) error = line;
        if (line.rfind("lost ", 0) == 0) tally.to_error_ms.push_back(ms_after(line, 5, signalled));
        if (line.rfind("good ", 0) == 0) tally.to_good_ms.push_back(ms_after(line, 5, replaced));
      }
    } catch (const Error&) {  // stdout closed: the instance has ended
    }
    ProcessResult r = c.process->wait(wait);
    ++tally.survivors;
    if (r.timed_out) ++tally.hung;
    if (r.signal != 0) ++tally.crashed;
    if (r.exit_code == 0 && error.empty()) {  // served on to its end without the victim
      ++tally.contained;
      continue;
    }
    if (error.empty()) {
      ++tally.unnamed;
      continue;
    }
    size_t space = error.find(' ', 6);
    int64_t at = std::stoll(error.substr(6, space - 6));
    tally.to_error_ms.push_back(static_cast<double>(at - signalled) / 1e6);
    std::string message = error.substr(space + 1);
    if (message.find("ffn ") == std::string::npos &&
        message.find("attention ") == std::string::npos)
      ++tally.unnamed;
    if (tally.examples.size() < 2)
      tally.examples.push_back(c.role + " " + std::to_string(c.rank) + ": " + message);
  }
  hit->kill(SIGKILL);
  hit->wait(wait);
}

void run_bench(const FaultOptions& o) {
  std::filesystem::path out = afd::make_job_folder("hetmesh-bench-faults");
  fmt::print(
      "hetmesh bench faults: {}A{}F, F on {}, {} of {} rank 1, {} runs per transport, "
      "engine timeout {} ms\n",
      o.attention, o.ffn, o.ffn_device, o.signal == "stop" ? "SIGSTOP" : "SIGKILL",
      o.victim == "both" ? "A or F (alternating)" : o.victim, o.runs, o.timeout_ms);
  if (o.replace)
    fmt::print(
        "a replacement of the victim starts at once and rejoins; 'contained' counts every "
        "instance that ended well, the replacement included\n");
  fmt::print("{:>9} {:>6} {:>10} {:>8} {:>8} {:>6} {:>10} | {:>13} {:>8} {:>8}{}\n", "transport",
             "runs", "survivors", "crashed", "unnamed", "hung", "contained", "to error p50",
             "p99 ms", "max ms", o.replace ? " | start to good p50   p99 ms   max ms" : "");
  std::vector<std::string> examples;
  for (const std::string& transport : o.transports) {
    Tally tally;
    for (int run = 0; run < o.runs; ++run) {
      const char* victim = o.victim == "both" ? (run % 2 ? "attention" : "ffn") : o.victim.c_str();
      run_once(o, transport, victim, out, tally);
    }
    std::string good;
    if (o.replace)
      good = fmt::format(" | {:>17.1f} {:>8.1f} {:>8.1f}", percentile(tally.to_good_ms, 0.5),
                         percentile(tally.to_good_ms, 0.99), percentile(tally.to_good_ms, 1.0));
    fmt::print("{:>9} {:>6} {:>10} {:>8} {:>8} {:>6} {:>10} | {:>13.1f} {:>8.1f} {:>8.1f}{}\n",
               transport, tally.runs, tally.survivors, tally.crashed, tally.unnamed, tally.hung,
               tally.contained, percentile(tally.to_error_ms, 0.5),
               percentile(tally.to_error_ms, 0.99), percentile(tally.to_error_ms, 1.0), good);
    for (auto& e : tally.examples)
      examples.push_back(transport + ": " + e);
  }
  for (auto& e : examples)
    fmt::print("  e.g. {}\n", e);
  std::filesystem::remove_all(out);
}

}  // namespace

void add_bench_faults_command(CLI::App& bench) {
  auto o = std::make_shared<FaultOptions>();
  CLI::App* cmd = bench.add_subcommand(
      "faults",
      "Kill or stop one instance of a running job, again and again: survivor crashes "
      "and the time to each survivor's error");
  cmd->add_option("--transports", o->transports, "Transports to try")->capture_default_str();
  cmd->add_option("--runs", o->runs, "Runs per transport")->capture_default_str();
  cmd->add_option("--attention", o->attention, "A instances (at least 2)")->capture_default_str();
  cmd->add_option("--ffn", o->ffn, "F instances (at least 2)")->capture_default_str();
  cmd->add_option("--victim", o->victim, "ffn, attention or both (alternating)")
      ->check(CLI::IsMember({"ffn", "attention", "both"}))
      ->capture_default_str();
  cmd->add_option("--signal", o->signal, "kill (SIGKILL) or stop (SIGSTOP)")
      ->check(CLI::IsMember({"kill", "stop"}))
      ->capture_default_str();
  cmd->add_option("--timeout-ms", o->timeout_ms, "The engines' bound on every wait")
      ->capture_default_str();
  cmd->add_option("--ffn-device", o->ffn_device, "F's device")->capture_default_str();
  cmd->add_flag("--replace", o->replace,
                "Start a replacement of the victim at once: it rejoins the running job, and the "
                "time from its start to the first good round trip is measured");
  cmd->add_option("--role", o->role, "internal")->group("");
  cmd->add_option("--rank", o->rank, "internal")->group("");
  cmd->add_option("--store", o->store, "internal")->group("");
  cmd->add_option("--out", o->out, "internal")->group("");
  cmd->add_option("--transport-of-instance", o->transport, "internal")->group("");
  cmd->callback([o] {
    if (!o->role.empty()) std::exit(run_instance(*o));
    if (o->attention < 2 || o->ffn < 2)
      throw Error(HM_ERR_INVALID_ARGUMENT, "bench faults needs at least 2 A and 2 F instances");
    run_bench(*o);
  });
}

}  // namespace hetmesh::cli
