// Faults in a running AFD job, with real processes and real signals: one instance is killed with
// SIGKILL or stopped with SIGSTOP in the middle of a run, and every survivor must end with an
// error that names a peer, within bounded time, and never by a signal of its own (a crash).
//
// The F instances answer through a device stream (a stream copy of the tokens into the outputs,
// then respond(batch, &stream)), the path on which a survivor once polled an event that its own
// loop had already destroyed. This binary re-runs itself as the instances (--role).
#include <hetmesh/afd/engine.hpp>
#include <hetmesh/afd/launch.hpp>
#include <hetmesh/core/error.hpp>
#include <hetmesh/core/log.hpp>
#include <hetmesh/core/plugin.hpp>
#include <hetmesh/core/rendezvous.hpp>
#include <hetmesh/core/subprocess.hpp>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <csignal>
#include <cstring>
#include <iostream>

namespace hetmesh::afd {
namespace {

// The engines' bound on every wait in the children: what a stopped peer costs its survivors.
constexpr std::chrono::milliseconds kChildTimeout{2000};
// How long the test waits for a child: far beyond any bound the engine promises.
constexpr std::chrono::milliseconds kWait{30000};

EngineSpec fault_spec(int attention, int ffn, TransportKind kind) {
  EngineSpec s;
  s.attention = attention;
  s.ffn = ffn;
  s.micro_batches = 3;
  s.tokens = 16;
  s.hidden = 64;
  s.top_k = 2;
  s.a2f_bytes = 2;
  s.f2a_bytes = 2;
  s.timeout = kChildTimeout;
  s.transport.kind = kind;
  return s;
}

// F: each part's outputs are a stream copy of its tokens, answered once the stream gets there.
int run_ffn(const EngineSpec& spec, KeyValueStore& store, const std::string& device_name) {
  Device device = PluginRegistry::load().device(device_name);
  FfnEngine engine(spec, device, store);
  Stream stream = device.create_stream();  // destroyed before the engine: the engine must cope
  while (auto batch = engine.get_batch(kChildTimeout)) {
    for (const auto& part : batch->parts)
      stream.copy(part.output, part.tokens_data, uint64_t{part.tokens} * spec.hidden * 2);
    engine.respond(*batch, &stream);
  }
  return 0;
}

// A: rounds without end, each answer checked; prints "round N" as it goes.
int run_attention(const EngineSpec& spec, KeyValueStore& store) {
  Device device = PluginRegistry::load().device("cpu:0");
  AttentionEngine engine(spec, device, store);
  const uint64_t bytes = uint64_t{spec.tokens} * spec.hidden * 2;
  for (int round = 0;; ++round) {
    std::vector<AttentionEngine::Handle> handles;
    for (int mb = 0; mb < spec.micro_batches; ++mb) {
      auto* tokens = static_cast<uint8_t*>(engine.tokens(mb));
      for (uint64_t i = 0; i < bytes; ++i)
        tokens[i] = static_cast<uint8_t>(i + round + mb + spec.rank);
      handles.push_back(engine.push_pull(mb, spec.tokens));
    }
    for (int mb = 0; mb < spec.micro_batches; ++mb) {
      engine.wait(handles[static_cast<size_t>(mb)], kChildTimeout);
      for (int f = 0; f < spec.ffn; ++f)
        if (std::memcmp(engine.result(mb, f), engine.tokens(mb), bytes) != 0)
          throw Error(HM_ERR_INTERNAL,
                      fmt::format("round {} mb {}: ffn {} answered wrong bytes", round, mb, f));
    }
    std::cout << "round " << round << std::endl;
  }
}

int child_main(int argc, char** argv) {
  // --role ROLE --rank RANK --store STORE --out DIR ATTENTION FFN TRANSPORT FFN_DEVICE
  if (argc < 13) return 2;
  std::string role = argv[2];
  EngineSpec spec =
      fault_spec(std::stoi(argv[9]), std::stoi(argv[10]), parse_transport_kind(argv[11]));
  spec.rank = std::stoi(argv[4]);
  set_log_identity(fmt::format("{}:{}", role, spec.rank));
  try {
    auto store = connect_tcp_store(argv[6], kChildTimeout);
    if (role == "ffn") {
      spec.role = Role::ffn;
      return run_ffn(spec, *store, argv[12]);
    }
    spec.role = Role::attention;
    return run_attention(spec, *store);
  } catch (const std::exception& e) {
    std::cout << "error " << e.what() << std::endl;
    return 1;
  }
}

// ---- the tests ----

struct Fault {
  int attention, ffn;
  TransportKind kind;
  const char* ffn_device;
  const char* victim;  // "ffn" or "attention": rank 1 of that role is hit
  int signal;          // SIGKILL or SIGSTOP
};

std::string fault_name(const Fault& f) {
  return fmt::format("{}a{}f_{}_{}_{}1_{}", f.attention, f.ffn, to_string(f.kind),
                     f.ffn_device[0] == 'a' ? "asic" : "cpu", f.victim,
                     f.signal == SIGKILL ? "kill" : "stop");
}

class AfdFaultTest : public testing::TestWithParam<Fault> {};

TEST_P(AfdFaultTest, SurvivorsEndWithANamedErrorAndNeverCrash) {
  const Fault f = GetParam();
  // Repeated: the crash this guards against depended on how the threads interleaved.
  for (int run = 0; run < 3; ++run) {
    SCOPED_TRACE(fmt::format("run {}", run));
    TcpStoreServer store("127.0.0.1:0");
    LocalJob job({}, store.address(), testing::TempDir());
    struct Child {
      std::string name;
      ChildProcess* process;
    };
    std::vector<Child> children;
    auto start = [&](const char* role, int rank) {
      ChildProcess& p = job.start(
          role, rank,
          {std::to_string(f.attention), std::to_string(f.ffn), to_string(f.kind), f.ffn_device});
      children.push_back({fmt::format("{} {}", role, rank), &p});
    };
    for (int r = 0; r < f.ffn; ++r)
      start("ffn", r);
    for (int r = 0; r < f.attention; ++r)
      start("attention", r);

    // Mid-run: attention 0 has finished a few rounds against every F.
    ChildProcess& first = *children[static_cast<size_t>(f.ffn)].process;
    for (int round = 0; round < 2 + run; ++round)
      ASSERT_EQ(first.read_line(kWait), fmt::format("round {}", round));
    const std::string victim = fmt::format("{} 1", f.victim);
    ChildProcess* hit = nullptr;
    for (auto& c : children)
      if (c.name == victim) hit = c.process;
    ASSERT_NE(hit, nullptr);
    hit->kill(f.signal);

    for (auto& c : children) {
      if (c.process == hit) continue;
      std::string error;
      try {
        for (;;) {
          std::string line = c.process->read_line(kWait);
          if (line.rfind("error ", 0) == 0) error = line;
        }
      } catch (const Error&) {  // the child closed its stdout: it has exited
      }
      ProcessResult r = c.process->wait(kWait);
      EXPECT_FALSE(r.timed_out) << c.name << " did not end: " << r.describe();
      EXPECT_EQ(r.signal, 0) << c.name << " died by a signal: " << r.describe();
      EXPECT_EQ(r.exit_code, 1) << c.name << ": " << r.describe();
      // The error names a peer: the victim itself, or a survivor that ended because of it.
      EXPECT_TRUE(error.find(" lost") != std::string::npos ||
                  error.find("no answer from") != std::string::npos ||
                  error.find("no complete micro-batch") != std::string::npos)
          << c.name << ": " << error;
      EXPECT_TRUE(error.find("ffn ") != std::string::npos ||
                  error.find("attention ") != std::string::npos)
          << c.name << " names no peer: " << error;
    }
    hit->kill(SIGKILL);
    hit->wait(kWait);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Faults, AfdFaultTest,
    testing::Values(Fault{2, 2, TransportKind::ipc, "asic_stub:0", "ffn", SIGKILL},
                    Fault{2, 2, TransportKind::ipc, "asic_stub:0", "attention", SIGKILL},
                    Fault{3, 2, TransportKind::ipc, "cpu:0", "ffn", SIGKILL},
                    Fault{2, 2, TransportKind::tcp, "asic_stub:0", "ffn", SIGKILL},
                    Fault{3, 2, TransportKind::tcp, "cpu:0", "attention", SIGKILL},
                    Fault{2, 2, TransportKind::ipc, "cpu:0", "ffn", SIGSTOP},
                    Fault{2, 2, TransportKind::tcp, "asic_stub:0", "ffn", SIGSTOP}),
    [](const testing::TestParamInfo<Fault>& p) { return fault_name(p.param); });

}  // namespace
}  // namespace hetmesh::afd

int main(int argc, char** argv) {
  if (argc > 2 && std::strcmp(argv[1], "--role") == 0) return hetmesh::afd::child_main(argc, argv);
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
