// hetmesh._native: the C++ side of `import hetmesh` (python/hetmesh/ is the Python side). Every
// hetmesh::Error becomes the hetmesh.Error subclass of its status (hetmesh/_errors.py), carrying
// the status and the peer it names; nothing reaches the interpreter as an abort.
#include "engines.hpp"
#include "slot.hpp"
#include "teardown.hpp"

#include <hetmesh/core/device.hpp>
#include <hetmesh/core/error.hpp>
#include <hetmesh/core/plugin.hpp>

#include <pybind11/stl.h>

#include <exception>

namespace hetmesh::python {
namespace {

void raise_as_python(const Error& e) {
  py::object errors = py::module_::import("hetmesh._errors");
  // A message may carry bytes from a peer, a plugin or a path: never let decoding them fail.
  const std::string message = e.what();
  py::object text = py::reinterpret_steal<py::object>(PyUnicode_DecodeUTF8(
      message.data(), static_cast<Py_ssize_t>(message.size()), "backslashreplace"));
  if (!text) throw py::error_already_set();
  py::object error =
      errors.attr("from_native")(static_cast<int>(e.status()), status_name(e.status()), text);
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(error.ptr())), error.ptr());
}

py::list devices() {
  PluginRegistry registry = [] {
    py::gil_scoped_release unlocked;  // the probe runs each plugin's initialize in a child
    return PluginRegistry::load();
  }();
  py::list out;
  for (const Device& d : registry.devices()) {
    py::dict entry;
    entry["selector"] = d.selector();
    entry["plugin"] = d.plugin().name();
    entry["name"] = std::string(d.properties().name);
    entry["vendor"] = std::string(d.properties().vendor);
    entry["capabilities"] = capability_names(d.properties().capabilities);
    entry["total_memory"] = d.properties().total_memory;
    entry["pci_bus_id"] = std::string(d.properties().pci_bus_id);
    out.append(entry);
  }
  return out;
}

py::list refused_plugins() {
  py::list out;
  PluginRegistry registry = [] {
    py::gil_scoped_release unlocked;
    return PluginRegistry::load();
  }();
  for (const RefusedPlugin& r : registry.refused())
    out.append(py::make_tuple(r.path, r.reason));
  return out;
}

}  // namespace
}  // namespace hetmesh::python

PYBIND11_MODULE(_native, m) {
  namespace py = pybind11;
  using namespace hetmesh::python;
  m.doc() = "hetmesh's C++ engines; use the hetmesh package, not this module";
  m.attr("__version__") = HETMESH_VERSION;
  remember_main_thread();
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const hetmesh::Error& e) {
      raise_as_python(e);
    }
  });
  m.def("devices", &devices,
        "Every device of every plugin found: selector, plugin, name, vendor, capabilities.");
  m.def("refused_plugins", &refused_plugins, "(path, reason) of each plugin that was refused.");
  bind_slot(m);
  bind_config(m);
  bind_store(m);
  bind_engines(m);
  bind_stepmesh_serve(m);
  bind_stepmesh_worker(m);
  bind_connector_ffn(m);
  bind_connector_attention(m);
}
