// The engines, their job config and the store, bound for Python (engines.cc, store.cc).
#pragma once

#include <pybind11/pybind11.h>

namespace hetmesh::python {

namespace py = pybind11;

void bind_config(py::module_& m);
void bind_store(py::module_& m);
void bind_engines(py::module_& m);

}  // namespace hetmesh::python
