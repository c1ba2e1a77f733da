// The job config: defaults, the full schema, every validation rule with its exact message
// (file:line:column, key path), the effective-config printer, and every example file.
#include <hetmesh/afd/job.hpp>
#include <hetmesh/afd/job_config.hpp>
#include <hetmesh/core/error.hpp>

#include "test_support.hpp"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace hetmesh::afd {
namespace {

// The message of the Error that parsing `text` throws; fails the test if it parses.
std::string error_of(std::string_view text, const std::string& name = "job.toml") {
  try {
    parse_config(text, name);
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), HM_ERR_INVALID_ARGUMENT) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "parsed without an error:\n" << text;
  return {};
}

TEST(ConfigTest, EmptyFileIsA1A1FJobOnCpuOverAutoTransport) {
  JobConfig c = parse_config("", "empty.toml");
  EXPECT_EQ(c, JobConfig{});
  EXPECT_EQ(c.job.attention, 1);
  EXPECT_EQ(c.job.ffn, 1);
  EXPECT_EQ(c.devices.attention, std::vector<std::string>{"cpu:0"});
  EXPECT_EQ(c.devices.ffn, std::vector<std::string>{"cpu:0"});
  EXPECT_EQ(c.transport.kind, std::nullopt);  // "auto"
  EXPECT_EQ(c.rendezvous.kind, RendezvousKind::tcp);
  EXPECT_EQ(c.job.timeout, std::chrono::milliseconds(10000));
  EXPECT_LE(c.model.top_k, c.model.experts);
}

TEST(ConfigTest, FabricTakesItsProviderToEveryInstance) {
  JobConfig c = parse_config(
      "[job]\nattention = 2\n[transport]\nkind = \"fabric\"\nprovider = "
      "\"verbs;ofi_rxm\"\n",
      "job.toml");
  EXPECT_EQ(c.transport.kind, TransportKind::fabric);
  EXPECT_EQ(c.transport.provider, "verbs;ofi_rxm");
  EXPECT_EQ(engine_spec(c, Role::attention, 1).transport.fabric_provider, "verbs;ofi_rxm");
  EXPECT_EQ(engine_spec(c, Role::ffn, 0).transport.kind, TransportKind::fabric);
  EXPECT_EQ(parse_config("", "job.toml").transport.provider, "auto");
}

TEST(ConfigTest, RailsTakeTheirNicsToEveryInstance) {
  JobConfig c = parse_config(
      "[job]\nattention = 2\n[transport]\nkind = \"verbs\"\nnics = [\"mlx5_0\", \"mlx5_1\"]\n",
      "job.toml");
  EXPECT_EQ(c.transport.nics, (std::vector<std::string>{"mlx5_0", "mlx5_1"}));
  EXPECT_EQ(engine_spec(c, Role::attention, 1).transport.rails, c.transport.nics);
  EXPECT_EQ(engine_spec(c, Role::ffn, 0).transport.rails, c.transport.nics);
  EXPECT_EQ(parse_config(to_toml(c), "effective.toml"), c) << to_toml(c);
  JobConfig automatic =
      parse_config("[transport]\nkind = \"verbs\"\nnics = \"auto\"\n", "job.toml");
  EXPECT_EQ(automatic.transport.nics, std::vector<std::string>{"auto"});
  EXPECT_EQ(parse_config(to_toml(automatic), "effective.toml"), automatic) << to_toml(automatic);
  EXPECT_TRUE(parse_config("", "job.toml").transport.nics.empty());
  JobConfig fabric = parse_config(
      "[transport]\nkind = \"fabric\"\nnics = [\"10.0.0.1\", \"rdmap16s27-rdm\"]\n", "job.toml");
  EXPECT_EQ(fabric.transport.nics, (std::vector<std::string>{"10.0.0.1", "rdmap16s27-rdm"}));
}

TEST(ConfigTest, RailsThatCannotBeAreRefusedByName) {
  EXPECT_EQ(error_of("[transport]\nnics = [\"a\", \"b\"]\n"),
            "job.toml:2:1: [transport] nics: rails are for kind = \"verbs\", \"tcp\" or "
            "\"fabric\" (name the kind: each takes different names, RDMA devices, local "
            "addresses, or either)");
  EXPECT_NE(error_of("[transport]\nkind = \"ipc\"\nnics = [\"a\", \"b\"]\n").find("rails are for"),
            std::string::npos);
  EXPECT_EQ(error_of("[transport]\nkind = \"tcp\"\nnics = [\"10.0.0.1\"]\n"),
            "job.toml:3:1: [transport] nics: 2 to 16 different NICs make rails, got [10.0.0.1]");
  EXPECT_EQ(error_of("[transport]\nkind = \"verbs\"\nnics = [\"m0\", \"m0\"]\n"),
            "job.toml:3:1: [transport] nics: 2 to 16 different NICs make rails, got [m0, m0]");
  EXPECT_NE(error_of("[transport]\nkind = \"tcp\"\nnics = \"auto\"\n").find("expected \"auto\""),
            std::string::npos);
  EXPECT_NE(error_of("[transport]\nkind = \"verbs\"\nnics = [\"m0\", 3]\n").find("a NIC's name"),
            std::string::npos);
}

TEST(ConfigTest, ReadsTheFullSchema) {
  JobConfig c = parse_config(R"(
[job]
attention = 2
ffn = 2
micro_batches = 3
layers = 4
gather = "eager"
timeout_ms = 2500
[model]
tokens = 128
hidden = 7168
experts = 8
top_k = 2
a2f_dtype = "fp8"
f2a_dtype = "fp32"
[devices]
attention = "cpu"
ffn = ["asic_stub:0", "asic_stub:1"]
[plugins]
paths = ["/opt/x/libhetmesh-device-x.so"]
[plugins.options]
asic_stub = { copy_latency_us = 2, copy_bandwidth_gbps = 32.5, trace = true }
cpu = "threads=4;pin=false"
[transport]
kind = "verbs"
listen_host = "10.0.0.1"
rdma_device = "mlx5_0"
gid_index = 3
staging_slots = 8
staging_slot_kib = 1024
[rendezvous]
kind = "tcp"
address = "[::1]:29500"
secret_file = "/etc/hetmesh/job.secret"
[tracing]
enabled = false
chrome_trace = ""
straggler_factor = 2
[affinity]
comm_cpus = [2, 3]
poller_cpu = 4
)",
                             "full.toml");
  EXPECT_EQ(c.job.attention, 2);
  EXPECT_EQ(c.job.gather, Gather::eager);
  EXPECT_EQ(c.job.timeout, std::chrono::milliseconds(2500));
  EXPECT_EQ(c.model.hidden, 7168);
  EXPECT_EQ(c.model.f2a_dtype, Dtype::fp32);
  // A single selector is repeated per instance and "cpu" is normalised to "cpu:0".
  EXPECT_EQ(c.devices.attention, (std::vector<std::string>{"cpu:0", "cpu:0"}));
  EXPECT_EQ(c.devices.ffn, (std::vector<std::string>{"asic_stub:0", "asic_stub:1"}));
  EXPECT_EQ(c.plugins.paths, std::vector<std::string>{"/opt/x/libhetmesh-device-x.so"});
  // Tables become "k=v;k=v" with sorted keys; strings are kept as written.
  EXPECT_EQ(c.plugins.options.at("asic_stub"),
            "copy_bandwidth_gbps=32.5;copy_latency_us=2;trace=true");
  EXPECT_EQ(c.plugins.options.at("cpu"), "threads=4;pin=false");
  EXPECT_EQ(c.transport.kind, TransportKind::verbs);
  EXPECT_EQ(c.transport.rdma_device, "mlx5_0");
  EXPECT_EQ(c.transport.gid_index, 3);
  EXPECT_EQ(c.transport.staging_slots, 8);
  EXPECT_EQ(c.transport.staging_slot_kib, 1024);
  EXPECT_EQ(c.rendezvous.address, "[::1]:29500");
  EXPECT_EQ(c.rendezvous.secret_file, "/etc/hetmesh/job.secret");
  EXPECT_FALSE(c.tracing.enabled);
  EXPECT_EQ(c.tracing.chrome_trace, "");
  EXPECT_EQ(c.tracing.straggler_factor, 2.0);  // an integer where a float is expected is fine
  EXPECT_EQ(c.affinity.comm_cpus, (std::vector<int>{2, 3}));
  EXPECT_EQ(c.affinity.poller_cpu, 4);
}

// An A and an F on one GPU as two processes pay the GPU's context switch on every hop: the demo
// and the bench say so, unless MPS shares the GPU.
TEST(ConfigTest, AdvisesMpsWhenAnAAndAnFShareAGpu) {
  auto shared = shared_device_advice(
      parse_config("[devices]\nattention = \"cuda:0\"\nffn = \"cuda:0\"\n", "job.toml"));
  ASSERT_TRUE(shared.has_value());
  EXPECT_NE(shared->find("share cuda:0 as separate processes"), std::string::npos) << *shared;
  EXPECT_NE(shared->find("nvidia-cuda-mps-control -d"), std::string::npos) << *shared;
  EXPECT_FALSE(shared_device_advice(parse_config("", "job.toml")));  // cpu:0 both
  EXPECT_FALSE(shared_device_advice(
      parse_config("[devices]\nattention = \"cuda:0\"\nffn = \"cpu:0\"\n", "job.toml")));
  // With MPS's control pipe where CUDA_MPS_PIPE_DIRECTORY says, nothing to advise.
  std::filesystem::path pipe = std::filesystem::path(testing::TempDir()) / "mps-pipe";
  std::filesystem::create_directories(pipe);
  std::ofstream(pipe / "control") << "";
  setenv("CUDA_MPS_PIPE_DIRECTORY", pipe.c_str(), 1);
  EXPECT_FALSE(shared_device_advice(
      parse_config("[devices]\nattention = \"cuda:0\"\nffn = \"cuda:0\"\n", "job.toml")));
  unsetenv("CUDA_MPS_PIPE_DIRECTORY");
  std::filesystem::remove_all(pipe);
}

TEST(ConfigTest, DtypeSizes) {
  EXPECT_EQ(dtype_bytes(Dtype::fp8), 1u);
  EXPECT_EQ(dtype_bytes(Dtype::bf16), 2u);
  EXPECT_EQ(dtype_bytes(Dtype::fp16), 2u);
  EXPECT_EQ(dtype_bytes(Dtype::fp32), 4u);
  EXPECT_EQ(dtype_bytes(Dtype::int32), 4u);
  EXPECT_EQ(dtype_bytes(Dtype::int64), 8u);
  EXPECT_STREQ(to_string(Dtype::bf16), "bf16");
  EXPECT_STREQ(to_string(Dtype::int64), "int64");
  EXPECT_STREQ(to_string(std::optional<TransportKind>()), "auto");
}

TEST(ConfigTest, UnknownKeySuggestsTheClosestOne) {
  EXPECT_EQ(error_of("[job]\nattention = 2\nmicro_batchs = 3\n", "2a2f.toml"),
            "2a2f.toml:3:1: unknown key [job] micro_batchs (did you mean micro_batches?)");
  // Far from every known key: no suggestion.
  EXPECT_EQ(error_of("[tracing]\nflamegraph = true\n"),
            "job.toml:2:1: unknown key [tracing] flamegraph");
}

TEST(ConfigTest, UnknownTablesAndTopLevelKeys) {
  EXPECT_EQ(error_of("\n[jobs]\nattention = 2\n"),
            "job.toml:2:2: unknown table [jobs] (did you mean job?)");
  EXPECT_EQ(error_of("[transport.tcp]\nnodelay = true\n"),
            "job.toml:1:12: unknown table [transport.tcp]");
  EXPECT_EQ(error_of("attention = 2\n"),
            "job.toml:1:1: unknown top-level key attention; keys belong in a table such as [job]");
}

TEST(ConfigTest, WrongTypeNamesWhatWasFound) {
  EXPECT_EQ(error_of("[job]\nattention = \"2\"\n"),
            "job.toml:2:1: [job] attention: expected an integer in 1..1024, got string \"2\"");
  EXPECT_EQ(error_of("[tracing]\nenabled = 1\n"),
            "job.toml:2:1: [tracing] enabled: expected true or false, got integer 1");
  EXPECT_EQ(error_of("[transport]\nlisten_host = 127\n"),
            "job.toml:2:1: [transport] listen_host: expected a string, got integer 127");
  EXPECT_EQ(error_of("model = 5\n"), "job.toml:1:1: [model]: expected a table, got integer 5");
}

// Joining, waiting for data and a stalled write each have their own bound; the first two
// default to the wait's, so a file that gives only timeout_ms means what it meant before.
TEST(ConfigTest, JoinAndIoTimeoutsDefaultToTheWaitTimeout) {
  JobConfig c = parse_config("[job]\ntimeout_ms = 2500\n", "job.toml");
  EXPECT_EQ(c.job.join_timeout, std::chrono::milliseconds(2500));
  EXPECT_EQ(c.job.io_timeout, std::chrono::milliseconds(2500));
  c = parse_config("[job]\ntimeout_ms = 2500\njoin_timeout_ms = 600000\nio_timeout_ms = 700\n",
                   "job.toml");
  EXPECT_EQ(c.job.timeout, std::chrono::milliseconds(2500));
  EXPECT_EQ(c.job.join_timeout, std::chrono::milliseconds(600000));
  EXPECT_EQ(c.job.io_timeout, std::chrono::milliseconds(700));
  EngineSpec spec = engine_spec(c, Role::attention, 0);
  EXPECT_EQ(spec.join_deadline(), std::chrono::milliseconds(600000));
  EXPECT_EQ(spec.io_timeout, std::chrono::milliseconds(700));
  EXPECT_EQ(spec.queue_depth, 8);
  EXPECT_EQ(engine_spec(parse_config("[job]\nqueue_depth = 3\n", "job.toml"), Role::attention, 0)
                .queue_depth,
            3);
  EXPECT_EQ(error_of("[job]\nqueue_depth = 65\n"),
            "job.toml:2:1: [job] queue_depth: expected an integer in 1..64, got 65");
  EXPECT_EQ(error_of("[job]\njoin_timeout_ms = 0\n"),
            "job.toml:2:1: [job] join_timeout_ms: expected an integer in 1..86400000, got 0");
}

TEST(ConfigTest, OutOfRangeValues) {
  EXPECT_EQ(error_of("[job]\nffn = 1\n\n[model]\nhidden = -5\n", "2a2f.toml"),
            "2a2f.toml:5:1: [model] hidden: expected a positive integer, got -5");
  EXPECT_EQ(error_of("[job]\n  micro_batches = 65\n"),
            "job.toml:2:3: [job] micro_batches: expected an integer in 1..64, got 65");
  EXPECT_EQ(error_of("[job]\ntimeout_ms = 0\n"),
            "job.toml:2:1: [job] timeout_ms: expected an integer in 1..86400000, got 0");
  EXPECT_EQ(error_of("[job]\nheartbeat_ms = 50\n"),
            "job.toml:2:1: [job] heartbeat_ms: expected an integer in 100..86400000, got 50");
  // The gather window is bounded by the job's timeout: a wait longer than that is no window.
  EXPECT_EQ(error_of("[job]\ntimeout_ms = 500\ngather_window_ms = 501\n"),
            "job.toml:3:1: [job] gather_window_ms: expected an integer in 1..500, got 501");
  EXPECT_EQ(error_of("[transport]\ngid_index = -2\n"),
            "job.toml:2:1: [transport] gid_index: expected an integer in -1..65535, got -2");
  EXPECT_EQ(error_of("[transport]\nstaging_slots = 1\n"),
            "job.toml:2:1: [transport] staging_slots: expected an integer in 2..64, got 1");
  EXPECT_EQ(
      error_of("[transport]\nstaging_slot_kib = 65537\n"),
      "job.toml:2:1: [transport] staging_slot_kib: expected an integer in 4..65536, got 65537");
  EXPECT_EQ(error_of("[tracing]\nstraggler_factor = 0.5\n"),
            "job.toml:2:1: [tracing] straggler_factor: expected a number > 1, got 0.5");
  EXPECT_EQ(error_of("[affinity]\ncomm_cpus = [1,\n  -3]\n"),
            "job.toml:3:3: [affinity] comm_cpus[1]: expected a CPU id in 0..1023, got -3");
  // Within int range individually, too big together.
  EXPECT_NE(error_of("[model]\ntokens = 1000000\nhidden = 100000\n")
                .find("job.toml:3:1: [model] hidden: tokens x hidden x 2 bytes"),
            std::string::npos);
}

TEST(ConfigTest, BadDtype) {
  EXPECT_EQ(error_of("[model]\na2f_dtype = \"fp9\"\n"),
            "job.toml:2:1: [model] a2f_dtype: unknown value \"fp9\" (expected one of fp8, bf16, "
            "fp16, fp32; did you mean fp8?)");
  EXPECT_EQ(error_of("[model]\nf2a_dtype = \"int4\"\n"),
            "job.toml:2:1: [model] f2a_dtype: unknown value \"int4\" (expected one of fp8, bf16, "
            "fp16, fp32)");
}

// An explicit A-to-F map: each A's Fs, every F served; refused by name otherwise.
TEST(ConfigTest, TopologyMapNamesEachAttentionsFfns) {
  JobConfig c = parse_config(
      "[job]\nattention = 3\nffn = 2\ntopology = \"map\"\nffns_of = [[0], [0, 1], [1]]\n",
      "job.toml");
  EXPECT_EQ(c.job.topology, JobTopology::map);
  EXPECT_EQ(c.job.ffns_of, (std::vector<std::vector<int>>{{0}, {0, 1}, {1}}));
  EngineSpec spec = job_shape(c, Role::ffn, 1);
  EXPECT_TRUE(spec.sends(1, 1) && spec.sends(2, 1) && !spec.sends(0, 1));
  EXPECT_EQ(spec.attention_of(1), 2);
  EXPECT_EQ(spec.window_of(2, 1), 1);
  EXPECT_EQ(spec.ffn_rows(1), 2u * spec.tokens);
  EXPECT_EQ(parse_config(to_toml(c), "effective.toml"), c) << to_toml(c);
  const std::string head = "[job]\nattention = 2\nffn = 2\ntopology = \"map\"\n";
  EXPECT_EQ(error_of(head),
            "job.toml:4:1: [job] topology: \"map\" needs [job] ffns_of: for each A, the Fs it "
            "sends to");
  EXPECT_EQ(error_of(head + "ffns_of = [[0], [0, 2]]\n"),
            "job.toml:5:17: [job] ffns_of[1]: attention 1: integer 2 is not an F rank of its own "
            "(0..1, each once)");
  EXPECT_EQ(error_of(head + "ffns_of = [[0], [0, 0]]\n"),
            "job.toml:5:17: [job] ffns_of[1]: attention 1: integer 0 is not an F rank of its own "
            "(0..1, each once)");
  EXPECT_EQ(error_of(head + "ffns_of = [[0], []]\n"),
            "job.toml:5:17: [job] ffns_of[1]: attention 1: expected a non-empty array of F "
            "ranks, got an array");
  EXPECT_EQ(error_of(head + "ffns_of = [[0], [0]]\n"),
            "job.toml:5:1: [job] ffns_of: ffn 1 serves no A");
  EXPECT_EQ(error_of(head + "ffns_of = [[0, 1]]\n"),
            "job.toml:5:1: [job] ffns_of: 1 lists for 2 As (one each)");
  EXPECT_EQ(error_of("[job]\nffns_of = [[0]]\n"),
            "job.toml:2:1: [job] ffns_of: names each A's Fs for topology = \"map\" only (the "
            "job's is all)");
}

// Pushes carry the tensors [model.a2f_tensors] declares, each a row a token, in name order; the
// routing may go (top_k = 0), and the hidden states stay floating.
TEST(ConfigTest, ExtraA2fTensorsAndNoRouting) {
  JobConfig c = parse_config(R"(
[model]
top_k = 0
[model.a2f_tensors]
topk_ids = { dtype = "int64", columns = 8 }
router_logits = { dtype = "bf16", columns = 256 }
)",
                             "job.toml");
  EXPECT_EQ(c.model.top_k, 0);
  ASSERT_EQ(c.model.a2f_tensors.size(), 2u);
  EXPECT_EQ(c.model.a2f_tensors[0], (TensorSection{"router_logits", Dtype::bf16, 256}));
  EXPECT_EQ(c.model.a2f_tensors[1], (TensorSection{"topk_ids", Dtype::int64, 8}));
  EngineSpec spec = job_shape(c, Role::attention, 0);
  EXPECT_EQ(spec.a2f_tensors(), 4);
  EXPECT_EQ(spec.a2f_row_bytes(kRoutingTensor), 0u);
  EXPECT_EQ(spec.a2f_row_bytes(2), 512u);
  EXPECT_EQ(spec.a2f_tensor_name(3), "topk_ids");
  EXPECT_EQ(spec.a2f_bytes_per_token(), 256u + 512 + 64);
  EXPECT_EQ(parse_config(to_toml(c), "effective.toml"), c) << to_toml(c);

  EXPECT_EQ(error_of("[model.a2f_tensors]\nrouting = { dtype = \"fp32\" }\n"),
            "job.toml:2:1: [model.a2f_tensors] routing: not a tensor name ([a-z0-9_], at most "
            "32 characters, none of tokens, routing, experts, weights, output)");
  EXPECT_EQ(error_of("[model.a2f_tensors]\n\"Router Logits\" = { dtype = \"fp32\" }\n"),
            "job.toml:2:1: [model.a2f_tensors] Router Logits: not a tensor name ([a-z0-9_], at "
            "most 32 characters, none of tokens, routing, experts, weights, output)");
  EXPECT_EQ(error_of("[model.a2f_tensors]\nlogits = { dtype = \"fp64\" }\n"),
            "job.toml:2:12: [model.a2f_tensors.logits] dtype: unknown value \"fp64\" (expected "
            "one of fp8, bf16, fp16, fp32, int32, int64; did you mean fp8?)");
  EXPECT_EQ(error_of("[model.a2f_tensors]\nlogits = { dtype = \"fp32\", colums = 3 }\n"),
            "job.toml:2:28: unknown key [model.a2f_tensors.logits] colums (did you mean "
            "columns?)");
  EXPECT_EQ(error_of("[model.a2f_tensors]\nlogits = 3\n"),
            "job.toml:2:1: [model.a2f_tensors.logits]: expected a table, got integer 3");
  EXPECT_EQ(error_of("[model]\na2f_tensors = [1]\n"),
            "job.toml:2:1: [model] a2f_tensors: expected a table of tensor names, got an array");
  EXPECT_EQ(
      error_of("[model.a2f_tensors]\na = {}\nb = {}\nc = {}\nd = {}\ne = {}\nf = {}\ng = {}\n"),
      "job.toml:1:8: [model] a2f_tensors: 7 tensors; a push carries at most 6 beside the "
      "tokens and routing");
  EXPECT_EQ(error_of("[model]\ntokens = 1024\n[model.a2f_tensors]\nlogits = { dtype = \"int64\", "
                     "columns = 1048576 }\n"),
            "job.toml:4:29: [model.a2f_tensors.logits] columns: tokens x columns x 8 bytes = "
            "8589934592 bytes per micro-batch exceeds the 4 GiB limit");
  // The hidden states are never integers.
  EXPECT_EQ(error_of("[model]\na2f_dtype = \"int32\"\n"),
            "job.toml:2:1: [model] a2f_dtype: unknown value \"int32\" (expected one of fp8, bf16, "
            "fp16, fp32)");
}

// etcd is a store of its own: its address is a URL, with a default on this host.
TEST(ConfigTest, EtcdRendezvous) {
  JobConfig c = parse_config("[rendezvous]\nkind = \"etcd\"\n", "job.toml");
  EXPECT_EQ(c.rendezvous.kind, RendezvousKind::etcd);
  EXPECT_EQ(c.rendezvous.address, "http://127.0.0.1:2379");
  c = parse_config("[rendezvous]\nkind = \"etcd\"\naddress = \"https://etcd.example:2379\"\n",
                   "job.toml");
  EXPECT_EQ(c.rendezvous.address, "https://etcd.example:2379");
}

// vLLM's mapping: each A to one F, attention / ffn As per F; counts that do not divide refused.
TEST(ConfigTest, TopologyGroupsNeedsAttentionToDivideAmongTheFfns) {
  JobConfig c = parse_config("[job]\nattention = 4\nffn = 2\ntopology = \"groups\"\n", "job.toml");
  EXPECT_EQ(c.job.topology, JobTopology::groups);
  EngineSpec spec = engine_spec(c, Role::attention, 3);
  EXPECT_FALSE(spec.sends(3, 0));
  EXPECT_TRUE(spec.sends(3, 1));
  EXPECT_TRUE(
      engine_spec(parse_config("[job]\nattention = 3\nffn = 2\n", "job.toml"), Role::attention, 2)
          .sends(2, 0));  // all: every A to every F
  EXPECT_EQ(error_of("[job]\nattention = 3\nffn = 2\ntopology = \"groups\"\n"),
            "job.toml:4:1: [job] topology: \"groups\" maps attention / ffn As to each F: 3 As "
            "do not divide among 2 Fs");
}

TEST(ConfigTest, BadEnumsElsewhere) {
  EXPECT_EQ(error_of("[job]\ngather = \"some\"\n"),
            "job.toml:2:1: [job] gather: unknown value \"some\" (expected one of all, eager)");
  EXPECT_EQ(error_of("[transport]\nkind = \"verb\"\n"),
            "job.toml:2:1: [transport] kind: unknown value \"verb\" (expected one of auto, ipc, "
            "tcp, verbs, fabric; did you mean verbs?)");
  EXPECT_EQ(error_of("[rendezvous]\nkind = \"etcd\"\naddress = \"127.0.0.1:2379\"\n"),
            "job.toml:3:1: [rendezvous] address: etcd's address is http://host:port or "
            "https://host:port, got \"127.0.0.1:2379\"");
  EXPECT_EQ(error_of("[rendezvous]\nkind = \"etc\"\n"),
            "job.toml:2:1: [rendezvous] kind: unknown value \"etc\" (expected one of tcp, etcd; "
            "did you mean etcd?)");
  EXPECT_EQ(error_of("[rendezvous]\naddress = \"localhost\"\n"),
            "job.toml:2:1: [rendezvous] address: expected host:port (IPv6 as [addr]:port), got "
            "\"localhost\"");
  EXPECT_EQ(error_of("[rendezvous]\naddress = \"::1:29500\"\n"),
            "job.toml:2:1: [rendezvous] address: expected host:port (IPv6 as [addr]:port), got "
            "\"::1:29500\"");
}

TEST(ConfigTest, BadSelector) {
  EXPECT_EQ(error_of("[devices]\nattention = \"cuda:x\"\n"),
            "job.toml:2:1: [devices] attention: bad device selector \"cuda:x\" (expected "
            "name:index, e.g. \"cpu:0\")");
  // In an array the element's own position is reported.
  EXPECT_EQ(error_of("[job]\nffn = 2\n[devices]\nffn = [\"asic_stub:0\", \"Asic:1\"]\n"),
            "job.toml:4:23: [devices] ffn[1]: bad device selector \"Asic:1\" (expected "
            "name:index, e.g. \"cpu:0\")");
  EXPECT_NE(error_of("[devices]\nffn = \":0\"\n").find("bad device selector \":0\""),
            std::string::npos);
  EXPECT_NE(error_of("[devices]\nffn = \"cpu:\"\n").find("bad device selector \"cpu:\""),
            std::string::npos);
}

TEST(ConfigTest, DeviceArrayLengthMustMatchTheInstanceCount) {
  EXPECT_EQ(error_of("[job]\nattention = 3\n[devices]\nattention = [\"cpu:0\", \"cpu:0\"]\n"),
            "job.toml:4:1: [devices] attention: 2 selector(s) for 3 A instance(s) ([job] "
            "attention = 3); give one per instance or a single string for all");
  // The default is one F instance.
  EXPECT_EQ(error_of("[devices]\nffn = [\"cpu:0\", \"cpu:1\"]\n"),
            "job.toml:2:1: [devices] ffn: 2 selector(s) for 1 F instance(s) ([job] ffn = 1); "
            "give one per instance or a single string for all");
}

TEST(ConfigTest, TopKMustNotExceedExperts) {
  EXPECT_EQ(error_of("[model]\nexperts = 8\ntop_k = 9\n"),
            "job.toml:3:1: [model] top_k: 9 is more than experts (8)");
  // Only experts is written: the message points at it and says top_k is the default.
  EXPECT_EQ(error_of("[model]\nexperts = 1\n"),
            "job.toml:2:1: [model] experts: 1 is less than top_k (2, the default)");
}

TEST(ConfigTest, TopKHasACap) {
  // Before the cap, top_k = 2147483647 (with as many experts) was accepted, and the routing bytes
  // of a slot grew without bound.
  EXPECT_EQ(error_of("[model]\nexperts = 2147483647\ntop_k = 2147483647\n"),
            "job.toml:3:1: [model] top_k: expected an integer in 0..1024, got 2147483647");
  EXPECT_EQ(error_of("[model]\nexperts = 2000\ntop_k = 1025\n"),
            "job.toml:3:1: [model] top_k: expected an integer in 0..1024, got 1025");
  EXPECT_EQ(parse_config("[model]\nexperts = 2000\ntop_k = 1024\n", "job.toml").model.top_k, 1024);
}

TEST(ConfigTest, TotalSlotBytesOfAnInstanceHaveACap) {
  // Each micro-batch is under the 4 GiB limit (1 GiB each way), but 64 in flight to 8 F
  // instances are 64 x (1 + 8 x 2) GiB of slots in each A.
  std::string what = error_of(
      "[job]\nffn = 8\nmicro_batches = 64\n[model]\nexperts = 8\ntokens = 131072\n"
      "hidden = 4096\n");
  EXPECT_NE(what.find("job.toml:3:1: [job] micro_batches: the slots of each attention instance "
                      "would take "),
            std::string::npos)
      << what;
  EXPECT_NE(what.find("more than the 256 GiB limit"), std::string::npos) << what;
  // The same shape with few micro-batches fits.
  EXPECT_NO_THROW(
      parse_config("[job]\nffn = 8\nmicro_batches = 2\n[model]\nexperts = 8\ntokens = 131072\n"
                   "hidden = 4096\n",
                   "job.toml"));
}

TEST(ConfigTest, EveryFfnInstanceNeedsAnExpert) {
  EXPECT_EQ(error_of("[job]\nffn = 4\n[model]\nexperts = 2\ntop_k = 1\n"),
            "job.toml:4:1: [model] experts: 2 expert(s) cannot be split across 4 F instances "
            "([job] ffn); each F needs at least one");
  // Default experts (4): point at [job] ffn, which is what the user wrote.
  EXPECT_EQ(error_of("[job]\nffn = 8\n"),
            "job.toml:2:1: [job] ffn: 8 F instances need at least 8 experts, but [model] experts "
            "is 4");
}

TEST(ConfigTest, PluginSection) {
  EXPECT_EQ(error_of("[plugins.options]\nasic_stub = \"copy_latency_us\"\n"),
            "job.toml:2:1: [plugins.options] asic_stub: option \"copy_latency_us\" is not "
            "key=value");
  EXPECT_EQ(error_of("[plugins.options]\nasic_stub = { latency = [1, 2] }\n"),
            "job.toml:2:15: [plugins.options.asic_stub] latency: expected a string, number or "
            "boolean, got an array");
  EXPECT_EQ(error_of("[plugins.options]\n\"Bad-Name\" = \"a=1\"\n"),
            "job.toml:2:1: [plugins.options] Bad-Name: not a plugin name ([a-z0-9_], at most 32 "
            "characters)");
  EXPECT_EQ(error_of("[plugins]\npaths = [\"\"]\n"),
            "job.toml:2:10: [plugins] paths[0]: expected a non-empty path, got string \"\"");
  EXPECT_EQ(error_of("[plugins]\npath = []\n"),
            "job.toml:2:1: unknown key [plugins] path (did you mean paths?)");
}

// Options are for the plugins the job's devices are on (or that its [plugins] paths load): any
// other name would be read by nobody, so it is refused, with the closest name, as an unknown key.
TEST(ConfigTest, OptionsForAPluginTheJobDoesNotUseAreRefused) {
  EXPECT_EQ(error_of("[devices]\nffn = \"asic_stub:0\"\n[plugins.options]\n"
                     "asic_stb = { copy_latency_us = 2 }\n"),
            "job.toml:4:1: [plugins.options] asic_stb: no device of this job is on a plugin of "
            "that name, so nothing would read these options (did you mean asic_stub?); the job's "
            "plugins are cpu, asic_stub (from [devices] and [plugins] paths)");
  EXPECT_EQ(error_of("[plugins.options]\ncuda = \"a=1\"\n"),
            "job.toml:2:1: [plugins.options] cuda: no device of this job is on a plugin of that "
            "name, so nothing would read these options; the job's plugins are cpu (from [devices] "
            "and [plugins] paths)");
  // A plugin of [plugins] paths is known by its file's name, as the loader keys its options.
  JobConfig c = parse_config(
      "[plugins]\npaths = [\"/opt/x/libhetmesh-device-mychip.so\"]\n[plugins.options]\n"
      "mychip = \"a=1\"\ncpu = \"threads=2\"\n",
      "job.toml");
  EXPECT_EQ(c.plugins.options.at("mychip"), "a=1");
}

TEST(ConfigTest, TomlSyntaxErrorCarriesTomlPlusPlusPosition) {
  std::string message = error_of("[job]\nattention = = 2\n", "bad.toml");
  EXPECT_EQ(message.rfind("bad.toml:2:13: TOML syntax error: ", 0), 0u) << message;
  // A key defined twice is TOML++'s error too, on the second definition's line.
  message = error_of("[job]\nffn = 1\nffn = 2\n", "twice.toml");
  EXPECT_EQ(message.rfind("twice.toml:3:", 0), 0u) << message;
  EXPECT_NE(message.find("TOML syntax error"), std::string::npos) << message;
}

TEST(ConfigTest, MissingFileNamesThePathAndTheReason) {
  try {
    load_config("/nonexistent/hetmesh/job.toml");
    FAIL() << "loaded a missing file";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), HM_ERR_INVALID_ARGUMENT);
    EXPECT_STREQ(e.what(),
                 "cannot read config /nonexistent/hetmesh/job.toml: No such file or directory");
  }
  test::TempDir dir;
  try {
    load_config(dir.path().string());
    FAIL() << "loaded a folder";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "config " + dir.path().string() + " is a directory, not a regular file");
  }
}

TEST(ConfigTest, LoadConfigReportsTheFilePath) {
  test::TempDir dir;
  std::string path = dir.file("job.toml");
  std::ofstream(path) << "[job]\nattention = 2\n\n[model]\nhidden = -5\n";
  try {
    load_config(path);
    FAIL() << "accepted hidden = -5";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              path + ":5:1: [model] hidden: expected a positive integer, got -5");
  }
}

// [hosts]: where each instance runs (its listen address) and its NIC, one value for a role or one
// per instance, defaulting to [transport]; each instance's engine takes its own entries.
TEST(ConfigTest, HostsGiveEachInstanceItsAddressAndNic) {
  JobConfig c = parse_config(R"(
[job]
attention = 2
ffn = 3
[transport]
listen_host = "10.0.0.9"
rdma_device = "mlx5_0"
[hosts]
attention = ["10.0.0.1", "10.0.0.2"]
ffn_nic = ["mlx5_1", "mlx5_2", "mlx5_3"]
)",
                             "job.toml");
  EXPECT_EQ(c.hosts.attention, (std::vector<std::string>{"10.0.0.1", "10.0.0.2"}));
  EXPECT_EQ(c.hosts.ffn, (std::vector<std::string>{"10.0.0.9", "10.0.0.9", "10.0.0.9"}));
  EXPECT_EQ(c.hosts.attention_nic, (std::vector<std::string>{"mlx5_0", "mlx5_0"}));
  EXPECT_EQ(engine_spec(c, Role::attention, 1).transport.listen_host, "10.0.0.2");
  EXPECT_EQ(engine_spec(c, Role::ffn, 2).transport.listen_host, "10.0.0.9");
  EXPECT_EQ(engine_spec(c, Role::ffn, 2).transport.rdma_device, "mlx5_3");
  EXPECT_EQ(error_of("[job]\nattention = 2\n[hosts]\nattention = [\"10.0.0.1\"]\n"),
            "job.toml:4:1: [hosts] attention: 1 host address(s) for 2 A instance(s) ([job] "
            "attention = 2); give one per instance or a single string for all");
  EXPECT_EQ(error_of("[hosts]\nffn = \"10.0.0.1/24\"\n"),
            "job.toml:2:1: [hosts] ffn: bad host address \"10.0.0.1/24\" (expected a host name or "
            "an address)");
  EXPECT_EQ(error_of("[hosts]\nffn_nics = \"mlx5_0\"\n"),
            "job.toml:2:1: unknown key [hosts] ffn_nics (did you mean ffn_nic?)");
}

TEST(ConfigTest, ToTomlReadsBackToTheSameConfig) {
  JobConfig c;
  c.job.attention = 3;
  c.job.gather = Gather::eager;
  c.job.topology = JobTopology::groups;
  c.job.heartbeat = std::chrono::milliseconds(750);
  c.job.gather_window = std::chrono::milliseconds(7);
  c.model.experts = 6;
  c.model.a2f_dtype = Dtype::fp16;
  c.devices.attention = {"cpu:0", "asic_stub:1", "cpu:0"};  // not uniform: printed as an array
  c.hosts.attention = {"10.0.0.1", "10.0.0.2", "10.0.0.1"};
  c.hosts.attention_nic = {"", "mlx5_1", ""};
  c.plugins.paths = {"/tmp/a \"quoted\" path\\x.so"};
  c.plugins.options["asic_stub"] = "copy_latency_us=2";
  c.transport.kind = TransportKind::tcp;
  c.tracing.straggler_factor = 2.0;
  c.tracing.chrome_trace = "trace\tfile.json";
  c.affinity.comm_cpus = {0, 5};
  std::string text = to_toml(c);
  EXPECT_NE(text.find("straggler_factor = 2.0\n"), std::string::npos) << text;
  EXPECT_NE(text.find("attention = [\"cpu:0\", \"asic_stub:1\", \"cpu:0\"]"), std::string::npos)
      << text;
  EXPECT_EQ(parse_config(to_toml(c), "effective.toml"), c) << text;
  EXPECT_EQ(parse_config(to_toml(JobConfig{}), "default.toml"), JobConfig{});
}

TEST(ConfigExamples, EveryExampleFileParsesAndRoundTrips) {
  size_t count = 0;
  for (const auto& entry : std::filesystem::directory_iterator(HETMESH_EXAMPLE_CONFIG_DIR)) {
    if (entry.path().extension() != ".toml") continue;
    SCOPED_TRACE(entry.path().string());
    JobConfig c = load_config(entry.path().string());
    EXPECT_EQ(c.devices.attention.size(), static_cast<size_t>(c.job.attention));
    EXPECT_EQ(c.devices.ffn.size(), static_cast<size_t>(c.job.ffn));
    EXPECT_EQ(parse_config(to_toml(c), "effective.toml"), c);
    ++count;
  }
  EXPECT_GE(count, 7u);
}

TEST(ConfigExamples, StepMeshShape) {
  JobConfig c = load_config(std::string(HETMESH_EXAMPLE_CONFIG_DIR) + "/stepmesh-2a2f.toml");
  EXPECT_EQ(c.model.tokens, 128);
  EXPECT_EQ(c.model.hidden, 7168);
  EXPECT_EQ(c.model.a2f_dtype, Dtype::fp8);
  EXPECT_EQ(c.model.f2a_dtype, Dtype::bf16);
  EXPECT_EQ(c.job.micro_batches, 3);
  JobConfig mixed =
      load_config(std::string(HETMESH_EXAMPLE_CONFIG_DIR) + "/2a2f-cpu-asic_stub-ipc.toml");
  EXPECT_EQ(mixed.devices.ffn, (std::vector<std::string>{"asic_stub:0", "asic_stub:1"}));
  EXPECT_EQ(mixed.plugins.options.at("asic_stub"), "copy_bandwidth_gbps=32;copy_latency_us=2");
}

// A job folder is new every time, even for the same process: a folder left by a killed process
// whose pid came back (its job.secret inside) once made the next launcher on that pid refuse to
// start ("job secret file ...: File exists").
TEST(JobFolderTest, EveryCallMakesANewPrivateFolderEvenForTheSamePid) {
  test::TempDir tmp;
  const char* before = std::getenv("TMPDIR");
  std::string saved = before ? before : "";
  ::setenv("TMPDIR", tmp.path().c_str(), 1);
  std::filesystem::path first = make_job_folder("hetmesh-demo");
  std::ofstream(first / "job.secret") << "left by a killed launcher";
  std::filesystem::path second = make_job_folder("hetmesh-demo");
  before ? ::setenv("TMPDIR", saved.c_str(), 1) : ::unsetenv("TMPDIR");
  EXPECT_NE(first, second);
  EXPECT_EQ(second.parent_path(), tmp.path());
  EXPECT_TRUE(std::filesystem::is_empty(second));
  EXPECT_EQ(std::filesystem::status(second).permissions() & std::filesystem::perms::all,
            std::filesystem::perms::owner_all);
  EXPECT_EQ(second.filename().string().rfind(fmt::format("hetmesh-demo-{}-", getpid()), 0), 0u)
      << second;
}

}  // namespace
}  // namespace hetmesh::afd
