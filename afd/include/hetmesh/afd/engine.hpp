// The AFD engine: attention instances (A) send each micro-batch's tokens, expert routing and any
// other tensors the job declares to the FFN instances (F) they map to; each F writes its result
// straight back into A's pre-registered slot for that micro-batch. Any A talks to any F.
//
// Every buffer is allocated and registered at construction: per micro-batch, A owns one send slot
// and one receive slot per F; F owns, per micro-batch, one row space of each A2F tensor that its
// As' rows land in (each A in a window of its own, or back to back where the As say where:
// PushOptions::row_offset), one of outputs, and the headers per (A, micro-batch). A micro-batch
// may have several round trips queued (a stage's next layers, pushed before the answers are in):
// they go out in order, each only once every F answered the one before (that is the credit), and
// every header is bounds-checked against the slot table on receipt. The hot path allocates
// nothing.
//
// Threads: each engine runs one comm thread that polls the transport, and one sender thread per
// peer that waits for a micro-batch's readiness and posts its writes to that peer, so the writes
// to different peers never queue behind each other. The caller's thread only enqueues work and
// waits. Every wait has a timeout; a dead peer or a timeout is an Error naming the peer, never an
// abort.
//
// Failures are contained and recoverable (docs/failures.md). A peer that dies, hangs (silent past
// the heartbeat) or is replaced is *lost*: an A fails only the micro-batches that peer owed, with
// Error(kStatusPeerLost) naming it, and keeps its other connections; an F serves the As still in
// the job. A replacement (a new process with the same role and rank, started like the first)
// rejoins the running job under a new epoch through the store; the engines connect to it on their
// own, refuse the traffic of the epoch it replaced, and the application goes on: an A waits for it
// with wait_for_peers() and pushes its failed micro-batches again (or drops them).
#pragma once

#include <hetmesh/core/device.hpp>
#include <hetmesh/core/error.hpp>
#include <hetmesh/transport/transport.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

// Exported from the library, which hides every other symbol (core/README.md, "Exports").
#pragma GCC visibility push(default)

namespace hetmesh {
class KeyValueStore;
}

namespace hetmesh::afd {

enum class Role { attention, ffn };
const char* to_string(Role role);  // "attention", "ffn"
// How an F instance gathers a micro-batch.
enum class Gather {
  all,   // wait for every A instance's tokens, then run the experts once
  eager  // serve each A as it arrives, so one slow A does not stall the others
};

// Which F instances an A sends each micro-batch to.
enum class JobTopology {
  all,     // every A to every F, each F answering a partial result (an expert split) that the A
           // sums
  groups,  // A a to F a / (attention / ffn) alone, which answers its full result: F k serves As
           // k·r … k·r+r−1, r = attention / ffn (vLLM's AFD mapping; attention % ffn == 0)
  map      // A a to the Fs EngineSpec::ffns_of[a] names, each answering a partial result that the
           // A sums (one F: the full result)
};

// The A2F tensors of a job, by index: every push carries the tokens (hidden states) and the routing
// ([top_k] of {int32 expert, float weight} a token; none when top_k is 0), then the job's extra
// tensors (EngineSpec::a2f_extra) in their order.
constexpr int kTokensTensor = 0;
constexpr int kRoutingTensor = 1;
constexpr int kMaxA2fTensors = 8;

// A tensor an A sends beside its tokens and routing, a row per token (router logits, the scales of
// fp8 tokens, the top-k ids a gate on the attention side computed): its name, for the application,
// and its bytes a row.
struct ExtraTensor {
  std::string name;
  uint32_t row_bytes = 0;
  bool operator==(const ExtraTensor&) const = default;
};

struct EngineSpec {
  Role role = Role::attention;
  int rank = 0;       // index within the role
  int attention = 1;  // number of A instances
  int ffn = 1;        // number of F instances
  int micro_batches = 3;
  uint32_t tokens = 128;  // per micro-batch per A (the most a push may carry)
  uint32_t hidden = 7168;
  uint32_t top_k = 8;
  uint32_t a2f_bytes = 1;  // bytes per hidden element, A to F (fp8 = 1)
  uint32_t f2a_bytes = 2;  // bytes per hidden element, F to A (bf16 = 2)
  // Tensors every push carries after the tokens and the routing, at most kMaxA2fTensors - 2.
  std::vector<ExtraTensor> a2f_extra;
  // Round trips a micro-batch may have in flight at once (pushed, not yet waited for): the host
  // can push a micro-batch's next layer before the previous answer is in (push_pull).
  int queue_depth = 8;
  Gather gather = Gather::all;
  JobTopology topology = JobTopology::all;
  // JobTopology::map: [a] the Fs A a sends to, each in 0..ffn-1, none twice, at least one; every F
  // served by at least one A (check_shape refuses others).
  std::vector<std::vector<int>> ffns_of;
  // A `a` sends its micro-batches to F `f` (and waits for its answer). JobTopology::groups with an
  // attention count that is not a multiple of ffn is refused by the engines.
  bool sends(int a, int f) const {
    if (topology == JobTopology::all) return true;
    if (topology == JobTopology::groups) return f == a / group_size();
    const auto i = static_cast<size_t>(a);
    return i < ffns_of.size() &&
           std::find(ffns_of[i].begin(), ffns_of[i].end(), f) != ffns_of[i].end();
  }
  // How many As F `f` serves (every A, its group, or those whose map names it), and A `a`'s place
  // among them: the window of f's row spaces that a's rows land in unless its push names another
  // row (PushOptions::row_offset).
  int attention_of(int f) const {
    if (topology == JobTopology::all) return attention;
    if (topology == JobTopology::groups) return group_size();
    int count = 0;
    for (int a = 0; a < attention; ++a)
      count += sends(a, f);
    return count;
  }
  int window_of(int a, int f) const {
    if (topology == JobTopology::all) return a;
    if (topology == JobTopology::groups) return a % group_size();
    int before = 0;
    for (int b = 0; b < a; ++b)
      before += sends(b, f);
    return before;
  }
  // Rows of each row space of F `f`'s micro-batch: a window of `tokens` for each of its As.
  uint64_t ffn_rows(int f) const {
    return uint64_t{tokens} * static_cast<uint64_t>(attention_of(f));
  }
  // The bound on the engine's own waits for data: the destructor's, and the default the
  // launcher's callers use for wait() and get_batch().
  std::chrono::milliseconds timeout{10000};
  // How long joining may take: the store's answers, every peer's registration and connection (an
  // A and an F that load their weights minutes apart); a replacement's rejoin too. And the
  // transport's bound on a write whose bytes stop moving (TransportOptions::io_timeout). Unset:
  // `timeout`.
  std::optional<std::chrono::milliseconds> join_timeout, io_timeout;
  std::chrono::milliseconds join_deadline() const { return join_timeout.value_or(timeout); }
  // A peer silent this long (no data, no heartbeat) is hung: the engine fails naming it, even
  // when no data is due. The comm thread sends each peer a heartbeat every quarter of it.
  std::chrono::milliseconds heartbeat{5000};
  // Gather::all serves a part that waited this long for the other As without them. Pairing is by
  // arrival order per A, so an A that pushes a failed micro-batch again, or a replacement that
  // joins mid-run, can leave two F instances each waiting for a part the other holds up; the
  // window ends such a wait (and realigns the pairing) instead of the job's timeout.
  std::chrono::milliseconds gather_window{50};
  std::string job = "hetmesh";  // rendezvous namespace
  TransportOptions transport;
  // Where this instance serves its Prometheus metrics ([metrics] listen, docs/metrics.md):
  // "host:port", the port plus metrics_index (port 0: any free one); beyond loopback only with the
  // job's secret (transport.secret). Empty: nowhere. metrics_index: the instance's place among
  // those of its host (a launcher's local rank: one port for every pod of a Kubernetes job); -1:
  // its index in the job, As then Fs, unique on any host.
  std::string metrics_listen;
  int metrics_index = -1;
  // Pin the comm thread to the first of these and the per-peer sender threads to the next ones
  // (wrapping around), if any.
  std::vector<int> comm_cpus;

  // Sizes in bytes. The config's caps keep them far from 64 bits; a spec built otherwise that
  // would wrap gets Error(INVALID_ARGUMENT) instead of a small, wrong size.
  // Routing entries are (int32 expert, float weight) pairs: top_k per token.
  uint64_t routing_bytes_per_token() const { return uint64_t{top_k} * 8; }
  // The A2F tensors in their order: how many, and the bytes of a row of each (0 past the count).
  int a2f_tensors() const { return 2 + static_cast<int>(a2f_extra.size()); }
  uint64_t a2f_row_bytes(int tensor) const {
    if (tensor == kTokensTensor) return uint64_t{hidden} * a2f_bytes;
    if (tensor == kRoutingTensor) return routing_bytes_per_token();
    const auto extra = static_cast<size_t>(tensor - 2);
    return extra < a2f_extra.size() ? a2f_extra[extra].row_bytes : 0;
  }
  // "tokens", "routing", then the extra tensors' names.
  std::string_view a2f_tensor_name(int tensor) const {
    if (tensor == kTokensTensor) return "tokens";
    if (tensor == kRoutingTensor) return "routing";
    const auto extra = static_cast<size_t>(tensor - 2);
    return extra < a2f_extra.size() ? std::string_view(a2f_extra[extra].name) : "?";
  }
  uint64_t a2f_bytes_per_token() const {  // < 2^64: at most 8 tensors of 32 x 32 bits
    uint64_t sum = 0;
    for (int t = 0; t < a2f_tensors(); ++t)
      sum += a2f_row_bytes(t);
    return sum;
  }
  uint64_t f2a_bytes_per_token() const { return uint64_t{hidden} * f2a_bytes; }
  // A block of `rows` rows of every A2F tensor, one tensor after another, each starting on a
  // kA2fAlignment boundary (a device faults on a misaligned element; the tensors' rows keep their
  // elements aligned from there): where tensor `tensor` starts in it, and its bytes. An A's send
  // slot of a micro-batch is a block of `tokens` rows, F f's row spaces of one a block of
  // ffn_rows(f).
  static constexpr uint64_t kA2fAlignment = 256;
  uint64_t a2f_tensor_offset(uint64_t rows, int tensor) const {
    uint64_t at = 0;
    for (int t = 0; t < tensor; ++t)
      at = aligned(checked_sum(at, checked_product(rows, a2f_row_bytes(t))));
    return at;
  }
  uint64_t a2f_block_bytes(uint64_t rows) const { return a2f_tensor_offset(rows, a2f_tensors()); }
  uint64_t a2f_slot_bytes() const { return a2f_block_bytes(tokens); }
  uint64_t f2a_slot_bytes() const { return checked_product(tokens, f2a_bytes_per_token()); }
  // Every payload slot this instance allocates (headers aside): an A holds one A2F slot and one
  // F2A slot per F for each micro-batch; an F, per micro-batch, row spaces of ffn_rows(rank) rows
  // of every A2F tensor and of its outputs.
  uint64_t instance_slot_bytes() const {
    if (role == Role::attention)
      return checked_product(micro_batches,
                             checked_sum(a2f_slot_bytes(), checked_product(ffn, f2a_slot_bytes())));
    const uint64_t rows = ffn_rows(rank);
    return checked_product(
        micro_batches,
        checked_sum(a2f_block_bytes(rows), checked_product(rows, f2a_bytes_per_token())));
  }

 private:
  int group_size() const { return std::max(1, attention / std::max(1, ffn)); }
  static uint64_t checked_product(uint64_t a, uint64_t b) {
    uint64_t product;
    if (__builtin_mul_overflow(a, b, &product)) overflow(a, b, "x");
    return product;
  }
  static uint64_t checked_sum(uint64_t a, uint64_t b) {
    uint64_t sum;
    if (__builtin_add_overflow(a, b, &sum)) overflow(a, b, "+");
    return sum;
  }
  static uint64_t aligned(uint64_t bytes) {
    return checked_sum(bytes, kA2fAlignment - 1) & ~(kA2fAlignment - 1);
  }
  [[noreturn]] static void overflow(uint64_t a, uint64_t b, const char* op) {
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("engine spec: slot size {} {} {} overflows 64 bits", a, op, b));
  }
};

using Clock = std::chrono::steady_clock;

// Timestamps of one A round trip, for the metrics (ns on A's clock, except the F-side ones, which
// are on each F's own clock and only ever subtracted from each other).
struct RoundTrip {
  int micro_batch = 0;
  uint64_t sequence = 0;
  // posted: A's writes to the first F started; completed: the last F's result arrived.
  int64_t attention_start = 0, push_start = 0, ready = 0, posted = 0, completed = 0,
          wait_returned = 0;
  struct PerFfn {
    int64_t received_at_a = 0;  // A's clock: F2A header arrived
    int64_t f_received = 0, f_batch_ready = 0, f_compute_start = 0, f_compute_end = 0,
            f_posted = 0;     // F's clock
    int64_t posted_at_a = 0;  // A's clock: A's writes to this F started
  };
  std::vector<PerFfn> ffn;
};

// How an engine learns that a micro-batch's data is ready to send: at once (the default), once
// the work queued so far on `stream` has completed, or once the engine's own ready word for the
// micro-batch (AttentionEngine::ready_flag, written by a compute stream with stream_write_value32)
// reaches `value` (cyclic GEQ). The engine records an event of its own on `stream` during the call,
// so the stream need only live through the call: the engine never touches a caller's object after
// the call that named it has returned.
struct ReadySignal {
  const Stream* stream = nullptr;
  bool flag = false;
  uint32_t value = 0;
};

// One A2F tensor of a push (PushOptions::tensors): where its rows come from, and how many.
struct PushTensor {
  // The application's own memory ([rows][row bytes]) in place of the engine's slot (null).
  const void* from = nullptr;
  // Rows sent, 0..EngineSpec::tokens; unset: the push's `tokens` (the tokens tensor always sends
  // exactly those). 0 leaves the tensor out of this push (a dense layer's router logits).
  std::optional<uint32_t> rows;
};

// How AttentionEngine::push_pull sends a micro-batch.
struct PushOptions {
  ReadySignal ready;               // when the slot's data is ready (default: at once)
  uint64_t tag = 0;                // handed to each F with the part (Batch), e.g. the layer
  int64_t attention_start_ns = 0;  // for the metrics: when this micro-batch's attention began
  // Per A2F tensor, by index (kTokensTensor, kRoutingTensor, then the job's extra tensors): an
  // entry for each, or none at all (every tensor from its slot, `tokens` rows).
  std::span<const PushTensor> tensors;
  // For each F (ffn entries, read during the call; a null entry is that F's result slot), where
  // its result lands ([tokens][hidden] in the F2A dtype) in the application's own memory.
  //
  // The application's buffers (here and in `tensors`): memory of the engine's device (or host
  // memory it can use), unchanged until the round trip is waited for, and long-lived: the engine
  // registers each allocation at first sight and keeps it until it ends (a row slice of a
  // registered tensor costs a lookup; register_buffer does it ahead). The engine copies nothing.
  std::span<void* const> results_into;
  // Where this A's rows land in each F's row spaces of the micro-batch (EngineSpec::ffn_rows(f)
  // rows): unset, the A's own window there (window_of(rank, f) x tokens); set, that row at every F
  // it sends to, so that As that
  // agree on their offsets (A i at the sum of the rows of the As before it, from a step's token
  // counts every A knows) land back to back and the F sees one tensor (Batch::packed). For
  // gather = all (refused for eager). The As must not land on a part the F holds and has not
  // given to respond() yet (in a correct job, each A pushes every micro-batch of a step, 0 rows
  // for an idle one, at that step's offsets): an F that finds another A's rows there fails with a
  // protocol error naming both (the bytes have landed over them).
  std::optional<uint32_t> row_offset;
  // Rows of the answer each F writes back ([rows][hidden] in the F2A dtype, 0..EngineSpec::tokens,
  // from the part's row_offset of the F's output rows); unset: the push's `tokens`. For answers
  // that are not a row per token sent: an F that returns its shard of the rows, or StepMesh's
  // pulls, whose size is independent of the push's (hetmesh.stepmesh).
  std::optional<uint32_t> result_rows;
};

// The registration that holds an application's buffer (register_buffer): its whole range (the
// buffer's allocation as its plugin knows it, or the pages of plain host memory around it), which
// stays registered until the engine ends, and whether this call made it.
struct RegisteredBuffer {
  const void* base = nullptr;
  uint64_t bytes = 0;
  bool fresh = false;
};

// What an engine moved, by where the bytes were: the application's buffers (PushOptions, an F's
// part outputs) or the engine's own slots; and how many of them the transport copied through host
// staging buffers on this side, because it could not reach that memory directly (the log says
// why, once per buffer).
struct DataCounters {
  uint64_t caller_bytes = 0;    // sent from or received into the application's buffers
  uint64_t slot_bytes = 0;      // sent from or received into the engine's slots
  uint64_t staged_bytes = 0;    // of both, through host staging buffers (one copy each)
  uint64_t caller_buffers = 0;  // the application's allocations registered
};

// What the host learns of the round trips its device triggered (AttentionEngine::arm_device,
// FfnEngine::serve_device): the device rings and waits on words, so the host asks here which round
// trips failed and why.
struct DeviceTrips {
  uint64_t rung = 0;       // doorbells the engine took (A: pushes; F: answers)
  uint64_t completed = 0;  // A: answered by every F; F: batches raised for the stream
  uint64_t failed = 0;     // settled without their answers or never sent (a peer lost, the end)
  // Why, the latest DeviceTripLog::kMaxFailures since the last call: "micro-batch 0 (sequence
  // 12): ffn 1 lost: ...".
  std::vector<std::string> failures;
  // Why the engine answers every ring at once from now on (it failed, was finished, or every A
  // is done); empty while it serves.
  std::string ended;
};

// A side-band message from a peer (send_message): a few KiB of the application's, e.g. a step's
// token counts.
struct Message {
  Role role = Role::ffn;  // the sender's
  int rank = 0;
  std::vector<uint8_t> bytes;
};

// A peer as an engine sees it now.
struct PeerStatus {
  Role role = Role::ffn;
  int rank = 0;
  uint64_t epoch = 0;  // the incarnation reached: 1 for the first, higher for replacements
  enum class State { live, left, lost } state = State::live;
  std::string reason;  // why it is lost: "ffn 1 lost: ...", "ffn 1 hung: ..."
};
const char* to_string(PeerStatus::State state);

// A change in an engine's peers as the engine saw it: an incarnation lost, or a replacement that
// joined. What the trace and the metrics mark (afd/metrics.hpp).
struct PeerChange {
  int64_t at_ns = 0;  // now_ns()
  Role role = Role::ffn;
  int rank = 0;
  uint64_t epoch = 0;                                 // the incarnation lost, or the replacement's
  PeerStatus::State state = PeerStatus::State::lost;  // lost, or live: the replacement is in
  std::string reason;                                 // why it was lost
};

// What an engine saw of its peers since it started: their changes (the latest 1024) and the
// events of superseded incarnations it dropped (an old epoch's traffic, refused).
struct PeerHistory {
  std::vector<PeerChange> changes;
  uint64_t stale_events = 0;
};

// The attention side.
class AttentionEngine {
 public:
  // Allocates and registers every slot on `device`, publishes them through `store`, connects to
  // every F and waits for the world (bounded by spec.timeout).
  AttentionEngine(const EngineSpec& spec, const Device& device, KeyValueStore& store);
  // Without finish(), the F instances are told this A ended after a failure ("quit"). No other
  // thread may be inside a call of the engine when it is destroyed (finish() first ends them).
  ~AttentionEngine();

  // This A is done: every F is told so ("leave"; an F's get_batch ends once every A has left or
  // was lost) and the engine stops; push_pull and wait are refused from then on
  // (Error(kStatusClosed)), and a wait() in another thread ends at once with that error. Call it
  // after the last wait: round trips still in flight are abandoned. An engine that had failed says
  // "quit" instead, and finish() throws its error.
  void finish();

  // Where the caller (or its compute stream) puts micro-batch `mb`'s A2F tensor `tensor`
  // ([tokens][row bytes]; device memory): tokens(mb) ([tokens][hidden] in the A2F dtype),
  // routing(mb) ([tokens][top_k] of {int32 expert, float weight}; null when top_k is 0), then the
  // job's extra tensors. Null for a tensor the job does not have.
  void* tensor(int micro_batch, int tensor) const;
  void* tokens(int micro_batch) const { return tensor(micro_batch, kTokensTensor); }
  void* routing(int micro_batch) const { return tensor(micro_batch, kRoutingTensor); }
  // Where F `ffn`'s partial result for micro-batch `mb` lands ([tokens][hidden], F2A dtype).
  void* result(int micro_batch, int ffn) const;

  using Ready = ReadySignal;
  using Push = PushOptions;

  using Handle = uint64_t;
  // Sends micro-batch `mb` (its first `tokens` rows, 0 for an idle rank) to its Fs once ready;
  // the results arrive in result(mb, *). Does not wait: up to spec.queue_depth round trips of mb
  // may be in flight, and each goes to an F only once that F answered the one before, so a host
  // can push a stage's next layers ahead. The slots are shared by a micro-batch's queue: a queued
  // push's readiness (its stream event or flag) must come after the previous answer was read and
  // the new tokens written, as it does on one stream that waits for the answer (stream_wait)
  // before computing the next layer. Throws Error(INVALID_ARGUMENT) when mb's queue is full, and
  // Error(kStatusPeerLost) naming the F while an F is lost and not replaced yet (nothing is sent:
  // wait_for_peers(), then push again, or drop the micro-batch).
  Handle push_pull(int micro_batch, uint32_t tokens, const Push& push = {});
  // Waits until every F has answered, and returns the round trip's timestamps; handles may be
  // waited for in any order. If an F was lost before it answered, waits for the others' answers,
  // then throws Error(kStatusPeerLost) naming that F: the round trip failed, and its entry is free
  // (its tokens and routing are still in tokens(mb) and routing(mb) unless a later push of mb
  // overwrote them), to push again once wait_for_peers() is true, or to drop. Throws
  // Error(TIMEOUT) naming the F that did not answer within `timeout`: the round trip is still in
  // flight, to be waited for again. Throws Error(kStatusClosed) when finish() ends the engine
  // meanwhile, and the error that ended the engine.
  RoundTrip wait(Handle handle, std::chrono::milliseconds timeout);
  // Waits until every F is in the job (none lost: each lost one was replaced). Returns false if
  // that did not happen within `timeout`; throws the error that ended the engine.
  bool wait_for_peers(std::chrono::milliseconds timeout);

  // Sends F `ffn` a side-band message (at most 60 KiB), without a slot. It goes out in order with
  // this A's pushes to that F: the F receives it (receive_message) before it gets any part pushed
  // after this call. Does not wait; throws Error(kStatusPeerLost) while that F is lost, and
  // Error(INVALID_ARGUMENT) when 64 messages to it are queued behind pushes not ready yet.
  void send_message(int ffn, std::span<const uint8_t> bytes);
  // The next message from any F, in arrival order (each F's in the order it sent them), or nullopt
  // if none came within `timeout` (0: do not wait). Throws the error that ended the engine, or
  // Error(kStatusClosed) once finished, when no message is left.
  std::optional<Message> receive_message(std::chrono::milliseconds timeout);
  // Registers [data, +bytes) of the application's memory now (as PushOptions's buffers are at
  // first sight): for buffers a captured graph will use, or to pay the registration before the
  // first step. Returns the registration that holds it. Throws as push_pull does for a buffer it
  // cannot use.
  RegisteredBuffer register_buffer(const void* data, uint64_t bytes);
  DataCounters counters() const;
  // Every F as this engine sees it now, and what it saw happen to them.
  std::vector<PeerStatus> peers() const;
  PeerHistory peer_history() const;
  // The word a compute stream writes (stream_write_value32) to say micro-batch `mb` is ready, for
  // push_pull's ReadySignal{.flag = true, .value = v}: pinned memory the engine owns. nullptr if
  // the device has no stream memory operations.
  void* ready_flag(int micro_batch) const;
  // For a device stream to wait on instead: a pinned word that the comm thread sets to the
  // handle's sequence number when all results of `micro_batch` have arrived (stream_wait_value32
  // with HM_WAIT_GEQ), and also when the round trip failed or the engine failed or ended, so no
  // device stream waits forever. nullptr if the device has no stream memory operations.
  const void* arrival_flag(int micro_batch) const;
  // Later work on `stream` (of this engine's device) waits, without the host, until `handle`'s
  // round trip has settled (arrival_flag). Settled is not succeeded: the results are valid once
  // wait(handle) returns. A stream that waits must be drained before the engine is destroyed (the
  // flag's memory goes with it). Throws Error(NOT_SUPPORTED) without stream memory operations.
  void stream_wait(Handle handle, const Stream& stream) const;

  // ---- Round trips the device triggers (docs/device-triggered.md) ----
  // With no host call per layer, for a step captured in a graph: the stream rings micro-batch
  // mb's doorbell to send it (enqueue_push_pull) and waits on its done flag for the answers
  // (enqueue_wait). Each word returns to its armed state within the round trip, so a captured
  // sequence can be replayed any number of times. Needs stream memory operations.
  //
  // Arms micro-batch `mb`: from now on each ring sends mb as push_pull(mb, tokens, push) would, the
  // token count from the ring, and raises mb's done flag once every F has answered, or at once when
  // it fails or cannot be sent (device_trips() says why). `push` is kept: its buffers are a
  // graph's, fixed for the engine's life; its ready signal must be empty (the ring is the
  // readiness: a stream rings after the work that wrote the data). A micro-batch armed is the
  // device's alone: push_pull refuses it. Arming again replaces the push. Throws as push_pull does
  // for what it refuses, Error(NOT_SUPPORTED) without stream memory operations.
  //
  // A micro-batch may hold kMaxDeviceLayouts pushes, `layout` 0 .. kMaxDeviceLayouts - 1, and each
  // ring says which it sends: a graph whose layers send from and receive into tensors of their
  // own (each layer's at its own fixed address) sends each in place, with no copy through one
  // place. A layout above 0 needs EngineSpec::tokens + 1 below kDoorbellTokens (larger jobs ring
  // tokens + 1, layout 0 alone).
  static constexpr int kMaxDeviceLayouts = 64;
  static constexpr uint32_t kDoorbellTokens = 1u << 20;  // a ring: layout x this + tokens + 1
  void arm_device(int micro_batch, const Push& push = {}, int layout = 0);
  // Enqueues on `stream` (of this engine's device): "send micro-batch mb's `layout` with `tokens`
  // rows here" (a write of layout x kDoorbellTokens + tokens + 1 to its doorbell, after the work
  // before it).
  void enqueue_push_pull(int micro_batch, uint32_t tokens, const Stream& stream, int layout = 0);
  // Enqueues "hold the stream until mb's round trip has settled" (a wait on its done flag, then
  // lowering it). Settled is not succeeded: device_trips() names the round trips that failed.
  // Ring and wait alternate per micro-batch: ring, wait, ring, wait.
  void enqueue_wait(int micro_batch, const Stream& stream);
  // The words themselves, for a kernel of the application's (pinned host memory its device maps):
  // a doorbell takes layout x kDoorbellTokens + tokens + 1, for a token count the device computes
  // (a count of kDoorbellTokens or more reads as another layout: keep it within the job's
  // tokens); done is 1 once settled.
  void* doorbell(int micro_batch) const;
  const void* done_flag(int micro_batch) const;
  // The counts and the failures since the last call.
  DeviceTrips device_trips();

  const EngineSpec& spec() const;
  // This instance's incarnation: 1 for the first of its role and rank, higher for a replacement.
  uint64_t epoch() const;
  // Bytes of memory this engine registered, by region name.
  std::vector<std::pair<std::string, uint64_t>> registered() const;
  // This instance's metrics in Prometheus' text format, as a scrape gets them (docs/metrics.md),
  // and where it serves them ("127.0.0.1:9400"; empty unless spec.metrics_listen is set).
  std::string metrics_text() const;
  std::string metrics_address() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// One micro-batch as seen by an F: the A instances it came from, with their token counts.
struct Batch {
  int micro_batch = 0;
  struct FromAttention {
    int rank = 0;
    uint64_t epoch = 0;  // the A's incarnation; a part of one that was replaced is not answered
    uint64_t sequence = 0;
    uint64_t tag = 0;  // the A's push_pull tag
    uint32_t tokens = 0;
    uint32_t row_offset = 0;  // of its rows in the F's row spaces of the micro-batch
    // Per A2F tensor: where its rows landed (device memory: the engine's row space, or the
    // application's buffer FfnEngine::receive_into named) and how many came; [kTokensTensor] is
    // [tokens][hidden] in the A2F dtype, [kRoutingTensor] [rows][top_k] of {int32, float} (null
    // when top_k is 0). Entries past the job's tensors are null.
    std::array<void*, kMaxA2fTensors> inputs{};
    std::array<uint32_t, kMaxA2fTensors> rows{};
    void* tokens_data() const { return inputs[kTokensTensor]; }
    void* routing_data() const { return inputs[kRoutingTensor]; }
    // Rows of the answer the A asked for (PushOptions::result_rows; `tokens` unless it said).
    uint32_t result_rows = 0;
    // Device memory to fill: [result_rows][hidden] F2A dtype, the engine's output rows. An
    // application that computes into a buffer of its own points this at it before respond(), which
    // then sends from there (registered as PushOptions's buffers are, and as long-lived).
    void* output = nullptr;
  };
  std::vector<FromAttention> parts;
  int64_t ready_ns = 0;
  // The parts lie back to back from row 0 in the order of `parts`, every tensor in one buffer
  // (their As pushed at agreeing row offsets): the batch is one tensor of each kind, its
  // `packed_rows` tokens at `parts[0].inputs` and `parts[0].output`. False for an empty batch.
  bool packed = false;
  uint32_t packed_rows = 0;
};

// The FFN side.
class FfnEngine {
 public:
  FfnEngine(const EngineSpec& spec, const Device& device, KeyValueStore& store);
  // As finish(), without waiting for queued answers to go out. No other thread may be inside a
  // call of the engine when it is destroyed (finish() first ends them).
  ~FfnEngine();

  // This F is done: the answers respond() queued go out (within spec.timeout), then the engine
  // stops; get_batch and respond are refused from then on (Error(kStatusClosed)), and a get_batch
  // in another thread ends at once with that error. The As still running see this F lost. Throws
  // the error that ended the engine, if one did.
  void finish();

  // The next micro-batch: complete from every A still in the job (Gather::all), or one A's part
  // as soon as it arrives (Gather::eager). An A that is lost (gone without saying "leave", or
  // hung past the heartbeat) is contained: the F serves the others without it (lost_attention()
  // names it) until its replacement joins. Returns nullopt when every A has left or been lost, at
  // least one of them cleanly, and no lost one is being replaced (a start that has claimed a newer
  // epoch of it in the store is waited for); throws Error(TIMEOUT) when nothing came within
  // `timeout`, saying so when every A was lost and none replaced, or a replacement never joined.
  std::optional<Batch> get_batch(std::chrono::milliseconds timeout);
  // Sends each part's output back to its A once the work queued so far on `after` (F's compute
  // stream; nullptr: the outputs are already there) has completed. The engine records an event of
  // its own on `after` during the call; the stream need only live through the call.
  void respond(const Batch& batch, const Stream* after = nullptr, int64_t compute_start_ns = 0);

  // As AttentionEngine's: a message to A `attention` goes out in order with this F's answers to
  // it (A receives it before the results of any respond() called after this call).
  void send_message(int attention, std::span<const uint8_t> bytes);
  std::optional<Message> receive_message(std::chrono::milliseconds timeout);

  // The F's row spaces of micro-batch `mb`, where its As' rows land (EngineSpec::ffn_rows(rank)
  // rows, each A in its window unless it pushes at another row_offset): A2F tensor `tensor`'s
  // ([rows][row bytes]; null for a tensor the job does not have), and the outputs' ([rows][hidden]
  // in the F2A dtype). Fixed for the engine's life: a captured graph may read and write them.
  void* inputs(int micro_batch, int tensor) const;
  void* outputs(int micro_batch) const;
  // From now on, the As' rows of A2F tensor `tensor` of micro-batch `mb` land in the application's
  // own buffer [data, +bytes) instead of the engine's row space, at the same rows (it holds
  // EngineSpec::ffn_rows(rank) rows; registered as PushOptions's buffers are, and as long-lived).
  // Each A hears of it in order with this F's answers and uses it for the pushes it posts after
  // that; a part says where its rows did land (Batch::FromAttention::inputs), so a part already on
  // its way lands in the row space it was sent to. For buffers set up once (a graph's, StepMesh's
  // register_recv_buffer): a micro-batch takes at most 64 distinct layouts. Throws
  // Error(INVALID_ARGUMENT) for a buffer too small or of another device.
  void receive_into(int micro_batch, int tensor, void* data, uint64_t bytes);
  // As AttentionEngine's, for the part outputs this F responds from.
  RegisteredBuffer register_buffer(const void* data, uint64_t bytes);
  DataCounters counters() const;

  // ---- Round trips the device triggers (docs/device-triggered.md) ----
  // From now on the engine's own thread takes the batches and answers them when a stream says so:
  // micro-batch mb's batch flag is raised when its batch is complete (as get_batch would hand it
  // out: inputs(mb, *) hold the As' rows, each A in its window or at its row_offset), a stream
  // waits on it (enqueue_wait_batch), computes outputs(mb), and rings mb's respond doorbell
  // (enqueue_respond): the engine answers every part from outputs(mb). get_batch and respond are
  // refused from then on. When the job ends for this F (every A done, the engine failed or
  // finished), every flag is raised at once and stays so: no stream waits forever, and
  // device_trips().ended says why. For gather = "all" (eager hands out several parts of one
  // micro-batch), called before the first get_batch. Throws Error(NOT_SUPPORTED) without stream
  // memory operations.
  void serve_device();
  void enqueue_wait_batch(int micro_batch, const Stream& stream);
  void enqueue_respond(int micro_batch, const Stream& stream);
  const void* batch_flag(int micro_batch) const;
  void* respond_doorbell(int micro_batch) const;
  // rung: answers; completed: batches raised; failed: rings with no batch to answer.
  DeviceTrips device_trips();

  // The attention instances this F lost and served on without, with why: "attention 1 lost: ...",
  // every loss since the start (a replaced A's too).
  std::vector<std::string> lost_attention() const;
  // Every A as this engine sees it now, and what it saw happen to them.
  std::vector<PeerStatus> peers() const;
  PeerHistory peer_history() const;

  const EngineSpec& spec() const;
  uint64_t epoch() const;  // as AttentionEngine::epoch
  std::vector<std::pair<std::string, uint64_t>> registered() const;
  std::string metrics_text() const;  // as AttentionEngine's
  std::string metrics_address() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

int64_t now_ns();

}  // namespace hetmesh::afd

#pragma GCC visibility pop
