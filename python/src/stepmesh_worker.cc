// hetmesh.stepmesh's worker bookkeeping: the push_pulls in flight by handler and the round trips
// waited for (fetch_trace's), so that a push_pull in steady state (stepmesh_fast_path.hpp) and its
// wait each run one call of the shim's Python. The shim's Python path records its calls here too.
#include "engines.hpp"

#include <hetmesh/core/error.hpp>

#include <fmt/format.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <utility>

namespace hetmesh::python {
namespace {

class StepMeshWorker {
 public:
  static constexpr size_t kMaxTraces = 4096;  // round trips fetch_trace still knows

  // `timeout_error`: the exception class of a wait that timed out (the trip stays in flight).
  StepMeshWorker(py::object engine, int micro_batches, py::object timeout_error)
      : engine_(std::move(engine)),
        micro_batches_(std::max(1, micro_batches)),
        timeout_error_(std::move(timeout_error)) {}

  // The micro-batch of the next push: the n-th push of every worker is micro-batch n mod M.
  int micro_batch() const { return static_cast<int>(pushes_ % micro_batches_); }

  // push_pull of a layout and memory the shim pushed before: its handler, or None for the shim's
  // Python path (which says why where it refuses).
  py::object push_pull(const py::handle& pushes, const py::handle& keys, const py::handle& pulls,
                       const py::handle& pull_keys, bool need_event) {
    if (py::len(pull_keys) != py::len(pulls)) return py::none();
    const int mb = micro_batch();
    py::object handle = engine_.attr("_stepmesh_push")(mb, pushes, keys, pulls, need_event);
    if (handle.is_none()) return handle;
    const int64_t count =
        std::max<int64_t>(1, static_cast<int64_t>(py::len(pushes)) + (py::len(pulls) ? 1 : 0));
    // The caller's tensors are held until wait: the engine reads and writes them meanwhile.
    const auto tensors = [](const py::handle& list) {
      return py::tuple(py::reinterpret_borrow<py::object>(list));
    };
    return py::int_(track(handle.cast<uint64_t>(), count, mb, py::list(),
                          py::make_tuple(tensors(pushes), tensors(pulls))));
  }

  // A push_pull sent: its first handler (`count` handlers answer to it, get_all_handlers').
  // `copies`: the (F, pull tensor) answers the shim copies out of the engine's slots at wait.
  int64_t track(uint64_t handle, int64_t count, int mb, py::object copies, py::object tensors) {
    ++pushes_;
    const int64_t handler = next_handler_;
    next_handler_ += std::max<int64_t>(1, count);
    trips_.emplace(handler, Trip{handle, std::max<int64_t>(1, count), mb, std::move(copies),
                                 std::move(tensors)});
    return handler;
  }

  // Waits for a push_pull in flight: (micro-batch, copies), or None if `handler` is not one. A
  // wait that times out, or is refused before it waits, leaves it in flight (to wait for again);
  // any other error ends it, as it ended in the engine.
  py::object wait(int64_t handler, std::optional<double> timeout_ms) {
    if (timeout_ms && !(*timeout_ms >= 0))
      throw Error(HM_ERR_INVALID_ARGUMENT, fmt::format("timeout_ms {} is not >= 0", *timeout_ms));
    auto it = trips_.find(handler);
    if (it == trips_.end()) return py::none();
    Trip trip = std::move(it->second);
    trips_.erase(it);
    py::object result;
    try {
      result = engine_.attr("wait")(trip.handle, timeout_ms);  // lets other threads run
    } catch (py::error_already_set& e) {
      if (e.matches(timeout_error_)) trips_.emplace(handler, trip);
      throw;
    }
    // The lowest handler's goes: a push_pull waited for long after later ones may go first.
    if (traces_.size() >= kMaxTraces) traces_.erase(traces_.begin());
    traces_.insert_or_assign(handler, Traced{trip.count, std::move(result)});
    return py::make_tuple(trip.mb, std::move(trip.copies));
  }

  // How many handlers answer to the push_pull of `handler` (in flight or waited for), or 1.
  int64_t handlers(int64_t handler) const {
    if (auto it = trips_.find(handler); it != trips_.end()) return it->second.count;
    if (auto it = traces_.find(handler); it != traces_.end()) return it->second.count;
    return 1;
  }

  // The RoundTrip of the push_pull that `handler` answers to, once waited for; else None.
  py::object round_trip(int64_t handler) const {
    auto it = traces_.upper_bound(handler);
    if (it == traces_.begin()) return py::none();
    --it;
    return handler < it->first + it->second.count ? it->second.result : py::none();
  }

  // Drops the caller's tensors and the round trips, for the engine's close.
  void close() {
    std::map<int64_t, Trip> trips;
    std::map<int64_t, Traced> traces;
    trips.swap(trips_);  // their ends may run Python that calls back in here
    traces.swap(traces_);
  }

 private:
  struct Trip {
    uint64_t handle = 0;  // the engine's
    int64_t count = 1;
    int mb = 0;
    py::object copies;
    py::object tensors;
  };
  struct Traced {
    int64_t count = 1;
    py::object result;  // the engine's RoundTrip
  };

  py::object engine_;
  uint64_t micro_batches_;
  py::object timeout_error_;
  uint64_t pushes_ = 0;
  int64_t next_handler_ = 1;
  std::map<int64_t, Trip> trips_;
  std::map<int64_t, Traced> traces_;
};

}  // namespace

void bind_stepmesh_worker(py::module_& m) {
  py::class_<StepMeshWorker>(m, "_StepMeshWorker",
                             "hetmesh.stepmesh's push_pulls in flight and waited for (private).")
      .def(py::init<py::object, int, py::object>(), py::arg("engine"), py::arg("micro_batches"),
           py::arg("timeout_error"))
      .def("micro_batch", &StepMeshWorker::micro_batch)
      .def("push_pull", &StepMeshWorker::push_pull, py::arg("push_tensors"), py::arg("push_keys"),
           py::arg("pull_tensors"), py::arg("pull_keys"), py::arg("need_event"))
      .def("track", &StepMeshWorker::track, py::arg("handle"), py::arg("count"),
           py::arg("micro_batch"), py::arg("copies"), py::arg("tensors"))
      .def("wait", &StepMeshWorker::wait, py::arg("handler"), py::arg("timeout_ms"))
      .def("handlers", &StepMeshWorker::handlers, py::arg("handler"))
      .def("round_trip", &StepMeshWorker::round_trip, py::arg("handler"))
      .def("close", &StepMeshWorker::close);
}

}  // namespace hetmesh::python
