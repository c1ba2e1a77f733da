// hetmesh.vllm_afd's F side per layer, without Python in steady state: the batches of stages got
// ahead of their turn and those received but not answered live here, a packed batch is handed out
// as a view of the engine's rows (made once per stage and row count), and an answer from memory
// the connector used in place before goes to the engine from here. Everything else (rows that did
// not land back to back, router logits, memory not seen yet, a call to refuse) goes back to the
// connector's Python, which takes the batch from here and says why.
#include "engines.hpp"
#include "ffn_batch.hpp"
#include "learnt_memory.hpp"

#include <hetmesh/afd/job_config.hpp>
#include <hetmesh/core/error.hpp>

#include <fmt/format.h>

#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <utility>

namespace hetmesh::python {
namespace {

class ConnectorFfn {
 public:
  // `rows_view(stage, count)`: the first `count` rows of the engine's row space of `stage`, as a
  // tensor. `current_stream(index)`: the stream an answer is ordered after (torch's current raw
  // stream of the engine's GPU), or None on the host.
  ConnectorFfn(py::object engine, int rank, py::object rows_view, py::object current_stream)
      : engine_(std::move(engine)),
        device_(ffn_device(engine_)),
        rank_(rank),
        rows_view_(std::move(rows_view)),
        current_stream_(std::move(current_stream)) {
    const py::object config = engine_.attr("config");  // a copy: `model` points into it
    const auto& model = config.cast<const afd::JobConfig&>().model;
    f2a_element_ = element_of(model.f2a_dtype);
    row_bytes_ = uint64_t(model.hidden) * afd::dtype_bytes(model.f2a_dtype);
  }

  // Waits for `stage`'s batch (holding any other stage's that comes first) and opens it: a packed
  // batch as (rows, seq_lens), else the Batch, for Python; None once every A of the group left.
  py::object receive(int stage, const py::object& timeout_ms) {
    if (open_.contains(stage))
      throw std::runtime_error(fmt::format(
          "hetmesh connector: stage {} received again before its send_ffn_output", stage));
    py::object batch = take_from(held_, stage);
    while (batch.is_none()) {
      py::object got = engine_.attr("get_batch")(timeout_ms);
      if (got.is_none()) return got;
      const int mb = got.cast<const PyBatch&>().batch.micro_batch;
      if (mb == stage)
        batch = std::move(got);
      else if (held_.contains(mb))
        throw Error(kStatusProtocolError,
                    fmt::format("hetmesh connector (ffn {}): a second batch of stage {} came "
                                "while the runner waited for stage {}",
                                rank_, mb, stage));
      else
        held_.emplace(mb, std::move(got));
    }
    // Its As pushed again, so they have the last answer of this stage: its tensor may go.
    py::object answered = take_from(answering_, stage);
    open_.emplace(stage, batch);
    const afd::Batch& b = batch.cast<const PyBatch&>().batch;
    if (!b.packed) return batch;
    // Its parts in row order, which is their As' rank order (they push at the offsets the step's
    // counts give).
    py::list seq_lens;
    for (const auto& part : b.parts)
      seq_lens.append(part.tokens);
    ++batches_from_cpp_;
    return py::make_tuple(rows(stage, b.packed_rows), seq_lens);
  }

  // The open batch of `stage` (for Python's answer or its router logits), or None.
  py::object batch(int stage) const {
    auto it = open_.find(stage);
    return it == open_.end() ? py::object(py::none()) : it->second;
  }

  // Closes `stage`'s open batch and gives it to Python to answer, or None where none is open.
  py::object take(int stage) { return take_from(open_, stage); }

  // Answers `stage`'s open packed batch from `output` where it is memory Python used in place
  // before, of the batch's rows: true once sent. False (nothing done) for Python to answer or
  // refuse. Raises what the engine raises (the batch is closed, as Python's answers close it).
  bool respond(int stage, const py::handle& output) {
    const py::object batch = this->batch(stage);
    if (batch.is_none() || !batch.cast<const PyBatch&>().batch.packed) return false;
    std::optional<CallerTensor> t = read(output);  // runs its __dlpack__ (Python)
    if (!t || t->rows != batch.cast<const PyBatch&>().batch.packed_rows || !memory_.known(*t))
      return false;
    // Taken (again by key: reading the tensor ran Python) before the engine lets threads run.
    if (!this->batch(stage).is(batch)) return false;
    take(stage);
    py::object stream = current_stream_.is_none() ? py::none() : current_stream_(device_.index());
    respond_in_place(engine_, batch.cast<const PyBatch&>(), stream, output, *t);
    ++answers_from_cpp_;
    hold(stage, py::reinterpret_borrow<py::object>(output));
    return true;
  }

  // `output`, answered in place for `stage`, stays alive until the stage's next batch: the engine
  // reads it after respond() returns, and a caching allocator would hand its memory out again.
  void hold(int stage, py::object output) {
    py::object before = take_from(answering_, stage);
    answering_.emplace(stage, std::move(output));
  }

  // Python answered from `output` in place, for good: such memory is answered from here next time.
  void learn(const py::handle& output) {
    if (std::optional<CallerTensor> t = read(output)) memory_.learn(*t);
  }

  // Such memory turned out to go through host staging: everything learnt is forgotten.
  void forget() { memory_.forget(); }

  py::dict counters() const {
    py::dict out;
    out["batches_from_cpp"] = batches_from_cpp_;
    out["answers_from_cpp"] = answers_from_cpp_;
    return out;
  }

  // Drops the engine's batches and views and the application's tensors, for the engine's close.
  void close() {
    drop(held_);
    drop(open_);
    drop(answering_);
    drop(views_);
    memory_.forget();
  }

 private:
  // The first `count` rows of `stage`'s row space, one tensor object per stage and count (a
  // step's layers have the same counts; a slice costs a few microseconds each layer).
  py::object rows(int stage, uint32_t count) {
    const std::pair key{stage, count};
    auto it = views_.find(key);
    if (it == views_.end()) {
      py::object view = rows_view_(stage, count);
      if (views_.size() >= LearntMemory::kMaxRemembered) drop(views_);  // counts vary unbounded
      it = views_.emplace(key, std::move(view)).first;
    }
    return it->second;
  }

  // A tensor as rows of the job's F2A element and width on the engine's device, or nullopt.
  std::optional<CallerTensor> read(const py::handle& tensor) const {
    return caller_tensor_or_none(tensor, device_, f2a_element_, row_bytes_,
                                 "send_ffn_output's tensor");
  }

  py::object engine_;
  Device device_;
  int rank_;
  py::object rows_view_;
  py::object current_stream_;
  Element f2a_element_;  // the job's answers: rows of this element and width
  uint64_t row_bytes_;
  std::map<int, py::object> held_;       // stage -> its batch, got ahead of its turn
  std::map<int, py::object> open_;       // stage -> its batch, received and not answered
  std::map<int, py::object> answering_;  // stage -> the tensor its last answer is sent from
  std::map<std::pair<int, uint32_t>, py::object> views_;  // (stage, rows) -> a view of them
  LearntMemory memory_;                                   // where answers went from in place
  uint64_t batches_from_cpp_ = 0;
  uint64_t answers_from_cpp_ = 0;
};

}  // namespace

void bind_connector_ffn(py::module_& m) {
  py::class_<ConnectorFfn>(m, "_ConnectorFfn",
                           "hetmesh.vllm_afd's F side per layer in steady state (private).")
      .def(py::init<py::object, int, py::object, py::object>(), py::arg("engine"), py::arg("rank"),
           py::arg("rows_view"), py::arg("current_stream"))
      .def("receive", &ConnectorFfn::receive, py::arg("stage"), py::arg("timeout_ms"))
      .def("batch", &ConnectorFfn::batch, py::arg("stage"))
      .def("take", &ConnectorFfn::take, py::arg("stage"))
      .def("respond", &ConnectorFfn::respond, py::arg("stage"), py::arg("output"))
      .def("hold", &ConnectorFfn::hold, py::arg("stage"), py::arg("output"))
      .def("learn", &ConnectorFfn::learn, py::arg("output"))
      .def("forget", &ConnectorFfn::forget)
      .def("counters", &ConnectorFfn::counters)
      .def("close", &ConnectorFfn::close);
}

}  // namespace hetmesh::python
