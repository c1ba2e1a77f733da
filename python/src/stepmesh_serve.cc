// hetmesh.stepmesh's server in steady state, without Python per part: once the shim's Python made
// the views of a part (the tensors get_batch hands out for where its bytes lie) and used an
// answer's memory in place, the next batches whose every part lies where one did before are handed
// out from here, and respond() from memory used before goes to the engine from here. Everything
// else (a new layout or place, memory not seen yet, a call to refuse) goes back to the shim, which
// says why. The handlers of parts handed out live here for both paths.
#include "engines.hpp"
#include "ffn_batch.hpp"
#include "learnt_memory.hpp"

#include <algorithm>
#include <array>
#include <cstdint>
#include <map>
#include <numeric>
#include <optional>
#include <utility>
#include <vector>

namespace hetmesh::python {
namespace {

// Where a part's bytes lie, which is all its views depend on: its A and that A's incarnation
// (whose layout numbers are its own), the layout, the micro-batch, its first row and every
// tensor's rows.
struct Place {
  int rank = 0;
  uint64_t epoch = 0;
  uint64_t tag = 0;
  int micro_batch = 0;
  uint32_t row_offset = 0;
  std::array<uint32_t, afd::kMaxA2fTensors> rows{};
  auto operator<=>(const Place&) const = default;
};

Place place_of(const afd::Batch::FromAttention& part, int micro_batch) {
  return Place{part.rank, part.epoch, part.tag, micro_batch, part.row_offset, part.rows};
}

class StepMeshServer {
 public:
  // `current_stream`: a callable giving, for a device index, the stream an answer with need_event
  // is ordered after (torch's current stream of the engine's GPU), or None on the host.
  StepMeshServer(py::object engine, py::object current_stream)
      : engine_(std::move(engine)),
        device_(ffn_device(engine_)),
        current_stream_(std::move(current_stream)) {}

  // The engine's next batch as [(handler, tensors, keys)] in worker order, when each part lies
  // where one did before; else the Batch itself, for the shim; None once every worker has left.
  py::object get_batch(const py::object& timeout_ms) {
    py::object batch = engine_.attr("get_batch")(timeout_ms);
    if (batch.is_none()) return batch;
    const auto& b = batch.cast<const PyBatch&>();
    const int mb = b.batch.micro_batch;
    std::vector<size_t> order(b.batch.parts.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) {
      return b.batch.parts[x].rank < b.batch.parts[y].rank;
    });
    std::vector<Views> found;  // references of their own: nothing here may hold into views_
    found.reserve(order.size());
    for (size_t i : order) {
      auto it = views_.find(place_of(b.batch.parts[i], mb));
      if (it == views_.end()) return batch;
      found.push_back(it->second);
    }
    py::list out;
    for (size_t k = 0; k < order.size(); ++k) {
      const int64_t handler = hand_out(batch, order[k]);
      // New lists from the kept tuples: the caller may change them.
      out.append(py::make_tuple(handler, py::list(found[k].tensors), py::list(found[k].keys)));
    }
    ++batches_from_cpp_;
    return out;
  }

  // The shim made `tensors` and `keys` for `part` of micro-batch `micro_batch`.
  void learn(const py::handle& part, int micro_batch, const py::list& tensors,
             const py::list& keys) {
    if (views_.size() >= LearntMemory::kMaxRemembered) drop(views_);
    views_[place_of(part.cast<const PyPart&>().part, micro_batch)] =
        Views{py::tuple(tensors), py::tuple(keys)};
  }

  // Worker `rank` said a layout number again with another layout (it was replaced, and numbers
  // from 1 again): the views of its parts are made anew.
  void forget(int rank) {
    std::erase_if(views_, [rank](const auto& entry) { return entry.first.rank == rank; });
  }

  // A handler for part `index` of `batch`.
  int64_t hand_out(const py::object& batch, size_t index) {
    const int64_t handler = next_handler_++;
    handed_.emplace(handler, Handed{batch, index});
    return handler;
  }

  // The batch and part index of a handler handed out and not answered (it is then no longer
  // handed out), or None.
  py::object take(int64_t handler) {
    auto it = handed_.find(handler);
    if (it == handed_.end()) return py::none();
    py::tuple entry = py::make_tuple(it->second.batch, it->second.index);
    handed_.erase(it);
    return entry;
  }

  // Hands `handler` out again (its answer failed: it may be answered again).
  void put_back(int64_t handler, const py::object& batch, size_t index) {
    handed_.emplace(handler, Handed{batch, index});
  }

  // Answers `handler` from the one tensor in `tensors` when it is memory the shim used in place
  // before, of the answer's size: true once sent. False (nothing done) for the shim to answer or
  // refuse. Raises what the engine raises (the handler stays, to answer again).
  bool respond(const py::handle& tensors, int64_t handler, bool need_event) {
    if (!(PyList_CheckExact(tensors.ptr()) || PyTuple_CheckExact(tensors.ptr())) ||
        py::len(tensors) != 1)
      return false;
    auto it = handed_.find(handler);
    if (it == handed_.end()) return false;
    const Handed entry = it->second;
    const py::object tensor = tensors[py::int_(0)];
    // Reading the tensor runs its __dlpack__ (Python): look the entry up again after.
    std::optional<CallerTensor> t = read(tensor);
    const auto& b = entry.batch.cast<const PyBatch&>();
    const afd::Batch::FromAttention& part = b.batch.parts.at(entry.index);
    if (!t || t->bytes != part.result_rows || !memory_.known(*t)) return false;
    // Taken while the engine sends (it lets other threads run); handed out again if it fails.
    if (handed_.erase(handler) == 0) return false;
    py::object stream =
        need_event && !current_stream_.is_none() ? current_stream_(device_.index()) : py::none();
    py::list outputs;
    outputs.append(tensor);
    try {
      using namespace pybind11::literals;
      engine_.attr("respond")(entry.batch, "stream"_a = stream, "outputs"_a = outputs,
                              "part"_a = entry.index);
    } catch (...) {
      handed_.emplace(handler, entry);
      throw;
    }
    hold(b.batch.micro_batch, part.rank, tensor);
    ++answers_from_cpp_;
    return true;
  }

  // The shim answered from `tensor` in place: its memory may be answered from here next time.
  void learn_output(const py::handle& tensor) {
    if (std::optional<CallerTensor> t = read(tensor)) memory_.learn(*t);
  }

  // The tensor the answer of (micro-batch, worker) is sent from, held until that slot's next
  // answer (its worker pushes again only once this one arrived), as StepMesh's responses hold
  // theirs: the engine sends after respond() returns.
  void hold(int micro_batch, int rank, py::object tensor) {
    answering_[{micro_batch, rank}] = std::move(tensor);
  }

  py::dict counters() const {
    py::dict out;
    out["batches_from_cpp"] = batches_from_cpp_;
    out["answers_from_cpp"] = answers_from_cpp_;
    out["parts_unanswered"] = handed_.size();
    return out;
  }

  // Drops the engine's batches and views and the application's tensors, for the engine's close.
  void close() {
    drop(views_);
    drop(handed_);
    drop(answering_);
    memory_.forget();
  }

 private:
  struct Views {
    py::tuple tensors;
    py::tuple keys;
  };
  struct Handed {
    py::object batch;
    size_t index = 0;
  };

  // A tensor as contiguous bytes of the engine's device, or nullopt (a scalar, memory elsewhere,
  // not a tensor): the shim decides about those (and about an empty answer, never known).
  std::optional<CallerTensor> read(const py::handle& tensor) const {
    return caller_tensor_or_none(tensor, device_, std::nullopt, 0, "respond's tensor");
  }

  py::object engine_;
  Device device_;
  py::object current_stream_;
  std::map<Place, Views> views_;
  std::map<int64_t, Handed> handed_;
  int64_t next_handler_ = 1;
  std::map<std::pair<int, int>, py::object> answering_;
  LearntMemory memory_;  // where answers went from in place
  uint64_t batches_from_cpp_ = 0;
  uint64_t answers_from_cpp_ = 0;
};

}  // namespace

void bind_stepmesh_serve(py::module_& m) {
  py::class_<StepMeshServer>(m, "_StepMeshServer",
                             "hetmesh.stepmesh's get_batch and respond in steady state (private).")
      .def(py::init<py::object, py::object>(), py::arg("engine"), py::arg("current_stream"))
      .def("get_batch", &StepMeshServer::get_batch, py::arg("timeout_ms"))
      .def("learn", &StepMeshServer::learn, py::arg("part"), py::arg("micro_batch"),
           py::arg("tensors"), py::arg("keys"))
      .def("forget", &StepMeshServer::forget, py::arg("rank"))
      .def("hand_out", &StepMeshServer::hand_out, py::arg("batch"), py::arg("index"))
      .def("take", &StepMeshServer::take, py::arg("handler"))
      .def("put_back", &StepMeshServer::put_back, py::arg("handler"), py::arg("batch"),
           py::arg("index"))
      .def("respond", &StepMeshServer::respond, py::arg("tensors"), py::arg("handler"),
           py::arg("need_event"))
      .def("learn_output", &StepMeshServer::learn_output, py::arg("tensor"))
      .def("hold", &StepMeshServer::hold, py::arg("micro_batch"), py::arg("rank"),
           py::arg("tensor"))
      .def("counters", &StepMeshServer::counters)
      .def("close", &StepMeshServer::close);
}

}  // namespace hetmesh::python
