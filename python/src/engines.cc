// hetmesh._native.AttentionEngine, FfnEngine, Batch, Part, RoundTrip and Stream: the AFD engines
// (afd/engine.hpp) for Python. Each engine owns what it runs on (its plugins, device and store
// connection), in an order that lets the engine go first; every slot it hands out is a DLPack
// view (slot.hpp) that keeps the engine alive. Every call that can wait releases the GIL.
#include "engines.hpp"

#include "slot.hpp"

#include <hetmesh/plugins/cuda.h>
#include <hetmesh/afd/engine.hpp>
#include <hetmesh/afd/instance.hpp>

#include <fmt/format.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <optional>
#include <vector>

namespace hetmesh::python {
namespace {

using std::chrono::milliseconds;

// What an engine runs on (afd::Instance: its plugins, device, store and the engine itself), and
// the framework streams handed to push_pull/respond/stream_wait, by native handle, each borrowed
// once (hm.cuda.native's stream_borrow) and kept for the engine's life (a few per framework).
struct Context {
  std::map<uintptr_t, Stream> borrowed;     // declared first: goes after the engine
  std::unique_ptr<afd::Instance> instance;  // its engine ends first

  const afd::JobConfig& config() const { return instance->config(); }
  const afd::EngineSpec& spec() const { return instance->spec(); }
  const Device& device() const { return instance->device(); }
};

std::unique_ptr<Context> make_context(const afd::JobConfig& config, afd::Role role, int rank,
                                      const std::string& store, const std::string& secret_file,
                                      const std::string& device) {
  auto c = std::make_unique<Context>();
  py::gil_scoped_release unlocked;  // loading plugins and reaching the store may take a while
  c->instance = afd::open_instance(config, role, rank, {store, {}, device, secret_file});
  return c;
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

void check_micro_batch(int mb, const afd::EngineSpec& spec) {
  if (mb < 0 || mb >= spec.micro_batches)
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("micro-batch {}: the engine has {} (0..{})", mb, spec.micro_batches,
                            spec.micro_batches - 1));
}

// Routing entries are {int32 expert, float weight} pairs: two strided views of the same bytes.
// They follow the tokens in a slot, so with fp8 tokens they are 4-aligned only when tokens x
// hidden is a multiple of 4: a misaligned int32 view would fault on a GPU.
void check_routing_alignment(const void* routing, const afd::EngineSpec& spec) {
  if (reinterpret_cast<uintptr_t>(routing) % alignof(int32_t) != 0)
    throw Error(HM_ERR_NOT_SUPPORTED,
                fmt::format("the routing of this slot is not 4-byte aligned (tokens {} x hidden {} "
                            "x {} byte(s) precede it): make tokens x hidden a multiple of 4",
                            spec.tokens, spec.hidden, spec.a2f_bytes));
}

Slot experts_slot(void* routing, uint32_t tokens, const afd::EngineSpec& spec, const Device& device,
                  py::object owner) {
  check_routing_alignment(routing, spec);
  return Slot(routing, {{tokens, spec.top_k}, {2 * int64_t{spec.top_k}, 2}, Element::int32}, device,
              std::move(owner));
}
Slot weights_slot(void* routing, uint32_t tokens, const afd::EngineSpec& spec, const Device& device,
                  py::object owner) {
  check_routing_alignment(routing, spec);
  return Slot(static_cast<char*>(routing) + sizeof(int32_t),
              {{tokens, spec.top_k}, {2 * int64_t{spec.top_k}, 2}, Element::fp32}, device,
              std::move(owner));
}
Slot rows_slot(void* data, uint32_t tokens, const afd::EngineSpec& spec, afd::Dtype dtype,
               const Device& device, py::object owner) {
  return Slot(data, {{tokens, spec.hidden}, {}, element_of(dtype)}, device, std::move(owner));
}

// A stream of the engine's device, for push_pull/respond readiness. Keeps the engine (and so its
// device) alive.
struct PyStream {
  Stream stream;
  py::object owner;
};

PyStream make_stream(py::object owner, const Device& device) {
  return PyStream{device.create_stream(), std::move(owner)};
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
template <typename Engine, afd::Role kRole>
class PyEngine {
 public:
  PyEngine(const afd::JobConfig& config, int rank, const std::string& store,
           const std::string& secret_file, const std::string& device)
      : context_(make_context(config, kRole, rank, store, secret_file, device)) {
    py::gil_scoped_release unlocked;  // waits for every peer
    engine();
  }
  ~PyEngine() {
    py::gil_scoped_release unlocked;  // tells the peers, joins the engine's threads
    context_.reset();
  }
  Engine& engine() {
    if (shut_down_)
      throw Error(HM_ERR_INVALID_ARGUMENT, "the engine was shut down (the interpreter is exiting)");
    if constexpr (kRole == afd::Role::attention)
      return context_->instance->attention();
    else
      return context_->instance->ffn();
  }
  Context& context() { return *context_; }
  // At the interpreter's exit (the package's atexit hook): the engine tells its peers and stops
  // its threads while everything it uses still exists. Its memory goes with it.
  void shutdown() {
    py::gil_scoped_release unlocked;
    shut_down_ = true;
    context_->instance->close();
  }

 private:
  std::unique_ptr<Context> context_;
  bool shut_down_ = false;
};

using PyAttention = PyEngine<afd::AttentionEngine, afd::Role::attention>;
using PyFfn = PyEngine<afd::FfnEngine, afd::Role::ffn>;

// One A's part of a micro-batch, as an F sees it.
struct PyPart {
  afd::Batch::FromAttention part;
  py::object engine;  // the PyFfn whose memory the slots are in
  const Context* context = nullptr;
};

struct PyBatch {
  afd::Batch batch;
  py::object parts;              // a list of Part
  const void* engine = nullptr;  // the FfnEngine it came from: only it may respond to it
};

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

}  // namespace

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

  py::class_<afd::RoundTrip>(m, "RoundTrip", "Timestamps of one round trip (ns, A's clock).")
      .def_readonly("micro_batch", &afd::RoundTrip::micro_batch)
      .def_readonly("sequence", &afd::RoundTrip::sequence)
      .def_readonly("push_start", &afd::RoundTrip::push_start)
      .def_readonly("posted", &afd::RoundTrip::posted)
      .def_readonly("completed", &afd::RoundTrip::completed)
      .def_readonly("wait_returned", &afd::RoundTrip::wait_returned);

  py::class_<PyAttention>(m, "AttentionEngine")
      .def(py::init<const afd::JobConfig&, int, const std::string&, const std::string&,
                    const std::string&>(),
           py::arg("config"), py::arg("rank"), py::arg("store"), py::arg("secret_file"),
           py::arg("device"))
      .def(
          "tokens",
          [](py::object self, int mb) {
            auto& a = self.cast<PyAttention&>();
            const afd::EngineSpec& spec = a.context().spec();
            check_micro_batch(mb, spec);
            return rows_slot(a.engine().tokens(mb), spec.tokens, spec,
                             a.context().config().model.a2f_dtype, a.context().device(), self);
          },
          py::arg("micro_batch"), "[tokens, hidden] in the A2F dtype: what push_pull sends.")
      .def(
          "experts",
          [](py::object self, int mb) {
            auto& a = self.cast<PyAttention&>();
            check_micro_batch(mb, a.context().spec());
            return experts_slot(a.engine().routing(mb), a.context().spec().tokens,
                                a.context().spec(), a.context().device(), self);
          },
          py::arg("micro_batch"), "[tokens, top_k] int32: each token's experts.")
      .def(
          "weights",
          [](py::object self, int mb) {
            auto& a = self.cast<PyAttention&>();
            check_micro_batch(mb, a.context().spec());
            return weights_slot(a.engine().routing(mb), a.context().spec().tokens,
                                a.context().spec(), a.context().device(), self);
          },
          py::arg("micro_batch"), "[tokens, top_k] float32: each token's expert weights.")
      .def(
          "result",
          [](py::object self, int mb, int ffn) {
            auto& a = self.cast<PyAttention&>();
            const afd::EngineSpec& spec = a.context().spec();
            check_micro_batch(mb, spec);
            if (ffn < 0 || ffn >= spec.ffn)
              throw Error(HM_ERR_INVALID_ARGUMENT,
                          fmt::format("ffn {}: the job has {} FFN instance(s)", ffn, spec.ffn));
            return rows_slot(a.engine().result(mb, ffn), spec.tokens, spec,
                             a.context().config().model.f2a_dtype, a.context().device(), self);
          },
          py::arg("micro_batch"), py::arg("ffn"),
          "[tokens, hidden] in the F2A dtype: where F `ffn`'s partial result lands.")
      .def(
          "push_pull",
          [](PyAttention& a, int mb, std::optional<uint32_t> tokens, uint64_t tag,
             const py::object& stream, int64_t attention_start_ns) {
            afd::PushOptions push;
            push.ready.stream = stream_of(stream, a.context());
            push.tag = tag;
            push.attention_start_ns = attention_start_ns;
            py::gil_scoped_release unlocked;
            return a.engine().push_pull(mb, tokens.value_or(a.context().spec().tokens), push);
          },
          py::arg("micro_batch"), py::arg("tokens") = py::none(), py::kw_only(), py::arg("tag") = 0,
          py::arg("stream") = py::none(), py::arg("attention_start_ns") = 0)
      .def(
          "wait",
          [](PyAttention& a, afd::AttentionEngine::Handle handle,
             std::optional<double> timeout_ms) {
            milliseconds timeout = timeout_or(timeout_ms, a.context());
            py::gil_scoped_release unlocked;
            return a.engine().wait(handle, timeout);
          },
          py::arg("handle"), py::arg("timeout_ms") = py::none())
      .def(
          "stream_wait",
          [](PyAttention& a, afd::AttentionEngine::Handle handle, const py::object& stream) {
            const Stream* on = stream_of(stream, a.context());
            if (on == nullptr)
              throw Error(HM_ERR_INVALID_ARGUMENT,
                          "stream_wait: name the stream that is to wait (engine.create_stream() "
                          "or a framework's stream)");
            a.engine().stream_wait(handle, *on);
          },
          py::arg("handle"), py::arg("stream"),
          "Later work on `stream` waits, without the host, until the round trip of `handle` has "
          "settled (its results arrived, or it failed, or the engine ended); wait(handle) still "
          "says which.")
      .def(
          "wait_for_peers",
          [](PyAttention& a, std::optional<double> timeout_ms) {
            milliseconds timeout = timeout_or(timeout_ms, a.context());
            py::gil_scoped_release unlocked;
            return a.engine().wait_for_peers(timeout);
          },
          py::arg("timeout_ms") = py::none())
      .def(
          "finish", [](PyAttention& a) { a.engine().finish(); },
          py::call_guard<py::gil_scoped_release>())
      .def("peers", [](PyAttention& a) { return peers_of(a.engine()); })
      .def(
          "_round_trips_from_cpp",
          [](PyAttention& a, int mb, int count) {
            // The baseline of python/hetmesh/bench.py: the same push_pull + wait as Python's
            // loop, from C++, timed the same way (each round trip alone in flight).
            check_micro_batch(mb, a.context().spec());
            std::vector<int64_t> ns(static_cast<size_t>(std::max(count, 0)));
            py::gil_scoped_release unlocked;
            for (int64_t& sample : ns) {
              int64_t start = afd::now_ns();
              a.engine().wait(a.engine().push_pull(mb, a.context().spec().tokens),
                              a.context().config().job.timeout);
              sample = afd::now_ns() - start;
            }
            return ns;
          },
          py::arg("micro_batch"), py::arg("count"))
      .def(
          "create_stream",
          [](py::object self) {
            return make_stream(self, self.cast<PyAttention&>().context().device());
          },
          "A stream of this engine's device, for push_pull(stream=...).")
      .def("_shutdown", &PyAttention::shutdown)
      .def_property_readonly("epoch", [](PyAttention& a) { return a.engine().epoch(); })
      .def_property_readonly("rank", [](PyAttention& a) { return a.context().spec().rank; })
      .def_property_readonly("device",
                             [](PyAttention& a) { return a.context().device().selector(); })
      .def_property_readonly("config", [](PyAttention& a) { return a.context().config(); });

  py::class_<PyPart>(m, "Part", gc_visible<PyPart, &PyPart::engine>(),
                     "One attention instance's part of a micro-batch.")
      .def_property_readonly("rank", [](const PyPart& p) { return p.part.rank; })
      .def_property_readonly("epoch", [](const PyPart& p) { return p.part.epoch; })
      .def_property_readonly("sequence", [](const PyPart& p) { return p.part.sequence; })
      .def_property_readonly("tag", [](const PyPart& p) { return p.part.tag; })
      .def_property_readonly(
          "count", [](const PyPart& p) { return p.part.tokens; }, "the tokens this A sent")
      .def_property_readonly(
          "tokens",
          [](const PyPart& p) {
            return rows_slot(p.part.tokens_data, p.part.tokens, p.context->spec(),
                             p.context->config().model.a2f_dtype, p.context->device(), p.engine);
          })
      .def_property_readonly("experts",
                             [](const PyPart& p) {
                               return experts_slot(p.part.routing_data, p.part.tokens,
                                                   p.context->spec(), p.context->device(),
                                                   p.engine);
                             })
      .def_property_readonly("weights",
                             [](const PyPart& p) {
                               return weights_slot(p.part.routing_data, p.part.tokens,
                                                   p.context->spec(), p.context->device(),
                                                   p.engine);
                             })
      .def_property_readonly("output", [](const PyPart& p) {
        return rows_slot(p.part.output, p.part.tokens, p.context->spec(),
                         p.context->config().model.f2a_dtype, p.context->device(), p.engine);
      });

  py::class_<PyBatch>(m, "Batch", gc_visible<PyBatch, &PyBatch::parts>(),
                      "A micro-batch as an FFN instance got it.")
      .def_property_readonly("micro_batch", [](const PyBatch& b) { return b.batch.micro_batch; })
      .def_readonly("parts", &PyBatch::parts);

  py::class_<PyFfn>(m, "FfnEngine")
      .def(py::init<const afd::JobConfig&, int, const std::string&, const std::string&,
                    const std::string&>(),
           py::arg("config"), py::arg("rank"), py::arg("store"), py::arg("secret_file"),
           py::arg("device"))
      .def(
          "get_batch",
          [](py::object self, std::optional<double> timeout_ms) -> std::optional<PyBatch> {
            auto& f = self.cast<PyFfn&>();
            milliseconds timeout = timeout_or(timeout_ms, f.context());
            std::optional<afd::Batch> batch;
            {
              py::gil_scoped_release unlocked;
              batch = f.engine().get_batch(timeout);
            }
            if (!batch) return std::nullopt;
            py::list parts;
            for (const auto& part : batch->parts)
              parts.append(PyPart{part, self, &f.context()});
            return PyBatch{std::move(*batch), std::move(parts), &f};
          },
          py::arg("timeout_ms") = py::none(),
          "The next micro-batch, or None once every attention instance has left.")
      .def(
          "respond",
          [](PyFfn& f, const PyBatch& b, const py::object& stream, int64_t compute_start_ns) {
            if (b.engine != &f)
              throw Error(HM_ERR_INVALID_ARGUMENT,
                          "respond: this batch came from another FfnEngine's get_batch");
            const Stream* after = stream_of(stream, f.context());
            py::gil_scoped_release unlocked;
            f.engine().respond(b.batch, after, compute_start_ns);
          },
          py::arg("batch"), py::kw_only(), py::arg("stream") = py::none(),
          py::arg("compute_start_ns") = 0)
      .def("lost_attention", [](PyFfn& f) { return f.engine().lost_attention(); })
      .def("peers", [](PyFfn& f) { return peers_of(f.engine()); })
      .def(
          "create_stream",
          [](py::object self) { return make_stream(self, self.cast<PyFfn&>().context().device()); },
          "A stream of this engine's device, for respond(stream=...).")
      .def("_shutdown", &PyFfn::shutdown)
      .def_property_readonly("epoch", [](PyFfn& f) { return f.engine().epoch(); })
      .def_property_readonly("rank", [](PyFfn& f) { return f.context().spec().rank; })
      .def_property_readonly("device", [](PyFfn& f) { return f.context().device().selector(); })
      .def_property_readonly("config", [](PyFfn& f) { return f.context().config(); });

  m.def("now_ns", &afd::now_ns, "The engines' clock (steady, ns).");
}

}  // namespace hetmesh::python
