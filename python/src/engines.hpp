// The engines, their job config and the store, bound for Python (engines.cc, store.cc), and
// hetmesh.stepmesh's server in steady state (stepmesh_serve.cc).
#pragma once

#include <pybind11/pybind11.h>

namespace hetmesh::python {

namespace py = pybind11;

void bind_config(py::module_& m);
void bind_store(py::module_& m);
void bind_engines(py::module_& m);
void bind_stepmesh_serve(py::module_& m);  // stepmesh_serve.cc

}  // namespace hetmesh::python
