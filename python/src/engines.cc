// hetmesh._native.AttentionEngine, FfnEngine, Batch, Part, RoundTrip and Stream: the AFD engines
// (afd/engine.hpp) for Python. Each engine owns what it runs on (its plugins, device and store
// connection), in an order that lets the engine go first; every slot it hands out is a DLPack
// view (slot.hpp) whose tensors keep the engine's memory, and which close() ends. Every call that
// can wait releases the GIL.
#include "engines.hpp"

#include "caller_tensor.hpp"
#include "ffn_batch.hpp"
#include "stepmesh_fast_path.hpp"
#include "teardown.hpp"

#include "slot.hpp"

#include <hetmesh/plugins/cuda.h>
#include <hetmesh/afd/engine.hpp>
#include <hetmesh/afd/instance.hpp>
#include <hetmesh/afd/stream_flags.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <pybind11/stl.h>
#include <hetmesh/core/toml_reader.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <type_traits>
#include <vector>

namespace hetmesh::python {
namespace {

using std::chrono::milliseconds;

// What an engine runs on (afd::Instance: its plugins, device, store and the engine itself), and
// the framework streams handed to push_pull/respond/stream_wait, by native handle, each borrowed
// once (hm.cuda.native's stream_borrow) and kept for the engine's life (a few per framework).
struct Context {
  // The application's tensors whose memory the engine registered (the first one seen of each
  // allocation), kept until the engine has ended, so no registration outlives its memory.
  // Declared first: they go after the engine.
  std::vector<std::shared_ptr<void>> held;
  std::map<uintptr_t, Stream> borrowed;
  std::unique_ptr<afd::Instance> instance;  // its engine ends first
  // hetmesh.stepmesh's notices and flag waits, made at the first; they let their streams go
  // before the engine ends.
  std::unique_ptr<afd::StreamFlags> flags;
  // hetmesh.stepmesh's push_pull in steady state, once the shim set it up; the reference that
  // keeps its current-stream function.
  std::unique_ptr<StepMeshFastPath> stepmesh;
  std::shared_ptr<void> stepmesh_stream_fn;
  std::mutex flags_mutex;  // flags is made under the GIL and released without it
  bool ended = false;      // finished or closed: no new flags (none would be let go)
  // A job of bytes (take_tensors_as_bytes): every row of every tensor is one byte, and push_pull
  // and respond take any contiguous tensor as its bytes (hetmesh.stepmesh's tensors of any dtype).
  bool bytes = false;
  // The last registrations [base, end) the engine returned (each lasts as long as the engine):
  // a layer's tensors, which a framework's caching allocator carves from a few allocations, skip
  // the engine's lookup and the GIL's release it takes.
  std::array<std::pair<uintptr_t, uintptr_t>, 8> registered{};
  size_t next_registered = 0;

  const afd::JobConfig& config() const { return instance->config(); }
  const afd::EngineSpec& spec() const { return instance->spec(); }
  const Device& device() const { return instance->device(); }
};

std::shared_ptr<Context> make_context(const afd::JobConfig& config, afd::Role role, int rank,
                                      const afd::InstanceOptions& options) {
  auto c = std::make_shared<Context>();
  py::gil_scoped_release unlocked;  // loading plugins and reaching the store may take a while
  c->instance = afd::open_instance(config, role, rank, options);
  return c;
}

// A reference to `object` that may be dropped on any thread, with or without the interpreter's
// lock (a Context goes with the last tensor exported from its slots).
std::shared_ptr<void> keep(py::object object) {
  return std::shared_ptr<void>(object.release().ptr(), [](void* p) {
    // The interpreter ended or is ending: so is the process, and the reference with it.
    if (!Py_IsInitialized() || taking_the_lock_would_end_this_thread()) return;
    py::gil_scoped_acquire gil;
    Py_DECREF(static_cast<PyObject*>(p));
  });
}

// `object`'s memory, registered with `engine` now unless a registration holds it already; the
// engine's context keeps the first object seen of each allocation. Caller holds the GIL.
template <typename Engine>
void register_tensor(Context& c, Engine& engine, const py::handle& object,
                     const CallerTensor& tensor) {
  if (tensor.bytes == 0) return;
  const auto begin = reinterpret_cast<uintptr_t>(tensor.data);
  uintptr_t end;
  if (!__builtin_add_overflow(begin, tensor.bytes, &end))
    for (const auto& [from, to] : c.registered)
      if (from <= begin && end <= to) return;
  afd::RegisteredBuffer found;
  {
    py::gil_scoped_release unlocked;
    found = engine.register_buffer(tensor.data, tensor.bytes);  // refuses a range that wraps
  }
  if (found.fresh) c.held.push_back(keep(py::reinterpret_borrow<py::object>(object)));
  const auto base = reinterpret_cast<uintptr_t>(found.base);
  c.registered[c.next_registered++ % c.registered.size()] = {base, base + found.bytes};
}

// An application's tensor as push_pull and respond take it: of the job's element type and row
// size, or in a job of bytes, any contiguous tensor as that many rows of one byte.
CallerTensor job_tensor(const Context& c, const py::handle& object, std::optional<Element> element,
                        uint64_t row_bytes, const char* what) {
  if (!c.bytes) return caller_tensor(object, c.device(), element, row_bytes, what);
  CallerTensor t = caller_tensor(object, c.device(), element, 0, what);
  t.rows = t.bytes;
  return t;
}

// Makes `c`'s job one of bytes, where every row of the job is a byte (so nothing else is
// misread): tokens of hidden 1 in a 1-byte dtype both ways, no routing, extra tensors of one
// 1-byte column.
void take_tensors_as_bytes(Context& c) {
  const afd::EngineSpec& spec = c.spec();
  bool bytes = spec.f2a_bytes_per_token() == 1 && spec.top_k == 0;
  for (int t = 0; t < spec.a2f_tensors(); ++t)
    bytes = bytes && (t == afd::kRoutingTensor || spec.a2f_row_bytes(t) == 1);
  if (!bytes)
    throw Error(
        HM_ERR_INVALID_ARGUMENT,
        "take_tensors_as_bytes: a job of bytes has rows of one byte in every tensor (hidden "
        "1, fp8 both ways, top_k 0, extra tensors of one fp8 column)");
  c.bytes = true;
}

py::dict counters_dict(const afd::DataCounters& counters) {
  py::dict d;
  d["caller_bytes"] = counters.caller_bytes;
  d["slot_bytes"] = counters.slot_bytes;
  d["staged_bytes"] = counters.staged_bytes;
  d["caller_buffers"] = counters.caller_buffers;
  return d;
}

template <typename Engine>
Engine& engine_of(Context& c) {
  if constexpr (std::is_same_v<Engine, afd::AttentionEngine>)
    return c.instance->attention();
  else
    return c.instance->ffn();
}

// A timeout in milliseconds from Python: None is the job's; inf is "forever" (capped at a year,
// which every clock sum below holds); negative or NaN is refused.
milliseconds timeout_or(const std::optional<double>& timeout_ms, const Context& c) {
  if (!timeout_ms) return c.config().job.timeout;
  constexpr double kYearMs = 365.0 * 24 * 3600 * 1000;
  if (!(*timeout_ms >= 0))
    throw Error(HM_ERR_INVALID_ARGUMENT, fmt::format("timeout_ms {} is not >= 0", *timeout_ms));
  return milliseconds(static_cast<int64_t>(std::min(*timeout_ms, kYearMs)));
}

// The stream flags of `c`'s engine (afd/stream_flags.hpp), made at the first call.
afd::StreamFlags& flags_of(Context& c) {
  constexpr int kFlagSites = 4096;  // notices and wait_flag sites a process holds at once
  std::lock_guard lock(c.flags_mutex);
  if (c.ended)
    throw Error(kStatusClosed,
                "stream flags: the engine has finished; no stream waits on it from now on");
  if (!c.flags) c.flags = std::make_unique<afd::StreamFlags>(c.device(), kFlagSites);
  return *c.flags;
}

// write_flag's ends, tensors' addresses the Python layer checked: `bytes` inside memory the
// engine's plugin knows (device, pinned or registered), or anywhere where the device's memory is
// the host's. A stray address is refused here, not faulted on by the copy engine.
const void* copy_end(const Device& device, uintptr_t address, uint64_t bytes, const char* what) {
  const auto* p = reinterpret_cast<const void*>(address);
  PointerInfo info = device.query(p);
  const auto base = reinterpret_cast<uintptr_t>(info.base);
  const bool inside =
      info.kind != HM_MEM_UNKNOWN && address >= base && bytes <= info.size - (address - base);
  if (!inside && !device.has(HM_CAP_HOST_ADDRESSABLE_DEVICE_MEMORY))
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("write_flag: the {} at {} ({} bytes) is not memory {} reaches", what, p,
                            bytes, device.selector()));
  return p;
}

// The engine's end: every stream waiting on one of its flags goes, and none is made later.
void release_flags(Context& c) {
  std::lock_guard lock(c.flags_mutex);
  c.ended = true;
  if (c.flags) c.flags->release();
}

void check_micro_batch(int mb, const afd::EngineSpec& spec) {
  if (mb < 0 || mb >= spec.micro_batches)
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("micro-batch {}: the engine has {} (0..{})", mb, spec.micro_batches,
                            spec.micro_batches - 1));
}

// Routing entries are {int32 expert, float weight} pairs: two strided views of the same bytes
// (each tensor of a slot starts aligned: EngineSpec::kA2fAlignment). A job without routing has
// none to view.
void check_routing(const void* routing, const afd::EngineSpec& spec) {
  if (routing == nullptr || spec.top_k == 0)
    throw Error(HM_ERR_INVALID_ARGUMENT,
                "experts and weights: this job sends no routing (top_k is 0)");
}

// Where a slot is and whose it is: the Python engine and its C++ side.
struct Owner {
  const Context& context;
  py::object object;
  const SlotOwner& engine;
};

Slot experts_slot(void* routing, uint32_t tokens, const Owner& o) {
  const afd::EngineSpec& spec = o.context.spec();
  check_routing(routing, spec);
  return Slot(routing, {{tokens, spec.top_k}, {2 * int64_t{spec.top_k}, 2}, Element::int32},
              o.context.device(), o.object, o.engine);
}
Slot weights_slot(void* routing, uint32_t tokens, const Owner& o) {
  const afd::EngineSpec& spec = o.context.spec();
  check_routing(routing, spec);
  return Slot(static_cast<char*>(routing) + sizeof(int32_t),
              {{tokens, spec.top_k}, {2 * int64_t{spec.top_k}, 2}, Element::fp32},
              o.context.device(), o.object, o.engine);
}
Slot rows_slot(void* data, uint32_t tokens, afd::Dtype dtype, const Owner& o) {
  return Slot(data, {{tokens, o.context.spec().hidden}, {}, element_of(dtype)}, o.context.device(),
              o.object, o.engine);
}

// A2F tensor `name` of the job: "tokens", "routing" or one of its a2f_tensors, or an index.
int a2f_index(const Context& c, const py::handle& name) {
  const afd::EngineSpec& spec = c.spec();
  if (py::isinstance<py::int_>(name)) {
    const int index = name.cast<int>();
    if (index < 0 || index >= spec.a2f_tensors())
      throw Error(HM_ERR_INVALID_ARGUMENT,
                  fmt::format("A2F tensor {}: the job has {} (0..{})", index, spec.a2f_tensors(),
                              spec.a2f_tensors() - 1));
    return index;
  }
  const std::string wanted = py::str(name);
  std::vector<std::string_view> names;
  for (int t = 0; t < spec.a2f_tensors(); ++t) {
    if (spec.a2f_tensor_name(t) == wanted) return t;
    names.push_back(spec.a2f_tensor_name(t));
  }
  throw Error(HM_ERR_INVALID_ARGUMENT,
              fmt::format("no A2F tensor '{}' in this job{}; it has {} ([model.a2f_tensors] "
                          "declares more)",
                          wanted, toml_did_you_mean(wanted, names), fmt::join(names, ", ")));
}

// The elements of A2F tensor `t`: the A2F dtype's for the tokens, an extra tensor's own; nullopt
// for the routing (pairs of two 4-byte types).
std::optional<Element> tensor_element(const Context& c, int t) {
  const afd::ModelSection& model = c.config().model;
  if (t == afd::kTokensTensor) return element_of(model.a2f_dtype);
  if (t == afd::kRoutingTensor) return std::nullopt;
  return element_of(model.a2f_tensors[static_cast<size_t>(t - 2)].dtype);
}

// A view of `rows` rows of A2F tensor `t` at `data`: the tokens [rows, hidden] in the A2F dtype,
// an extra tensor [rows, columns] of its dtype. The routing has two views (experts, weights).
Slot tensor_slot(void* data, int t, uint32_t rows, const Owner& o) {
  const afd::JobConfig& config = o.context.config();
  if (t == afd::kTokensTensor) return rows_slot(data, rows, config.model.a2f_dtype, o);
  if (t == afd::kRoutingTensor)
    throw Error(HM_ERR_INVALID_ARGUMENT,
                "the routing is two views of one tensor: use experts and weights");
  if (data == nullptr) throw Error(HM_ERR_INVALID_ARGUMENT, "the job has no such tensor");
  const afd::TensorSection& extra = config.model.a2f_tensors[static_cast<size_t>(t - 2)];
  return Slot(data, {{rows, extra.columns}, {}, element_of(extra.dtype)}, o.context.device(),
              o.object, o.engine);
}

// A stream of the engine's device, for push_pull/respond readiness. Keeps the engine's Python
// object (for the exit hook) and what the stream runs on, past the engine's close().
struct PyStream {
  std::shared_ptr<Context> context;  // declared first: goes after the stream
  Stream stream;
  py::object owner;
};

PyStream make_stream(py::object owner, std::shared_ptr<Context> context) {
  Stream stream = context->device().create_stream();
  return PyStream{std::move(context), std::move(stream), std::move(owner)};
}

// The vendor's handle behind a stream (a cudaStream_t for the cuda plugin), so a framework can
// run its kernels on it (torch.cuda.ExternalStream); None where the plugin offers none.
constexpr size_t kMaxBorrowedStreams = 64;

// The cuda plugin's native-stream extension, version `version` or later; nullptr where the
// device's plugin has none.
const hm_cuda_native_ext* cuda_native(const Device& device, uint32_t version) {
  const void* table = nullptr;
  if (device.api().get_extension == nullptr ||
      device.api().get_extension(HM_CUDA_NATIVE_EXTENSION, version, &table) != HM_OK)
    return nullptr;
  return static_cast<const hm_cuda_native_ext*>(table);
}

// An hm_stream over a framework's stream (its native handle), borrowed once per engine.
const Stream& borrowed_stream(Context& c, uintptr_t handle) {
  if (auto it = c.borrowed.find(handle); it != c.borrowed.end()) return it->second;
  const hm_cuda_native_ext* native = cuda_native(c.device(), 2);
  if (native == nullptr)
    throw Error(HM_ERR_NOT_SUPPORTED,
                fmt::format("stream: {}'s plugin cannot take a framework's stream (it offers no "
                            "{} version 2); pass engine.create_stream() and run the framework's "
                            "work on it",
                            c.device().selector(), HM_CUDA_NATIVE_EXTENSION));
  if (c.borrowed.size() >= kMaxBorrowedStreams)
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("stream: already {} distinct framework streams were handed to this "
                            "engine; reuse them",
                            kMaxBorrowedStreams));
  hm_stream stream = nullptr;
  c.device().plugin().check(
      native->stream_borrow(c.device().index(), reinterpret_cast<void*>(handle), &stream),
      "hm.cuda.native.stream_borrow");
  return c.borrowed.emplace(handle, c.device().adopt_stream(stream)).first->second;
}

// The stream a push, a response or a device-side wait is ordered with: None; a Stream of the
// engine's own device; or a framework's stream (torch.cuda.Stream, torch.cuda.ExternalStream:
// anything with a `cuda_stream` handle) or a raw handle, borrowed through the plugin.
const Stream* stream_of(const py::object& s, Context& c) {
  if (s.is_none()) return nullptr;
  if (py::isinstance<PyStream>(s)) {
    const Stream& stream = s.cast<const PyStream&>().stream;
    if (!(stream.device() == c.device()))
      throw Error(HM_ERR_INVALID_ARGUMENT,
                  fmt::format("stream: it is a stream of {}, and this engine runs on {}",
                              stream.device().selector(), c.device().selector()));
    return &stream;
  }
  if (py::isinstance<py::int_>(s)) return &borrowed_stream(c, s.cast<uintptr_t>());
  if (py::hasattr(s, "cuda_stream")) {
    // A framework's stream of another GPU would fail deep in the driver: say so here.
    if (py::hasattr(s, "device") && py::hasattr(s.attr("device"), "index")) {
      py::object index = s.attr("device").attr("index");
      if (!index.is_none() && index.cast<int>() != c.device().index())
        throw Error(HM_ERR_INVALID_ARGUMENT,
                    fmt::format("stream: it is a stream of cuda:{}, and this engine runs on {}",
                                index.cast<int>(), c.device().selector()));
    }
    return &borrowed_stream(c, s.attr("cuda_stream").cast<uintptr_t>());
  }
  throw Error(
      HM_ERR_INVALID_ARGUMENT,
      fmt::format("stream: expected a hetmesh.Stream (engine.create_stream()), a "
                  "framework's CUDA stream or a raw stream handle, got a {}",
                  py::str(py::type::handle_of(s).attr("__qualname__")).cast<std::string>()));
}

// stream_of for `call`, which must have a stream.
const Stream& required_stream(const py::object& s, Context& c, const char* call) {
  const Stream* stream = stream_of(s, c);
  if (stream == nullptr)
    throw Error(
        HM_ERR_INVALID_ARGUMENT,
        fmt::format("{}: name the stream (engine.create_stream() or a framework's stream)", call));
  return *stream;
}

// The vendor's handle behind a stream (a cudaStream_t for the cuda plugin), so a framework can
// run its kernels on it (torch.cuda.ExternalStream); None where the plugin offers none.
py::object native_handle(const PyStream& s) {
  const Device& device = s.stream.device();
  const hm_cuda_native_ext* native = cuda_native(device, 1);
  if (native == nullptr) return py::none();
  void* handle = nullptr;
  int32_t ordinal = 0;
  device.plugin().check(native->stream_native(s.stream.native(), &handle, &ordinal),
                        "hm.cuda.native.stream_native");
  return py::int_(reinterpret_cast<uintptr_t>(handle));
}

// An engine of role `kRole` and what it runs on, for Python. The context (its afd::Instance) is
// made before the engine, which it ends first; every wait and the destruction run without the GIL.
// Each call holds the context while it runs, so a close() meanwhile (another thread) frees nothing
// under it; every tensor exported from a slot holds it too (SlotOwner::memory).
template <typename Engine, afd::Role kRole>
class PyEngine : public SlotOwner {
 public:
  using EngineType = Engine;

  PyEngine(const afd::JobConfig& config, int rank, const afd::InstanceOptions& options)
      : context_(make_context(config, kRole, rank, options)), weak_(context_), rank_(rank) {
    py::gil_scoped_release unlocked;  // waits for every peer
    engine_of<Engine>(*context_);
  }
  ~PyEngine() {
    UnlockedTeardown unlocked;  // tells the peers, joins the engine's threads
    context_.reset();
  }
  PyEngine(const PyEngine&) = delete;
  PyEngine& operator=(const PyEngine&) = delete;

  // The context for one call; throws Error(kStatusClosed) once the engine was closed.
  std::shared_ptr<Context> live() const {
    if (!context_)
      throw Error(kStatusClosed,
                  fmt::format("{} engine {} was {}: its calls and slots are refused (tensors "
                              "taken from its slots before stay valid)",
                              afd::to_string(kRole), rank_, closed_why_));
    return context_;
  }
  std::shared_ptr<const void> memory() const override { return live(); }
  // The engine's end lets every stream waiting on one of its stream flags go, then finishes.
  static void finish_engine(Context& c) {
    release_flags(c);
    engine_of<Engine>(c).finish();
  }
  bool is_open() const { return context_ != nullptr; }

  // finish() once: the C++ engine's finish, idempotent here so close() after it adds nothing.
  void finish() {
    std::shared_ptr<Context> c = live();
    if (finished_) return;
    finished_ = true;
    py::gil_scoped_release unlocked;
    finish_engine(*c);
  }

  // Ends the engine for Python: with `finish`, finish() first (a failed A's raises nothing: the
  // call that saw its failure raised it; it says "quit"); without (an A after an exception), its
  // peers hear "quit" when its memory goes. The memory goes now, or with the last tensor
  // exported from a slot. Idempotent.
  void close(bool finish) {
    if (!context_) return;
    std::shared_ptr<Context> c = std::move(context_);  // from now on, slots and calls are refused
    closed_why_ = "closed (close(), or the end of its with-block)";
    const bool finishing = finish && !finished_;
    finished_ = finished_ || finish;
    py::gil_scoped_release unlocked;
    if (finishing) {
      try {
        finish_engine(*c);
      } catch (const Error&) {  // it had failed: its peers heard so
      }
    }
    release_flags(*c);  // no stream waits on a closed engine
    c.reset();
  }

  // At the interpreter's exit (the package's atexit hook): an engine still running tells its
  // peers and stops its threads while everything it uses still exists; its memory goes with it.
  void shutdown() {
    std::shared_ptr<Context> c = weak_.lock();
    context_.reset();
    if (closed_why_.empty()) closed_why_ = "shut down (the interpreter is exiting)";
    if (!c || finished_) return;
    py::gil_scoped_release unlocked;
    release_flags(*c);
    c->instance->close();
  }

 private:
  std::shared_ptr<Context> context_;  // null once closed
  std::weak_ptr<Context> weak_;       // what the exit hook ends, even past close()
  int rank_;
  bool finished_ = false;
  std::string closed_why_;
};

using PyAttention = PyEngine<afd::AttentionEngine, afd::Role::attention>;
using PyFfn = PyEngine<afd::FfnEngine, afd::Role::ffn>;

afd::AttentionEngine& attention_of(Context& c) {
  return engine_of<afd::AttentionEngine>(c);
}
afd::FfnEngine& ffn_of(Context& c) {
  return engine_of<afd::FfnEngine>(c);
}

// A packed batch (its parts back to back), or the error that says why it is not one.
const afd::Batch& packed_of(const PyBatch& b) {
  if (!b.batch.packed)
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("micro-batch {}: its {} part(s) do not lie back to back from row 0 "
                            "(the As push at their own windows unless each names row_offset: the "
                            "rows of the As before it); use each part's views",
                            b.batch.micro_batch, b.batch.parts.size()));
  return b.batch;
}

// Rows of A2F tensor `t` over a packed batch: every part's tokens, or none where the As left it
// out.
uint32_t batch_rows(const afd::Batch& b, int t) {
  return std::any_of(b.parts.begin(), b.parts.end(),
                     [t](const auto& part) { return part.rows[static_cast<size_t>(t)] > 0; })
             ? b.packed_rows
             : 0;
}

// The PyFfn a batch came from (each part holds it).
py::object owner_of(const PyBatch& b) {
  return py::list(b.parts)[0].cast<const PyPart&>().engine;
}

// A view over a packed batch: `make` gets the batch and the Owner to build the slot with.
template <typename Make>
auto batch_slot(Make make) {
  return [make](const PyBatch& b) {
    const afd::Batch& batch = packed_of(b);
    py::object owner = owner_of(b);
    const auto& f = owner.cast<const PyFfn&>();
    std::shared_ptr<Context> c = f.live();
    return make(batch, Owner{*c, owner, f});
  };
}

// push_pull's results_into given as one tensor: for the one F this A sends to (every A of a
// one-F job; each A of a "groups" job), so it is that F's entry; else, as before, a list of one
// that the engine refuses for naming too few.
py::list one_result_per_ffn(const py::object& tensor, const afd::EngineSpec& spec) {
  py::list each;
  std::vector<int> to;
  for (int f = 0; f < spec.ffn; ++f)
    if (spec.sends(spec.rank, f)) to.push_back(f);
  if (to.size() != 1) {
    each.append(tensor);
    return each;
  }
  for (int f = 0; f < spec.ffn; ++f)
    each.append(f == to.front() ? tensor : py::none());
  return each;
}

py::dict peer_dict(const afd::PeerStatus& p) {
  py::dict d;
  d["role"] = afd::to_string(p.role);
  d["rank"] = p.rank;
  d["epoch"] = p.epoch;
  d["state"] = afd::to_string(p.state);
  d["reason"] = p.reason;
  return d;
}

template <typename Engine>
py::list peers_of(Engine& engine) {
  py::list out;
  for (const afd::PeerStatus& p : engine.peers())
    out.append(peer_dict(p));
  return out;
}

// A part's slot: `make` gets the part, its engine's context and the Owner to build the slot with.
template <typename Make>
auto part_slot(Make make) {
  return [make](const PyPart& p) {
    const auto& f = p.engine.cast<const PyFfn&>();
    std::shared_ptr<Context> c = f.live();
    return make(p.part, *c, Owner{*c, p.engine, f});
  };
}

// The constructor both engines share: the job's config, and how this instance finds its job.
template <typename Py>
auto engine_init() {
  return py::init([](const afd::JobConfig& config, int rank, const std::string& store,
                     const std::string& secret_file, const std::string& device,
                     const std::string& job) {
    return std::make_unique<Py>(config, rank,
                                afd::InstanceOptions{store, {}, device, secret_file, job});
  });
}

// What both engines offer alike.
template <typename Py, typename Class>
void bind_common(Class& cls) {
  cls.def("finish", &Py::finish)
      .def("_close", &Py::close, py::arg("finish"))
      .def("_shutdown", &Py::shutdown)
      .def(
          "create_stream",
          [](py::object self) { return make_stream(self, self.cast<const Py&>().live()); },
          "A stream of this engine's device, for push_pull/respond(stream=...).")
      .def("peers",
           [](const Py& e) { return peers_of(engine_of<typename Py::EngineType>(*e.live())); })
      .def_property_readonly(
          "epoch",
          [](const Py& e) { return engine_of<typename Py::EngineType>(*e.live()).epoch(); })
      .def_property_readonly("rank", [](const Py& e) { return e.live()->spec().rank; })
      .def_property_readonly("device", [](const Py& e) { return e.live()->device().selector(); })
      .def_property_readonly("config", [](const Py& e) { return e.live()->config(); })
      .def_property_readonly(
          "job", [](const Py& e) { return e.live()->spec().job; },
          "The job's rendezvous namespace in its store.")
      .def_property_readonly("closed", [](const Py& e) { return !e.is_open(); })
      .def(
          "register_buffer",
          [](const Py& e, const py::object& tensor) {
            std::shared_ptr<Context> c = e.live();
            CallerTensor t =
                caller_tensor(tensor, c->device(), std::nullopt, 0, "register_buffer's tensor");
            register_tensor(*c, engine_of<typename Py::EngineType>(*c), tensor, t);
          },
          py::arg("tensor"),
          "Registers a tensor's memory (its whole allocation) now, as the engine does at a "
          "buffer's first use; the engine keeps the tensor until it ends.")
      .def(
          "_take_tensors_as_bytes", [](const Py& e) { take_tensors_as_bytes(*e.live()); },
          "For hetmesh.stepmesh: push_pull and respond take any contiguous tensor as its bytes, "
          "in a job whose every row is one byte.")
      .def(
          "counters",
          [](const Py& e) {
            return counters_dict(engine_of<typename Py::EngineType>(*e.live()).counters());
          },
          "Bytes moved from or into the application's buffers and the engine's slots, those "
          "copied through host staging buffers, and the buffers registered.")
      .def(
          "metrics",
          [](const Py& e) { return engine_of<typename Py::EngineType>(*e.live()).metrics_text(); },
          "This instance's metrics in Prometheus' text format, as a scrape gets them "
          "(docs/metrics.md).")
      .def_property_readonly(
          "metrics_address",
          [](const Py& e) {
            return engine_of<typename Py::EngineType>(*e.live()).metrics_address();
          },
          "Where this instance serves its metrics (\"127.0.0.1:9400\"; [metrics] listen), or "
          "\"\" when it does not.")
      .def(
          "send_message",
          [](const Py& e, int peer, const py::bytes& data) {
            std::shared_ptr<Context> c = e.live();
            std::string_view bytes = data;
            engine_of<typename Py::EngineType>(*c).send_message(
                peer, {reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()});
          },
          py::arg("peer"), py::arg("data"),
          "Sends the peer of that rank (an F from an A, an A from an F) a side-band message of at "
          "most 60 KiB, in order with this engine's data to it.")
      .def(
          "_notice", [](const Py& e) { return flags_of(*e.live()).notice(); },
          "hetmesh.stepmesh's SimpleNotify: a new notice (a word streams wait on).")
      .def(
          "_enqueue_notice_wait",
          [](const Py& e, int notice, uint32_t value, const py::object& stream) {
            std::shared_ptr<Context> c = e.live();
            flags_of(*c).enqueue_notice_wait(notice, value,
                                             required_stream(stream, *c, "SimpleNotify"));
          },
          py::arg("notice"), py::arg("value"), py::arg("stream"),
          "Later work on `stream` waits until the notice is raised to `value` or past it.")
      .def(
          "_raise_notice",
          [](const Py& e, int notice, uint32_t value) {
            flags_of(*e.live()).raise_notice(notice, value);
          },
          py::arg("notice"), py::arg("value"))
      .def(
          "_enqueue_flag_wait",
          [](const Py& e, uintptr_t flag, uintptr_t seq, const py::object& stream, bool reusable) {
            std::shared_ptr<Context> c = e.live();
            flags_of(*c).enqueue_flag_wait(reinterpret_cast<const int64_t*>(flag),
                                           reinterpret_cast<const void*>(seq),
                                           required_stream(stream, *c, "wait_flag"), reusable);
          },
          py::arg("flag"), py::arg("seq"), py::arg("stream"), py::arg("reusable"),
          "hetmesh.stepmesh's wait_flag: later work on `stream` waits until the int64 at host "
          "address `flag` is >= the int64 at `seq` as the stream finds it.")
      .def(
          "_enqueue_copy",
          [](const Py& e, uintptr_t dst, uintptr_t src, uint64_t bytes, const py::object& stream) {
            std::shared_ptr<Context> c = e.live();
            const Stream& on = required_stream(stream, *c, "write_flag");
            void* to = const_cast<void*>(copy_end(c->device(), dst, bytes, "flag"));
            on.copy(to, copy_end(c->device(), src, bytes, "seq"), bytes);
          },
          py::arg("dst"), py::arg("src"), py::arg("bytes"), py::arg("stream"),
          "hetmesh.stepmesh's write_flag: a copy of `bytes` ordered on `stream`.")
      .def(
          "receive_message",
          [](const Py& e, std::optional<double> timeout_ms) -> py::object {
            std::shared_ptr<Context> c = e.live();
            milliseconds timeout = timeout_or(timeout_ms, *c);
            std::optional<afd::Message> message;
            {
              py::gil_scoped_release unlocked;
              message = engine_of<typename Py::EngineType>(*c).receive_message(timeout);
            }
            if (!message) return py::none();
            return py::make_tuple(afd::to_string(message->role), message->rank,
                                  py::bytes(reinterpret_cast<const char*>(message->bytes.data()),
                                            message->bytes.size()));
          },
          py::arg("timeout_ms") = py::none(),
          "The next side-band message from a peer as (role, rank, bytes), or None if none came "
          "within timeout_ms (0: do not wait).");
}

}  // namespace

// A push's options from push_pull's (and arm_device's) keywords: the application's tensors
// checked, their registrations taken, the spans pointing into the struct's own vectors.
struct PreparedPush {
  std::vector<afd::PushTensor> tensors;
  std::vector<void*> results_into;
  afd::PushOptions push;
  uint32_t tokens = 0;
};

PreparedPush prepare_push(const std::shared_ptr<Context>& c, std::optional<uint32_t> tokens,
                          uint64_t tag, const py::object& stream, int64_t attention_start_ns,
                          const py::object& send, const py::object& routing,
                          const py::object& results_into, const py::dict& tensors,
                          const py::dict& rows_of, std::optional<uint32_t> row_offset,
                          std::optional<uint32_t> result_rows,
                          const CallerTensor* send_read = nullptr) {
  afd::AttentionEngine& engine = attention_of(*c);
  const afd::EngineSpec& spec = c->spec();
  PreparedPush prepared;
  afd::PushOptions& push = prepared.push;
  push.ready.stream = stream_of(stream, *c);
  push.tag = tag;
  push.attention_start_ns = attention_start_ns;
  push.row_offset = row_offset;
  push.result_rows = result_rows;
  // The application's tensors: the rows sent are `tokens`, else send's rows.
  std::vector<std::pair<py::handle, CallerTensor>> held;
  auto take = [&](const py::handle& object, std::optional<Element> element, uint64_t row_bytes,
                  const char* what) {
    held.emplace_back(object, job_tensor(*c, object, element, row_bytes, what));
    return held.back().second;
  };
  // Per A2F tensor: its source (send, routing, tensors[name]) and rows (rows[name]).
  std::vector<afd::PushTensor>& each = prepared.tensors;
  each.resize(static_cast<size_t>(spec.a2f_tensors()));
  std::vector<uint64_t> needed(each.size(), 0);  // rows a source must hold
  auto source = [&](int t, const py::handle& object, const char* what) {
    const std::optional<Element> element = tensor_element(*c, t);
    CallerTensor tensor = take(object, element, spec.a2f_row_bytes(t), what);
    each[static_cast<size_t>(t)].from = tensor.data;
    needed[static_cast<size_t>(t)] = tensor.rows;
  };
  if (send_read != nullptr && !c->bytes) {  // as the per-layer C++ read it (the job's rows)
    held.emplace_back(send, *send_read);
    each[afd::kTokensTensor].from = send_read->data;
    needed[afd::kTokensTensor] = send_read->rows;
  } else if (!send.is_none()) {
    source(afd::kTokensTensor, send, "push_pull's send");
  }
  if (!routing.is_none()) {
    if (spec.top_k == 0)
      throw Error(HM_ERR_INVALID_ARGUMENT,
                  "push_pull: routing for a job without routing (top_k is 0)");
    CallerTensor tensor =
        take(routing, std::nullopt, spec.routing_bytes_per_token(), "push_pull's routing");
    each[afd::kRoutingTensor].from = tensor.data;
    needed[afd::kRoutingTensor] = tensor.rows;
  }
  for (const auto& [name, tensor] : tensors) {
    const int t = a2f_index(*c, name);
    if (t < 2)
      throw Error(HM_ERR_INVALID_ARGUMENT,
                  fmt::format("push_pull: tensors['{}']: give it as send= or routing=",
                              spec.a2f_tensor_name(t)));
    if (!tensor.is_none()) source(t, tensor, "push_pull's tensors");
  }
  if (!tokens && !send.is_none())
    tokens = static_cast<uint32_t>(std::min<uint64_t>(needed[0], UINT32_MAX));
  const uint32_t count = tokens.value_or(spec.tokens);
  prepared.tokens = count;
  for (const auto& [name, rows] : rows_of)
    each[static_cast<size_t>(a2f_index(*c, name))].rows = rows.cast<uint32_t>();
  for (size_t t = 0; t < each.size(); ++t) {
    const uint32_t sent = each[t].rows.value_or(count);
    if (each[t].from != nullptr && needed[t] < sent)
      throw Error(HM_ERR_INVALID_ARGUMENT,
                  fmt::format("push_pull: a tensor of {} rows for {} rows of {}", needed[t], sent,
                              spec.a2f_tensor_name(static_cast<int>(t))));
  }
  push.tensors = each;
  std::vector<void*>& into = prepared.results_into;
  if (!results_into.is_none()) {
    py::list list;
    if (py::isinstance<py::list>(results_into) || py::isinstance<py::tuple>(results_into))
      list = py::list(results_into);
    else
      list = one_result_per_ffn(results_into, spec);
    for (const py::handle& r : list) {
      if (r.is_none()) {
        into.push_back(nullptr);
        continue;
      }
      // The tensor sent, answered in place (vLLM's ref_tensor), is read once.
      const afd::ModelSection& model = c->config().model;
      CallerTensor t = r.ptr() == send.ptr() && model.a2f_dtype == model.f2a_dtype
                           ? held.front().second
                           : take(r, element_of(c->config().model.f2a_dtype),
                                  spec.f2a_bytes_per_token(), "push_pull's results_into");
      if (t.rows < result_rows.value_or(count))
        throw Error(HM_ERR_INVALID_ARGUMENT,
                    fmt::format("push_pull: results_into of {} rows for an answer of {} rows",
                                t.rows, result_rows.value_or(count)));
      into.push_back(t.data);
    }
    push.results_into = into;
  }
  for (const auto& [object, tensor] : held)
    register_tensor(*c, engine, object, tensor);
  return prepared;
}

namespace {

// push_pull of hetmesh.stepmesh in steady state (stepmesh_fast_path.hpp): the engine's handle, or
// None where the shim's Python must take the call. Caller holds the GIL.
py::object stepmesh_push(Context& c, int mb, const py::handle& pushes, const py::handle& keys,
                         const py::handle& pulls, bool need_event) {
  StepMeshFastPath* fast = c.stepmesh.get();
  if (fast == nullptr || !PyList_CheckExact(pushes.ptr()) || !PyList_CheckExact(keys.ptr()) ||
      !PyList_CheckExact(pulls.ptr()))
    return py::none();
  const StepMeshFastPath::Settings& settings = fast->settings();
  const auto push_list = py::reinterpret_borrow<py::list>(pushes);
  const auto pull_list = py::reinterpret_borrow<py::list>(pulls);
  const size_t servers = settings.rail.size();
  if (push_list.size() != py::len(keys) || push_list.size() > settings.extra_tensors.size() + 1 ||
      (!pull_list.empty() && pull_list.size() != servers))
    return py::none();
  std::optional<StepMeshFastPath::Push> push =
      fast->read_pushes(push_list, py::reinterpret_borrow<py::list>(keys), c.device());
  if (!push) return py::none();
  std::optional<std::vector<CallerTensor>> answers = fast->read_pulls(pull_list, c.device());
  if (!answers) return py::none();
  const uint64_t answer = answers->empty() ? 0 : answers->front().bytes;
  for (const CallerTensor& t : *answers)
    if (t.bytes != answer || t.bytes > settings.max_bytes) return py::none();
  for (const CallerTensor& t : push->tensors)
    if (t.bytes > settings.max_bytes) return py::none();

  const afd::EngineSpec& spec = c.spec();
  std::vector<afd::PushTensor> each(static_cast<size_t>(spec.a2f_tensors()));
  for (int t : settings.extra_tensors)
    each[static_cast<size_t>(t)].rows = 0;
  uint32_t tokens = 0;
  for (size_t i = 0; i < push->tensors.size(); ++i) {
    const CallerTensor& t = push->tensors[i];
    if (i == 0) {
      tokens = static_cast<uint32_t>(t.bytes);
      each[afd::kTokensTensor].from = t.bytes != 0 ? t.data : nullptr;
      continue;
    }
    afd::PushTensor& extra = each[static_cast<size_t>(settings.extra_tensors[i - 1])];
    extra.from = t.bytes != 0 ? t.data : nullptr;
    extra.rows = static_cast<uint32_t>(t.bytes);
  }
  std::vector<void*> into(static_cast<size_t>(spec.ffn), nullptr);
  for (size_t s = 0; s < answers->size(); ++s)
    into[static_cast<size_t>(settings.rail[s])] = (*answers)[s].data;

  afd::PushOptions options;
  options.tensors = each;
  options.results_into = into;
  options.result_rows = static_cast<uint32_t>(answer);
  options.tag = push->number;
  if (need_event && settings.current_stream != nullptr && !push->tensors.empty()) {
    py::object stream =
        py::reinterpret_borrow<py::object>(settings.current_stream)(c.device().index());
    options.ready.stream = stream_of(stream, c);
  }
  afd::AttentionEngine& engine = attention_of(c);
  afd::AttentionEngine::Handle handle;
  {
    py::gil_scoped_release unlocked;
    handle = engine.push_pull(mb, tokens, options);
  }
  return py::int_(handle);
}

// Answers a packed `batch` from the rows of one tensor, `output` read as `t`: each part's answer
// at its row offset.
void respond_from_rows(Context& c, afd::Batch batch, const Stream* after, int64_t compute_start_ns,
                       const py::handle& output, const CallerTensor& t) {
  const afd::EngineSpec& spec = c.spec();
  afd::FfnEngine& engine = ffn_of(c);
  uint64_t rows = 0;  // the answers' (each part's at its row offset)
  for (const auto& part : batch.parts)
    rows = std::max(rows, uint64_t{part.row_offset} + part.result_rows);
  if (t.rows < rows)
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("respond: an output of {} rows for a batch whose answers take {}",
                            t.rows, rows));
  register_tensor(c, engine, output, t);
  for (auto& part : batch.parts)
    part.output =
        static_cast<uint8_t*>(t.data) + uint64_t{part.row_offset} * spec.f2a_bytes_per_token();
  py::gil_scoped_release unlocked;
  engine.respond(batch, after, compute_start_ns);
}

}  // namespace

Device ffn_device(const py::handle& engine) {
  return engine.cast<const PyFfn&>().live()->device();
}

Device attention_device(const py::handle& engine) {
  return engine.cast<const PyAttention&>().live()->device();
}

uint64_t push_pull_in_place(const py::handle& attention, int micro_batch, const py::object& tensor,
                            const CallerTensor& read, const py::object& stream,
                            std::optional<uint32_t> row_offset) {
  std::shared_ptr<Context> c = attention.cast<const PyAttention&>().live();
  PreparedPush prepared = prepare_push(
      c, static_cast<uint32_t>(std::min<uint64_t>(read.rows, UINT32_MAX)), 0, stream, 0, tensor,
      py::none(), tensor, py::dict(), py::dict(), row_offset, std::nullopt, &read);
  py::gil_scoped_release unlocked;
  return attention_of(*c).push_pull(micro_batch, prepared.tokens, prepared.push);
}

void wait_for_answer(const py::handle& attention, uint64_t handle) {
  std::shared_ptr<Context> c = attention.cast<const PyAttention&>().live();
  const milliseconds timeout = timeout_or(std::nullopt, *c);
  py::gil_scoped_release unlocked;
  attention_of(*c).wait(handle, timeout);
}

void respond_in_place(const py::handle& ffn, const PyBatch& batch, const py::object& stream,
                      const py::handle& output, const CallerTensor& read) {
  const auto& f = ffn.cast<const PyFfn&>();
  if (batch.engine != &f)
    throw Error(HM_ERR_INVALID_ARGUMENT,
                "respond: this batch came from another FfnEngine's get_batch");
  std::shared_ptr<Context> c = f.live();
  const afd::Batch& packed = packed_of(batch);
  const Stream* after = stream_of(stream, *c);
  if (!c->bytes) return respond_from_rows(*c, packed, after, 0, output, read);
  respond_from_rows(*c, packed, after, 0, output,
                    job_tensor(*c, output, element_of(c->config().model.f2a_dtype),
                               c->spec().f2a_bytes_per_token(), "respond's output"));
}

void bind_engines(py::module_& m) {
  py::class_<PyStream>(m, "Stream", gc_visible<PyStream, &PyStream::owner>(),
                       "A stream of an engine's device (engine.create_stream()).")
      .def(
          "synchronize",
          [](const PyStream& s, std::optional<double> timeout_ms) {
            if (timeout_ms && !(*timeout_ms >= 0))
              throw Error(HM_ERR_INVALID_ARGUMENT,
                          fmt::format("timeout_ms {} is not >= 0", *timeout_ms));
            s.stream.synchronize(timeout_ms && std::isfinite(*timeout_ms)
                                     ? Timeout(static_cast<int64_t>(
                                           std::min(*timeout_ms, 365.0 * 24 * 3600 * 1000) * 1e6))
                                     : kForever);
          },
          py::arg("timeout_ms") = py::none(), py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("native_handle", &native_handle,
                             "The vendor's stream handle (cudaStream_t for cuda), or None.");

  py::class_<afd::RoundTrip::PerFfn>(
      m, "RoundTripFfn",
      "One F's share of a round trip: received_at_a and posted_at_a on A's clock, the f_* stamps "
      "on that F's own clock (subtract them only from each other).")
      .def_readonly("posted_at_a", &afd::RoundTrip::PerFfn::posted_at_a)
      .def_readonly("received_at_a", &afd::RoundTrip::PerFfn::received_at_a)
      .def_readonly("f_received", &afd::RoundTrip::PerFfn::f_received)
      .def_readonly("f_batch_ready", &afd::RoundTrip::PerFfn::f_batch_ready)
      .def_readonly("f_compute_start", &afd::RoundTrip::PerFfn::f_compute_start)
      .def_readonly("f_compute_end", &afd::RoundTrip::PerFfn::f_compute_end)
      .def_readonly("f_posted", &afd::RoundTrip::PerFfn::f_posted);

  py::class_<afd::RoundTrip>(m, "RoundTrip", "Timestamps of one round trip (ns, A's clock).")
      .def_readonly("ffn", &afd::RoundTrip::ffn, "per F (RoundTripFfn); zeros for an F not sent to")
      .def_readonly("micro_batch", &afd::RoundTrip::micro_batch)
      .def_readonly("sequence", &afd::RoundTrip::sequence)
      .def_readonly("push_start", &afd::RoundTrip::push_start)
      .def_readonly("posted", &afd::RoundTrip::posted)
      .def_readonly("completed", &afd::RoundTrip::completed)
      .def_readonly("wait_returned", &afd::RoundTrip::wait_returned);

  py::class_<afd::DeviceTrips>(m, "DeviceTrips",
                               "The round trips a device triggered (arm_device, serve_device).")
      .def_readonly("rung", &afd::DeviceTrips::rung)
      .def_readonly("completed", &afd::DeviceTrips::completed)
      .def_readonly("failed", &afd::DeviceTrips::failed)
      .def_readonly("failures", &afd::DeviceTrips::failures)
      .def_readonly("ended", &afd::DeviceTrips::ended)
      .def("__repr__", [](const afd::DeviceTrips& t) {
        return fmt::format("DeviceTrips(rung={}, completed={}, failed={}, ended='{}')", t.rung,
                           t.completed, t.failed, t.ended);
      });

  py::class_<PyAttention> attention(m, "AttentionEngine");
  attention.attr("MAX_DEVICE_LAYOUTS") = afd::AttentionEngine::kMaxDeviceLayouts;
  attention
      .def(engine_init<PyAttention>(), py::arg("config"), py::arg("rank"), py::arg("store"),
           py::arg("secret_file"), py::arg("device"), py::arg("job"))
      .def(
          "tokens",
          [](py::object self, int mb) {
            const auto& a = self.cast<const PyAttention&>();
            std::shared_ptr<Context> c = a.live();
            check_micro_batch(mb, c->spec());
            return rows_slot(attention_of(*c).tokens(mb), c->spec().tokens,
                             c->config().model.a2f_dtype, Owner{*c, self, a});
          },
          py::arg("micro_batch"), "[tokens, hidden] in the A2F dtype: what push_pull sends.")
      .def(
          "experts",
          [](py::object self, int mb) {
            const auto& a = self.cast<const PyAttention&>();
            std::shared_ptr<Context> c = a.live();
            check_micro_batch(mb, c->spec());
            return experts_slot(attention_of(*c).routing(mb), c->spec().tokens, Owner{*c, self, a});
          },
          py::arg("micro_batch"), "[tokens, top_k] int32: each token's experts.")
      .def(
          "weights",
          [](py::object self, int mb) {
            const auto& a = self.cast<const PyAttention&>();
            std::shared_ptr<Context> c = a.live();
            check_micro_batch(mb, c->spec());
            return weights_slot(attention_of(*c).routing(mb), c->spec().tokens, Owner{*c, self, a});
          },
          py::arg("micro_batch"), "[tokens, top_k] float32: each token's expert weights.")
      .def(
          "tensor",
          [](py::object self, int mb, const py::object& name) {
            const auto& a = self.cast<const PyAttention&>();
            std::shared_ptr<Context> c = a.live();
            check_micro_batch(mb, c->spec());
            const int t = a2f_index(*c, name);
            return tensor_slot(attention_of(*c).tensor(mb, t), t, c->spec().tokens,
                               Owner{*c, self, a});
          },
          py::arg("micro_batch"), py::arg("name"),
          "[tokens, columns] of an A2F tensor of the job (\"tokens\" or one of its a2f_tensors): "
          "what push_pull sends of it.")
      .def(
          "result",
          [](py::object self, int mb, int ffn) {
            const auto& a = self.cast<const PyAttention&>();
            std::shared_ptr<Context> c = a.live();
            const afd::EngineSpec& spec = c->spec();
            check_micro_batch(mb, spec);
            if (ffn < 0 || ffn >= spec.ffn)
              throw Error(HM_ERR_INVALID_ARGUMENT,
                          fmt::format("ffn {}: the job has {} FFN instance(s)", ffn, spec.ffn));
            return rows_slot(attention_of(*c).result(mb, ffn), spec.tokens,
                             c->config().model.f2a_dtype, Owner{*c, self, a});
          },
          py::arg("micro_batch"), py::arg("ffn"),
          "[tokens, hidden] in the F2A dtype: where F `ffn`'s partial result lands.")
      .def(
          "push_pull",
          [](const PyAttention& a, int mb, std::optional<uint32_t> tokens, uint64_t tag,
             const py::object& stream, int64_t attention_start_ns, const py::object& send,
             const py::object& routing, const py::object& results_into, const py::dict& tensors,
             const py::dict& rows_of, std::optional<uint32_t> row_offset,
             std::optional<uint32_t> result_rows) {
            std::shared_ptr<Context> c = a.live();
            PreparedPush prepared =
                prepare_push(c, tokens, tag, stream, attention_start_ns, send, routing,
                             results_into, tensors, rows_of, row_offset, result_rows);
            py::gil_scoped_release unlocked;
            return attention_of(*c).push_pull(mb, prepared.tokens, prepared.push);
          },
          py::arg("micro_batch"), py::arg("tokens") = py::none(), py::kw_only(), py::arg("tag") = 0,
          py::arg("stream") = py::none(), py::arg("attention_start_ns") = 0,
          py::arg("send") = py::none(), py::arg("routing") = py::none(),
          py::arg("results_into") = py::none(), py::arg("tensors") = py::dict(),
          py::arg("rows") = py::dict(), py::arg("row_offset") = py::none(),
          py::arg("result_rows") = py::none(),
          "Sends micro-batch `micro_batch`: from its slots, or from the application's own "
          "tensors (send: [tokens, hidden] in the A2F dtype; routing: [tokens, top_k] (int32 "
          "expert, float32 weight) pairs, e.g. int32 [tokens, top_k, 2]; tensors: the job's "
          "a2f_tensors by name, [rows, columns] of their dtype), `rows` of each by name (default "
          "`tokens`; 0 leaves a tensor out), landing at `row_offset` of each F's row spaces "
          "(default: this A's own window), its results in the result slots or in results_into "
          "(one [tokens, hidden] tensor in the F2A dtype per F, a list where there are several, "
          "None for a slot; one tensor where the A sends to one F), `result_rows` rows of each "
          "(default `tokens`). Returns a handle for wait().")
      .def(
          "_stepmesh_fast_path",
          [](const PyAttention& a, std::vector<int> rail, const py::list& extra_names,
             uint64_t max_bytes, const py::object& current_stream) {
            std::shared_ptr<Context> c = a.live();
            if (!c->bytes)
              throw Error(HM_ERR_INVALID_ARGUMENT,
                          "_stepmesh_fast_path: for a job of bytes (_take_tensors_as_bytes)");
            for (int f : rail)
              if (f < 0 || f >= c->spec().ffn)
                throw Error(HM_ERR_INVALID_ARGUMENT,
                            fmt::format("_stepmesh_fast_path: F {} of {}", f, c->spec().ffn));
            StepMeshFastPath::Settings settings;
            settings.rail = std::move(rail);
            for (const py::handle name : extra_names)
              settings.extra_tensors.push_back(a2f_index(*c, name));
            settings.max_bytes = max_bytes;
            if (!current_stream.is_none()) {
              settings.current_stream = current_stream.ptr();
              c->stepmesh_stream_fn = keep(current_stream);
            }
            c->stepmesh = std::make_unique<StepMeshFastPath>(std::move(settings));
          },
          py::arg("rail"), py::arg("extra_names"), py::arg("max_bytes"), py::arg("current_stream"),
          "For hetmesh.stepmesh: push_pull's steady state in C++ (_stepmesh_push), for pull "
          "tensors answered by the Fs `rail`, push tensors past the first sent as "
          "`extra_names`; current_stream(device index) gives torch's stream handle, or None.")
      .def(
          "_stepmesh_push",
          [](const PyAttention& a, int mb, const py::handle& pushes, const py::handle& keys,
             const py::handle& pulls, bool need_event) {
            std::shared_ptr<Context> c = a.live();
            return stepmesh_push(*c, mb, pushes, keys, pulls, need_event);
          },
          py::arg("micro_batch"), py::arg("push_tensors"), py::arg("push_keys"),
          py::arg("pull_tensors"), py::arg("need_event"),
          "push_pull of a layout and memory _stepmesh_learn was told of: the handle, or None "
          "where the shim must take the call.")
      .def(
          "_stepmesh_learn",
          [](const PyAttention& a, const py::list& pushes, const py::list& keys,
             const py::list& pulls, uint64_t number) {
            std::shared_ptr<Context> c = a.live();
            if (c->stepmesh) c->stepmesh->learn(pushes, keys, pulls, number, c->device());
          },
          py::arg("push_tensors"), py::arg("push_keys"), py::arg("pull_tensors"), py::arg("layout"),
          "The shim pushed these tensors in place under layout number `layout`.")
      .def(
          "_stepmesh_forget_layouts",
          [](const PyAttention& a) {
            std::shared_ptr<Context> c = a.live();
            if (c->stepmesh) c->stepmesh->forget_layouts();
          },
          "The shim numbers its layouts afresh.")
      .def(
          "wait",
          [](const PyAttention& a, afd::AttentionEngine::Handle handle,
             std::optional<double> timeout_ms) {
            std::shared_ptr<Context> c = a.live();
            milliseconds timeout = timeout_or(timeout_ms, *c);
            py::gil_scoped_release unlocked;
            return attention_of(*c).wait(handle, timeout);
          },
          py::arg("handle"), py::arg("timeout_ms") = py::none())
      .def(
          "stream_wait",
          [](const PyAttention& a, afd::AttentionEngine::Handle handle, const py::object& stream) {
            std::shared_ptr<Context> c = a.live();
            attention_of(*c).stream_wait(handle, required_stream(stream, *c, "stream_wait"));
          },
          py::arg("handle"), py::arg("stream"),
          "Later work on `stream` waits, without the host, until the round trip of `handle` has "
          "settled (its results arrived, or it failed, or the engine ended); wait(handle) still "
          "says which.")
      .def(
          "arm_device",
          [](const PyAttention& a, int mb, std::optional<uint32_t> tokens, uint64_t tag,
             const py::object& send, const py::object& routing, const py::object& results_into,
             const py::dict& tensors, const py::dict& rows_of, std::optional<uint32_t> row_offset,
             std::optional<uint32_t> result_rows, int layout) {
            std::shared_ptr<Context> c = a.live();
            check_micro_batch(mb, c->spec());
            PreparedPush prepared =
                prepare_push(c, tokens, tag, py::none(), 0, send, routing, results_into, tensors,
                             rows_of, row_offset, result_rows);
            attention_of(*c).arm_device(mb, prepared.push, layout);
          },
          py::arg("micro_batch"), py::arg("tokens") = py::none(), py::kw_only(), py::arg("tag") = 0,
          py::arg("send") = py::none(), py::arg("routing") = py::none(),
          py::arg("results_into") = py::none(), py::arg("tensors") = py::dict(),
          py::arg("rows") = py::dict(), py::arg("row_offset") = py::none(),
          py::arg("result_rows") = py::none(), py::arg("layout") = 0,
          "Arms micro-batch `micro_batch` for round trips its device triggers: each ring "
          "(enqueue_push_pull on a stream, captured in a graph or not) sends it as push_pull "
          "would with these keywords (`tokens`: the most rows a ring carries, for the checks), "
          "and raises its done flag once answered (enqueue_wait). The tensors stay put: a "
          "graph's. push_pull refuses an armed micro-batch. `layout` (0..63): one of the "
          "micro-batch's armed pushes, which each ring names (a graph's layers, each sending "
          "from and receiving into tensors of its own).")
      .def(
          "enqueue_push_pull",
          [](const PyAttention& a, int mb, uint32_t tokens, const py::object& stream, int layout) {
            std::shared_ptr<Context> c = a.live();
            attention_of(*c).enqueue_push_pull(
                mb, tokens, required_stream(stream, *c, "enqueue_push_pull"), layout);
          },
          py::arg("micro_batch"), py::arg("tokens"), py::arg("stream"), py::arg("layout") = 0,
          "Enqueues on `stream` the ring that sends micro-batch `micro_batch`'s `layout` with "
          "`tokens` rows once the stream gets there (arm_device first). Capturable.")
      .def(
          "enqueue_wait",
          [](const PyAttention& a, int mb, const py::object& stream) {
            std::shared_ptr<Context> c = a.live();
            attention_of(*c).enqueue_wait(mb, required_stream(stream, *c, "enqueue_wait"));
          },
          py::arg("micro_batch"), py::arg("stream"),
          "Enqueues on `stream` a hold until micro-batch `micro_batch`'s round trip has settled "
          "(device_trips() names those that failed). Capturable.")
      .def(
          "device_trips",
          [](const PyAttention& a) { return attention_of(*a.live()).device_trips(); },
          "The round trips the device rang: counts, and the failures since the last call.")
      .def(
          "wait_for_peers",
          [](const PyAttention& a, std::optional<double> timeout_ms) {
            std::shared_ptr<Context> c = a.live();
            milliseconds timeout = timeout_or(timeout_ms, *c);
            py::gil_scoped_release unlocked;
            return attention_of(*c).wait_for_peers(timeout);
          },
          py::arg("timeout_ms") = py::none())
      .def(
          "_round_trips_from_cpp",
          [](const PyAttention& a, int mb, int count) {
            // The baseline of python/hetmesh/bench.py: the same push_pull + wait as Python's
            // loop, from C++, timed the same way (each round trip alone in flight).
            std::shared_ptr<Context> c = a.live();
            check_micro_batch(mb, c->spec());
            std::vector<int64_t> ns(static_cast<size_t>(std::max(count, 0)));
            py::gil_scoped_release unlocked;
            afd::AttentionEngine& engine = attention_of(*c);
            for (int64_t& sample : ns) {
              int64_t start = afd::now_ns();
              engine.wait(engine.push_pull(mb, c->spec().tokens), c->config().job.timeout);
              sample = afd::now_ns() - start;
            }
            return ns;
          },
          py::arg("micro_batch"), py::arg("count"));
  bind_common<PyAttention>(attention);

  py::class_<PyPart>(m, "Part", gc_visible<PyPart, &PyPart::engine>(),
                     "One attention instance's part of a micro-batch.")
      .def_property_readonly("rank", [](const PyPart& p) { return p.part.rank; })
      .def_property_readonly("epoch", [](const PyPart& p) { return p.part.epoch; })
      .def_property_readonly("sequence", [](const PyPart& p) { return p.part.sequence; })
      .def_property_readonly("tag", [](const PyPart& p) { return p.part.tag; })
      .def_property_readonly(
          "count", [](const PyPart& p) { return p.part.tokens; }, "the tokens this A sent")
      .def_property_readonly(
          "result_rows", [](const PyPart& p) { return p.part.result_rows; },
          "the rows of the answer this A asked for (its push's result_rows, else count)")
      .def_property_readonly(
          "row_offset", [](const PyPart& p) { return p.part.row_offset; },
          "the row its rows start at in the F's row spaces of the micro-batch")
      .def_property_readonly(
          "tokens",
          part_slot([](const afd::Batch::FromAttention& part, const Context& c, const Owner& o) {
            return rows_slot(part.tokens_data(), part.tokens, c.config().model.a2f_dtype, o);
          }))
      .def_property_readonly(
          "experts",
          part_slot([](const afd::Batch::FromAttention& part, const Context&, const Owner& o) {
            return experts_slot(part.routing_data(), part.rows[afd::kRoutingTensor], o);
          }))
      .def_property_readonly(
          "weights",
          part_slot([](const afd::Batch::FromAttention& part, const Context&, const Owner& o) {
            return weights_slot(part.routing_data(), part.rows[afd::kRoutingTensor], o);
          }))
      .def(
          "tensor",
          [](const PyPart& p, const py::object& name) {
            const auto& f = p.engine.cast<const PyFfn&>();
            std::shared_ptr<Context> c = f.live();
            const int t = a2f_index(*c, name);
            return tensor_slot(p.part.inputs[static_cast<size_t>(t)], t,
                               p.part.rows[static_cast<size_t>(t)], Owner{*c, p.engine, f});
          },
          py::arg("name"), "[rows, columns] of one of the job's A2F tensors, as this A sent it.")
      .def(
          "rows",
          [](const PyPart& p, const py::object& name) {
            std::shared_ptr<Context> c = p.engine.cast<const PyFfn&>().live();
            return p.part.rows[static_cast<size_t>(a2f_index(*c, name))];
          },
          py::arg("name"), "the rows of an A2F tensor this A sent (0: it left the tensor out)")
      .def_property_readonly(
          "output",
          part_slot([](const afd::Batch::FromAttention& part, const Context& c, const Owner& o) {
            return rows_slot(part.output, part.result_rows, c.config().model.f2a_dtype, o);
          }));

  py::class_<PyBatch>(m, "Batch", gc_visible<PyBatch, &PyBatch::parts>(),
                      "A micro-batch as an FFN instance got it.")
      .def_property_readonly("micro_batch", [](const PyBatch& b) { return b.batch.micro_batch; })
      .def_readonly("parts", &PyBatch::parts)
      .def_property_readonly(
          "packed", [](const PyBatch& b) { return b.batch.packed; },
          "The parts lie back to back from row 0 in the order of `parts`: tokens, tensor(), "
          "experts, weights and output view the whole batch.")
      .def_property_readonly(
          "count", [](const PyBatch& b) { return packed_of(b).packed_rows; },
          "the tokens of every part (a packed batch)")
      .def_property_readonly("tokens", batch_slot([](const afd::Batch& b, const Owner& o) {
                               return rows_slot(b.parts[0].tokens_data(), b.packed_rows,
                                                o.context.config().model.a2f_dtype, o);
                             }))
      .def_property_readonly("experts", batch_slot([](const afd::Batch& b, const Owner& o) {
                               return experts_slot(b.parts[0].routing_data(),
                                                   batch_rows(b, afd::kRoutingTensor), o);
                             }))
      .def_property_readonly("weights", batch_slot([](const afd::Batch& b, const Owner& o) {
                               return weights_slot(b.parts[0].routing_data(),
                                                   batch_rows(b, afd::kRoutingTensor), o);
                             }))
      .def_property_readonly("output", batch_slot([](const afd::Batch& b, const Owner& o) {
                               return rows_slot(b.parts[0].output, b.packed_rows,
                                                o.context.config().model.f2a_dtype, o);
                             }))
      .def(
          "tensor",
          [](const PyBatch& b, const py::object& name) {
            const afd::Batch& batch = packed_of(b);
            py::object owner = owner_of(b);
            const auto& f = owner.cast<const PyFfn&>();
            std::shared_ptr<Context> c = f.live();
            const int t = a2f_index(*c, name);
            return tensor_slot(batch.parts[0].inputs[static_cast<size_t>(t)], t,
                               batch_rows(batch, t), Owner{*c, owner, f});
          },
          py::arg("name"), "[rows, columns] of an A2F tensor over the whole packed batch.");

  py::class_<PyFfn> ffn(m, "FfnEngine");
  ffn.def(engine_init<PyFfn>(), py::arg("config"), py::arg("rank"), py::arg("store"),
          py::arg("secret_file"), py::arg("device"), py::arg("job"))
      .def(
          "get_batch",
          [](py::object self, std::optional<double> timeout_ms) -> std::optional<PyBatch> {
            const auto& f = self.cast<const PyFfn&>();
            std::shared_ptr<Context> c = f.live();
            milliseconds timeout = timeout_or(timeout_ms, *c);
            std::optional<afd::Batch> batch;
            {
              py::gil_scoped_release unlocked;
              batch = ffn_of(*c).get_batch(timeout);
            }
            if (!batch) return std::nullopt;
            py::list parts;
            for (const auto& part : batch->parts)
              parts.append(PyPart{part, self});
            return PyBatch{std::move(*batch), std::move(parts), &f};
          },
          py::arg("timeout_ms") = py::none(),
          "The next micro-batch, or None once every attention instance has left.")
      .def(
          "respond",
          [](const PyFfn& f, const PyBatch& b, const py::object& stream, int64_t compute_start_ns,
             const py::object& outputs, std::optional<size_t> only) {
            if (b.engine != &f)
              throw Error(HM_ERR_INVALID_ARGUMENT,
                          "respond: this batch came from another FfnEngine's get_batch");
            std::shared_ptr<Context> c = f.live();
            const Stream* after = stream_of(stream, *c);
            afd::FfnEngine& engine = ffn_of(*c);
            // One part alone (each part is answered on its own; the others await theirs).
            afd::Batch batch = b.batch;
            if (only) {
              if (*only >= batch.parts.size())
                throw Error(
                    HM_ERR_INVALID_ARGUMENT,
                    fmt::format("respond: part {} of a batch of {}", *only, batch.parts.size()));
              batch.parts = {b.batch.parts[*only]};
              batch.packed = false;
            }
            if (outputs.is_none()) {
              py::gil_scoped_release unlocked;
              engine.respond(batch, after, compute_start_ns);
              return;
            }
            const afd::EngineSpec& spec = c->spec();
            const bool list =
                py::isinstance<py::list>(outputs) || py::isinstance<py::tuple>(outputs);
            if (!list && batch.parts.size() > 1) {
              // One tensor for a packed batch: its rows, each part's at its row offset.
              if (!batch.packed)
                throw Error(HM_ERR_INVALID_ARGUMENT,
                            fmt::format("respond: one output tensor for {} parts that do not lie "
                                        "back to back: give a list, one per part",
                                        batch.parts.size()));
              respond_from_rows(*c, std::move(batch), after, compute_start_ns, outputs,
                                job_tensor(*c, outputs, element_of(c->config().model.f2a_dtype),
                                           spec.f2a_bytes_per_token(), "respond's output"));
              return;
            }
            // The application's output tensors, one per part (None: that part's slot); one tensor
            // alone for a batch of one part (not its rows, as a list of it would be read).
            py::list each;
            if (list)
              each = py::list(outputs);
            else
              each.append(outputs);
            if (each.size() != batch.parts.size())
              throw Error(HM_ERR_INVALID_ARGUMENT, fmt::format("respond: {} outputs for {} parts",
                                                               each.size(), batch.parts.size()));
            for (size_t i = 0; i < batch.parts.size(); ++i) {
              if (each[i].is_none()) continue;
              CallerTensor t =
                  job_tensor(*c, each[i], element_of(c->config().model.f2a_dtype),
                             uint64_t{spec.hidden} * spec.f2a_bytes, "respond's outputs");
              if (t.rows < batch.parts[i].result_rows)
                throw Error(HM_ERR_INVALID_ARGUMENT,
                            fmt::format("respond: an output of {} rows for an answer of {} rows",
                                        t.rows, batch.parts[i].result_rows));
              register_tensor(*c, engine, each[i], t);
              batch.parts[i].output = t.data;
            }
            py::gil_scoped_release unlocked;
            engine.respond(batch, after, compute_start_ns);
          },
          py::arg("batch"), py::kw_only(), py::arg("stream") = py::none(),
          py::arg("compute_start_ns") = 0, py::arg("outputs") = py::none(),
          py::arg("part") = py::none(),
          "Sends each part's output back to its A: from the part's output slot, or from the "
          "application's tensors in `outputs` (one [result_rows, hidden] tensor in the F2A dtype "
          "per part, None for a slot; or one tensor of a packed batch's rows). `part`: answer "
          "that part (an index into batch.parts) alone, the others later.")
      .def(
          "inputs",
          [](py::object self, int mb, const py::object& name) {
            const auto& f = self.cast<const PyFfn&>();
            std::shared_ptr<Context> c = f.live();
            check_micro_batch(mb, c->spec());
            const int t = a2f_index(*c, name);
            return tensor_slot(ffn_of(*c).inputs(mb, t), t,
                               static_cast<uint32_t>(c->spec().ffn_rows(c->spec().rank)),
                               Owner{*c, self, f});
          },
          py::arg("micro_batch"), py::arg("name"),
          "The engine's row space of an A2F tensor for a micro-batch (every A's rows: "
          "[its As x tokens, columns]), fixed for the engine's life.")
      .def(
          "outputs",
          [](py::object self, int mb) {
            const auto& f = self.cast<const PyFfn&>();
            std::shared_ptr<Context> c = f.live();
            check_micro_batch(mb, c->spec());
            return rows_slot(ffn_of(*c).outputs(mb),
                             static_cast<uint32_t>(c->spec().ffn_rows(c->spec().rank)),
                             c->config().model.f2a_dtype, Owner{*c, self, f});
          },
          py::arg("micro_batch"),
          "The engine's output rows of a micro-batch ([its As x tokens, hidden], F2A dtype): "
          "where each part's output is unless respond() is given others.")
      .def(
          "receive_into",
          [](const PyFfn& f, int mb, const py::object& name, const py::object& tensor) {
            std::shared_ptr<Context> c = f.live();
            check_micro_batch(mb, c->spec());
            const int t = a2f_index(*c, name);
            afd::FfnEngine& engine = ffn_of(*c);
            if (tensor.is_none()) {
              py::gil_scoped_release unlocked;
              engine.receive_into(mb, t, nullptr, 0);
              return;
            }
            const afd::EngineSpec& spec = c->spec();
            const std::optional<Element> element = tensor_element(*c, t);
            CallerTensor buffer = caller_tensor(tensor, c->device(), element, spec.a2f_row_bytes(t),
                                                "receive_into's tensor");
            if (buffer.rows < spec.ffn_rows(spec.rank))
              throw Error(HM_ERR_INVALID_ARGUMENT,
                          fmt::format("receive_into: a tensor of {} rows; it holds every A's "
                                      "rows, {} ({} As x {} tokens)",
                                      buffer.rows, spec.ffn_rows(spec.rank),
                                      spec.attention_of(spec.rank), spec.tokens));
            register_tensor(*c, engine, tensor, buffer);
            py::gil_scoped_release unlocked;
            engine.receive_into(mb, t, buffer.data, buffer.bytes);
          },
          py::arg("micro_batch"), py::arg("name"), py::arg("tensor"),
          "From now on the As' rows of this A2F tensor of the micro-batch land in `tensor` "
          "([its As x tokens, columns], the same rows as the engine's row space; None: back to "
          "the engine's). Each A hears of it in order with this F's answers; a part says where "
          "its rows did land.")
      .def(
          "serve_device", [](const PyFfn& f) { ffn_of(*f.live()).serve_device(); },
          "From now on the engine's thread takes the batches and answers them when a stream "
          "says so (enqueue_wait_batch, then compute outputs(mb) from inputs(mb), then "
          "enqueue_respond); get_batch and respond are refused.")
      .def(
          "enqueue_wait_batch",
          [](const PyFfn& f, int mb, const py::object& stream) {
            std::shared_ptr<Context> c = f.live();
            ffn_of(*c).enqueue_wait_batch(mb, required_stream(stream, *c, "enqueue_wait_batch"));
          },
          py::arg("micro_batch"), py::arg("stream"),
          "Enqueues a hold until micro-batch `micro_batch`'s batch is in inputs(mb). Capturable.")
      .def(
          "enqueue_respond",
          [](const PyFfn& f, int mb, const py::object& stream) {
            std::shared_ptr<Context> c = f.live();
            ffn_of(*c).enqueue_respond(mb, required_stream(stream, *c, "enqueue_respond"));
          },
          py::arg("micro_batch"), py::arg("stream"),
          "Enqueues the ring that answers micro-batch `micro_batch` from outputs(mb). Capturable.")
      .def(
          "device_trips", [](const PyFfn& f) { return ffn_of(*f.live()).device_trips(); },
          "rung: answers rung; completed: batches raised; failed and failures; ended: why the "
          "engine raises every flag at once now.")
      .def("lost_attention", [](const PyFfn& f) { return ffn_of(*f.live()).lost_attention(); });
  bind_common<PyFfn>(ffn);

  m.def("now_ns", &afd::now_ns, "The engines' clock (steady, ns).");
}

}  // namespace hetmesh::python
