// The job configuration of the AFD engine: one TOML file (read with TOML++), validated as a whole
// before anything starts. Every key has a default, so an empty file is a valid 1A1F job on cpu:0
// over the automatically chosen transport. The schema, with examples, is in examples/configs/.
//
// Errors: every problem is an Error(HM_ERR_INVALID_ARGUMENT) whose message starts with
// "<file>:<line>:<column>: " and names the key path, e.g.
//   2a2f.toml:12:1: [model] hidden: expected an integer in 1..1048576, got -5
//   2a2f.toml:3:1: unknown key [job] micro_batchs (did you mean micro_batches?)
// Unknown keys and tables are errors, so a typo never silently falls back to a default.
// Sizes are capped so that nothing the engine derives can overflow: a micro-batch at 4 GiB each
// way, top_k at 1024, and all the slots of one A or F instance at 256 GiB.
// Plugin names in device selectors are checked later, by the loader, not here.
#pragma once

#include <hetmesh/afd/engine.hpp>
#include <hetmesh/transport/transport.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

// Exported from the library, which hides every other symbol (core/README.md, "Exports").
#pragma GCC visibility push(default)

namespace hetmesh::afd {

// Element types on the wire. Sizes: fp8 1, bf16 2, fp16 2, fp32 4, int32 4, int64 8 bytes. The
// hidden states travel as one of the first four; an extra A2F tensor as any.
enum class Dtype { fp8, bf16, fp16, fp32, int32, int64 };
size_t dtype_bytes(Dtype dtype);
const char* to_string(Dtype dtype);  // "fp8", ...

// [job] gather: how an F instance gathers a micro-batch (Gather, engine.hpp).
const char* to_string(Gather gather);  // "all", "eager"
// [job] topology: which F instances each A sends to (JobTopology, engine.hpp).
const char* to_string(JobTopology topology);  // "all", "groups", "map"

// [transport] kind: a transport, or "auto" (nullopt): ipc when every peer shares this host, else
// verbs when an RDMA device is usable, else tcp (decided by choose_transport, which knows where the
// peers are).
const char* to_string(std::optional<TransportKind> kind);  // "auto" or the kind's name

// The key-value store used for rendezvous: the embedded TCP store, or etcd.
enum class RendezvousKind { tcp, etcd };
const char* to_string(RendezvousKind kind);  // "tcp", "etcd"

struct JobSection {
  int attention = 1;                        // A instances, 1..1024
  int ffn = 1;                              // F instances, 1..1024
  int micro_batches = 3;                    // in flight per A at once, 1..64
  int layers = 4;                           // demo model layers, 1..1024
  Gather gather = Gather::all;              // "all" | "eager"
  JobTopology topology = JobTopology::all;  // "all" | "groups" (attention % ffn == 0) | "map"
  // ffns_of, with "map": [a] the Fs A a sends to (EngineSpec::ffns_of), e.g. [[0], [0, 1], [1]]
  std::vector<std::vector<int>> ffns_of;
  int queue_depth = 8;                       // round trips in flight per micro-batch, 1..64
  std::chrono::milliseconds timeout{10000};  // timeout_ms: bound on every wait for data, >= 1
  // join_timeout_ms: how long joining the job may take (the store, every peer's registration and
  // connection); io_timeout_ms: a transport write whose bytes stop moving this long fails. Both
  // default to timeout_ms.
  std::chrono::milliseconds join_timeout{10000};
  std::chrono::milliseconds io_timeout{10000};
  // heartbeat_ms: a peer silent this long (no data, no heartbeat) is hung, even when no data is
  // due; >= 100. Heartbeats go out every quarter of it. An F contains a hung A as a lost one.
  std::chrono::milliseconds heartbeat{5000};
  // gather_window_ms: gather-all serves a part that waited this long for the other As without
  // them; 1..timeout_ms. Breaks the wait cycles a retried or replaced instance can leave between
  // F instances (docs/failures.md).
  std::chrono::milliseconds gather_window{50};
  bool operator==(const JobSection&) const = default;
};

// [model.a2f_tensors] NAME = { dtype = "...", columns = N }: a tensor every push carries beside
// the tokens and routing, `columns` elements of `dtype` a token (router logits: the model's
// experts of its gate's dtype). Names are [a-z0-9_], at most 32, none of tokens, routing,
// experts, weights or output.
struct TensorSection {
  std::string name;
  Dtype dtype = Dtype::fp32;
  int columns = 1;  // 1..1048576; a micro-batch of them at most 4 GiB
  bool operator==(const TensorSection&) const = default;
};

// The defaults are a tiny MoE that runs in well under a second on a CPU; see
// examples/configs/stepmesh-2a2f.toml for StepMesh's production shape.
struct ModelSection {
  int tokens = 32;   // tokens per micro-batch per A, 1..1048576
  int hidden = 256;  // hidden size, 1..1048576
  int experts = 4;   // total experts, split across the F instances (>= ffn)
  // Experts per token, 0..experts and at most 1024: the routing each push carries. 0: none (an F
  // that computes the gate itself, from the tokens or from router logits in a2f_tensors).
  int top_k = 2;
  Dtype a2f_dtype = Dtype::fp8;            // activations sent A -> F
  Dtype f2a_dtype = Dtype::bf16;           // partial results sent F -> A
  std::vector<TensorSection> a2f_tensors;  // in name order, at most 6
  bool operator==(const ModelSection&) const = default;
};

// Device selectors, normalised to "name:index" ("cpu" in the file becomes "cpu:0"). The file may
// give one selector for all instances of a role or an array with one per instance; here there is
// always exactly one per instance, indexed by rank.
struct DevicesSection {
  std::vector<std::string> attention{"cpu:0"};  // attention[rank]
  std::vector<std::string> ffn{"cpu:0"};        // ffn[rank]
  bool operator==(const DevicesSection&) const = default;
};

// Where each instance runs, for a job across hosts described by one file: its address, which its
// transport listens on (tcp, the verbs out-of-band channel), and its RDMA NIC. One value for all
// instances of a role, or an array with one per instance; here always one per instance, indexed
// by rank. Absent: [transport] listen_host and rdma_device, for every instance.
struct HostsSection {
  std::vector<std::string> attention{"127.0.0.1"}, ffn{"127.0.0.1"};  // addresses
  std::vector<std::string> attention_nic{""}, ffn_nic{""};            // "" = the first
  bool operator==(const HostsSection&) const = default;
};

struct PluginsSection {
  // Extra plugin .so files (PluginLoadOptions::explicit_paths), as written: relative paths are
  // relative to the working directory.
  std::vector<std::string> paths;
  // Options per plugin name, in hm_host_api.options form "k=v;k=v" (PluginLoadOptions::
  // plugin_options). A TOML table in the file is converted to that form, its keys sorted.
  std::map<std::string, std::string> options;
  bool operator==(const PluginsSection&) const = default;
};

struct TransportSection {
  std::optional<TransportKind> kind;      // "auto" (nullopt) | "ipc" | "tcp" | "verbs" | "fabric"
  std::string listen_host = "127.0.0.1";  // where tcp and the verbs out-of-band channel listen
  std::string rdma_device;                // verbs: "" = the first active RDMA device
  int gid_index = -1;                     // verbs: -1 = the first IPv4-mapped GID
  std::string provider = "auto";          // fabric: the libfabric provider (TransportOptions)
  // Rails (TransportOptions::rails): the NICs every instance stripes over, RDMA devices for verbs
  // and local addresses for tcp; {"auto"} (nics = "auto"): verbs, every RDMA NIC on its device's
  // NUMA node. Empty: one NIC (rdma_device, listen_host).
  std::vector<std::string> nics;
  // ipc: the staging ring between two plugins' device memories (TransportOptions says how).
  int staging_slots = 4;
  int64_t staging_slot_kib = 2048;
  bool operator==(const TransportSection&) const = default;
};

struct RendezvousSection {
  RendezvousKind kind = RendezvousKind::tcp;  // "tcp": the embedded store; "etcd"
  // tcp: host:port of the store. Port 0 (the default) lets the hosting process pick a free port
  // and report it, which is what a single-host job wants; multi-node jobs name a fixed port.
  // etcd: its client URL, http://host:port on loopback or https://host:port (default
  // http://127.0.0.1:2379; TLS files in HETMESH_ETCD_CA_FILE, _CERT_FILE, _KEY_FILE). Keys go
  // under "hetmesh/<job>/".
  std::string address = "127.0.0.1:0";
  // The job secret's file (job_secret.hpp): what every host of a job across hosts reads. Empty: a
  // launcher that hosts the store makes one for the job.
  std::string secret_file;
  bool operator==(const RendezvousSection&) const = default;
};

struct TracingSection {
  bool enabled = true;                              // record per-operation timestamps
  std::string chrome_trace = "hetmesh-trace.json";  // Chrome trace JSON path; "" = do not write
  double straggler_factor = 1.5;  // a peer slower than this times the median is a straggler, > 1
  bool operator==(const TracingSection&) const = default;
};

// [metrics]: the Prometheus endpoint of each instance (docs/metrics.md).
struct MetricsSection {
  // "host:port": instance i of the job (As, then Fs) serves http://host:(port + i)/metrics, or,
  // started by a launcher (hetmesh run), port + its local rank; port 0: each a free port of its
  // own (logged). Beyond loopback only with the job's secret, which
  // every scrape proves with a bearer token (hetmesh config --metrics-token). Empty: not served.
  std::string listen;
  bool operator==(const MetricsSection&) const = default;
};

struct AffinitySection {
  std::vector<int> comm_cpus;  // CPUs for the comm threads, in order of creation; empty = unpinned
  int poller_cpu = -1;         // CPU of the transport's completion poller; -1 = unpinned
  bool operator==(const AffinitySection&) const = default;
};

struct JobConfig {
  JobSection job;
  ModelSection model;
  DevicesSection devices;
  HostsSection hosts;
  PluginsSection plugins;
  TransportSection transport;
  RendezvousSection rendezvous;
  TracingSection tracing;
  MetricsSection metrics;
  AffinitySection affinity;
  bool operator==(const JobConfig&) const = default;
};

// Reads and validates a config file: a regular file of at most 4 MiB (read_bounded_file, so a
// FIFO or /dev/zero is refused at once). A file that cannot be read is an Error(INVALID_ARGUMENT)
// naming the path and the reason.
JobConfig load_config(const std::string& path);
// Parses and validates config text; `source_name` is the file name used in messages.
JobConfig parse_config(std::string_view text, const std::string& source_name);
// The effective configuration as TOML that parse_config reads back to an equal JobConfig.
std::string to_toml(const JobConfig& config);

}  // namespace hetmesh::afd

#pragma GCC visibility pop
