// An FfnEngine's micro-batch as Python holds it (engines.cc binds Batch and Part; stepmesh_serve.cc
// reads them without going through Python), and the device of an engine.
#pragma once

#include <hetmesh/afd/engine.hpp>
#include <hetmesh/core/device.hpp>

#include <pybind11/pybind11.h>

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

}  // namespace hetmesh::python
