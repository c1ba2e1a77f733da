// hetmesh.vllm_afd's A side per layer, without Python in steady state: a send from hidden states
// whose memory the connector used in place before (the answer landing in the same tensor) goes to
// the engine from here, at the row offset this step's counts give, and so do its wait and answer.
// Everything else (router logits, memory not seen yet, rows the counts do not give, a call to
// refuse) goes back to the connector's Python, which keeps its sends here as well.
#include "engines.hpp"
#include "ffn_batch.hpp"
#include "learnt_memory.hpp"

#include <hetmesh/afd/job_config.hpp>
#include <hetmesh/core/error.hpp>

#include <cstdint>
#include <map>
#include <optional>
#include <utility>

namespace hetmesh::python {
namespace {

class ConnectorAttention {
 public:
  // `current_stream(index)`: the stream a send is ordered after (torch's current raw stream of
  // the engine's GPU), or None on the host.
  ConnectorAttention(py::object engine, py::object current_stream)
      : engine_(std::move(engine)),
        device_(attention_device(engine_)),
        current_stream_(std::move(current_stream)) {
    const py::object config = engine_.attr("config");  // a copy: `model` points into it
    const auto& model = config.cast<const afd::JobConfig&>().model;
    a2f_element_ = element_of(model.a2f_dtype);
    row_bytes_ = uint64_t(model.hidden) * afd::dtype_bytes(model.a2f_dtype);
    in_place_ = model.a2f_dtype == model.f2a_dtype;  // an answer may land where its rows were
  }

  // This step's rows and row offset per stage ({stage: (rows, offset)}), from its counts; a
  // stage given as (-1, 0) has counts that do not fit the job, for Python to refuse.
  void set_offsets(const py::dict& offsets) {
    offsets_.clear();
    for (const auto& [stage, entry] : offsets) {
      const auto pair = entry.cast<std::pair<int64_t, int64_t>>();
      offsets_[stage.cast<int>()] = pair;
    }
  }

  // Sends `tensor`'s rows as `metadata`'s stage in place where its memory was used so before and
  // everything fits: true once sent. False (nothing done) for Python to send or refuse.
  bool send(const py::handle& tensor, const py::handle& metadata) {
    if (!in_place_) return false;
    const int stage = metadata.attr("stage_idx").cast<int>();
    if (sent_.contains(stage)) return false;
    std::optional<CallerTensor> t = read(tensor);  // runs its __dlpack__ (Python)
    if (!t || !memory_.known(*t) || t->rows != metadata.attr("total_tokens").cast<uint64_t>())
      return false;
    std::optional<uint32_t> row_offset;
    if (auto it = offsets_.find(stage); it != offsets_.end()) {
      const auto [rows, offset] = it->second;
      if (rows != static_cast<int64_t>(t->rows) || offset < 0 || offset > UINT32_MAX) return false;
      row_offset = static_cast<uint32_t>(offset);
    }
    py::object stream = current_stream_.is_none() ? py::none() : current_stream_(device_.index());
    const auto sent = py::reinterpret_borrow<py::object>(tensor);
    const uint64_t handle = push_pull_in_place(engine_, stage, sent, *t, stream, row_offset);
    // Held until its answer is in: the engine reads and writes it after this returns.
    sent_[stage] = py::make_tuple(handle, sent, t->rows, true, py::none());
    ++sends_from_cpp_;
    return true;
  }

  // Waits for `stage`'s answer where it was sent in place and lands in `ref` (the tensor sent, or
  // None), and returns that tensor; None (nothing done) for Python. Raises what the wait raises:
  // a timeout keeps the send, to wait again; any other failure ends it.
  py::object receive(int stage, const py::handle& ref) {
    auto it = sent_.find(stage);
    if (it == sent_.end()) return py::none();
    const py::tuple entry = it->second;  // (handle, tensor, rows, in place, router logits)
    const py::object sent = entry[1];
    if (!entry[3].cast<bool>() || !(ref.is_none() || ref.is(sent))) return py::none();
    try {
      wait_for_answer(engine_, entry[0].cast<uint64_t>());
    } catch (const Error& e) {
      if (e.status() != HM_ERR_TIMEOUT) sent_.erase(stage);
      throw;
    } catch (...) {
      sent_.erase(stage);
      throw;
    }
    sent_.erase(stage);
    ++receives_from_cpp_;
    return sent;
  }

  // Python's own sends: `entry` is (handle, tensor, rows, in place, router logits).
  py::object sent(int stage) const {
    auto it = sent_.find(stage);
    return it == sent_.end() ? py::object(py::none()) : py::object(it->second);
  }
  void put(int stage, const py::tuple& entry) { sent_[stage] = entry; }
  void pop(int stage) { take_from(sent_, stage); }

  // Python sent from `tensor` in place, for good: such memory is sent from here next time.
  void learn(const py::handle& tensor) {
    if (std::optional<CallerTensor> t = read(tensor)) memory_.learn(*t);
  }

  // Such memory turned out to go through host staging: everything learnt is forgotten.
  void forget() { memory_.forget(); }

  py::dict counters() const {
    py::dict out;
    out["sends_from_cpp"] = sends_from_cpp_;
    out["receives_from_cpp"] = receives_from_cpp_;
    return out;
  }

  // Drops the sends and the application's tensors, for the engine's close.
  void close() {
    drop(sent_);
    memory_.forget();
    offsets_.clear();
  }

 private:
  // A tensor as rows of the job's A2F element and width on the engine's device, or nullopt.
  std::optional<CallerTensor> read(const py::handle& tensor) const {
    return caller_tensor_or_none(tensor, device_, a2f_element_, row_bytes_,
                                 "send_attn_output's tensor");
  }

  py::object engine_;
  Device device_;
  py::object current_stream_;
  Element a2f_element_;  // the job's hidden states: rows of this element and width
  uint64_t row_bytes_;
  bool in_place_;
  std::map<int, std::pair<int64_t, int64_t>> offsets_;  // stage -> (rows, row offset)
  std::map<int, py::tuple> sent_;                       // stage -> its send, until its answer is in
  LearntMemory memory_;                                 // where sends went from in place
  uint64_t sends_from_cpp_ = 0;
  uint64_t receives_from_cpp_ = 0;
};

}  // namespace

void bind_connector_attention(py::module_& m) {
  py::class_<ConnectorAttention>(m, "_ConnectorAttention",
                                 "hetmesh.vllm_afd's A side per layer in steady state (private).")
      .def(py::init<py::object, py::object>(), py::arg("engine"), py::arg("current_stream"))
      .def("set_offsets", &ConnectorAttention::set_offsets, py::arg("offsets"))
      .def("send", &ConnectorAttention::send, py::arg("tensor"), py::arg("metadata"))
      .def("receive", &ConnectorAttention::receive, py::arg("stage"), py::arg("ref"))
      .def("sent", &ConnectorAttention::sent, py::arg("stage"))
      .def("put", &ConnectorAttention::put, py::arg("stage"), py::arg("entry"))
      .def("pop", &ConnectorAttention::pop, py::arg("stage"))
      .def("learn", &ConnectorAttention::learn, py::arg("tensor"))
      .def("forget", &ConnectorAttention::forget)
      .def("counters", &ConnectorAttention::counters)
      .def("close", &ConnectorAttention::close);
}

}  // namespace hetmesh::python
