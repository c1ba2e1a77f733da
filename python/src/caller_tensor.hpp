// The application's tensors handed to an engine (push_pull's send, routing and results_into,
// respond's outputs), read through their DLPack capsule without taking them: each is checked for
// the engine's device, C order and the job's element type, so a tensor of another dtype is
// refused rather than sent as bytes of the wrong type.
#pragma once

#include "slot.hpp"

#include <hetmesh/core/device.hpp>

#include <pybind11/pybind11.h>

#include <cstdint>
#include <optional>
#include <vector>

namespace hetmesh::python {

namespace py = pybind11;

struct CallerTensor {
  void* data = nullptr;
  uint64_t rows = 0;   // the first dimension
  uint64_t bytes = 0;  // the whole tensor's
};

// `object` (anything with __dlpack__: a torch tensor, a numpy array) as rows of `row_bytes` bytes
// in memory of `device`, its elements `element` (nullopt: any 4-byte type, for routing's
// (int32, float32) pairs); row_bytes 0 takes any tensor as plain memory. `what` names it in
// errors; `shape`, where given, gets its dimensions. Throws Error(INVALID_ARGUMENT).
CallerTensor caller_tensor(const py::handle& object, const Device& device,
                           std::optional<Element> element, uint64_t row_bytes, const char* what,
                           std::vector<int64_t>* shape = nullptr);

}  // namespace hetmesh::python
