// The engines, their job config and the store, bound for Python (engines.cc, store.cc), and
// hetmesh.stepmesh's server in steady state and its worker's bookkeeping (stepmesh_serve.cc,
// stepmesh_worker.cc), and hetmesh.vllm_afd's per layer (connector_ffn.cc,
// connector_attention.cc).
#pragma once

#include <pybind11/pybind11.h>

namespace hetmesh::python {

namespace py = pybind11;

void bind_config(py::module_& m);
void bind_store(py::module_& m);
void bind_engines(py::module_& m);
void bind_stepmesh_serve(py::module_& m);       // stepmesh_serve.cc
void bind_stepmesh_worker(py::module_& m);      // stepmesh_worker.cc
void bind_connector_ffn(py::module_& m);        // connector_ffn.cc
void bind_connector_attention(py::module_& m);  // connector_attention.cc

}  // namespace hetmesh::python
