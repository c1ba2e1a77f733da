// An FfnEngine's micro-batch as Python holds it (engines.cc binds Batch and Part; stepmesh_serve.cc
// reads them without going through Python), the device of an engine, and the engines' per-layer
// calls made from C++.
#pragma once

#include "caller_tensor.hpp"

#include <hetmesh/afd/engine.hpp>
#include <hetmesh/core/device.hpp>

#include <pybind11/pybind11.h>

#include <cstdint>
#include <optional>

namespace hetmesh::python {

namespace py = pybind11;

// One A's part of a micro-batch, as an F sees it.
struct PyPart {
  afd::Batch::FromAttention part;
  py::object engine;  // the PyFfn whose memory the slots are in
};

struct PyBatch {
  afd::Batch batch;
  py::object parts;              // a list of Part
  const void* engine = nullptr;  // the FfnEngine it came from: only it may respond to it
};

// The device an open FfnEngine (a PyFfn) or AttentionEngine (a PyAttention) runs on. Throws if it
// was closed.
Device ffn_device(const py::handle& engine);
Device attention_device(const py::handle& engine);

// The engines' per-layer calls as the connector's C++ makes them (engines.cc): what Python's
// push_pull, wait and respond do, without Python's call and keyword dispatch, from a tensor the
// caller read already (caller_tensor.hpp, with the job's element and row size). Throw what those
// throw (hetmesh::Error for the engine's refusals and failures).
// push_pull(micro_batch, read.rows, send=tensor, results_into=tensor, stream=, row_offset=).
uint64_t push_pull_in_place(const py::handle& attention, int micro_batch, const py::object& tensor,
                            const CallerTensor& read, const py::object& stream,
                            std::optional<uint32_t> row_offset);
// wait(handle), with the job's timeout.
void wait_for_answer(const py::handle& attention, uint64_t handle);
// respond(batch, stream=, outputs=output) of a packed batch.
void respond_in_place(const py::handle& ffn, const PyBatch& batch, const py::object& stream,
                      const py::handle& output, const CallerTensor& read);

}  // namespace hetmesh::python
