// hetmesh._native.Config: a job config (afd/job_config.hpp), read from a file or parsed from text
// (the package builds that text from keyword arguments), validated as a whole by the C++ reader.
#include "engines.hpp"

#include <hetmesh/afd/job_config.hpp>
#include <hetmesh/afd/launched.hpp>

#include <pybind11/stl.h>

namespace hetmesh::python {

void bind_config(py::module_& m) {
  using afd::JobConfig;
  py::class_<JobConfig>(m, "Config", "A job config, validated as a whole (see docs/launching.md).")
      .def_static("load", &afd::load_config, py::arg("path"), "Reads and validates a TOML file.")
      .def_static("parse", &afd::parse_config, py::arg("text"), py::arg("source_name"),
                  "Parses and validates TOML text; source_name names it in errors.")
      .def("to_toml", &afd::to_toml, "The effective config as TOML.")
      .def_property_readonly("attention", [](const JobConfig& c) { return c.job.attention; })
      .def_property_readonly("ffn", [](const JobConfig& c) { return c.job.ffn; })
      .def_property_readonly("micro_batches",
                             [](const JobConfig& c) { return c.job.micro_batches; })
      .def_property_readonly("layers", [](const JobConfig& c) { return c.job.layers; })
      .def_property_readonly("timeout_ms", [](const JobConfig& c) { return c.job.timeout.count(); })
      .def_property_readonly("join_timeout_ms",
                             [](const JobConfig& c) { return c.job.join_timeout.count(); })
      .def_property_readonly("tokens", [](const JobConfig& c) { return c.model.tokens; })
      .def_property_readonly("hidden", [](const JobConfig& c) { return c.model.hidden; })
      .def_property_readonly("experts", [](const JobConfig& c) { return c.model.experts; })
      .def_property_readonly("top_k", [](const JobConfig& c) { return c.model.top_k; })
      .def_property_readonly("a2f_dtype",
                             [](const JobConfig& c) { return afd::to_string(c.model.a2f_dtype); })
      .def_property_readonly("f2a_dtype",
                             [](const JobConfig& c) { return afd::to_string(c.model.f2a_dtype); })
      .def_property_readonly(
          "a2f_tensors",
          [](const JobConfig& c) {
            py::list out;
            for (const afd::TensorSection& t : c.model.a2f_tensors)
              out.append(py::make_tuple(t.name, afd::to_string(t.dtype), t.columns));
            return out;
          },
          "The extra A2F tensors: (name, dtype, columns) each, in name order.")
      .def_property_readonly("topology",
                             [](const JobConfig& c) { return afd::to_string(c.job.topology); })
      .def_property_readonly("attention_devices",
                             [](const JobConfig& c) { return c.devices.attention; })
      .def_property_readonly("ffn_devices", [](const JobConfig& c) { return c.devices.ffn; })
      .def_property_readonly("transport",
                             [](const JobConfig& c) { return afd::to_string(c.transport.kind); })
      .def_property_readonly("store", [](const JobConfig& c) { return c.rendezvous.address; })
      .def_property_readonly("secret_file",
                             [](const JobConfig& c) { return c.rendezvous.secret_file; });
  m.def(
      "launched",
      [](const JobConfig& c) -> py::object {
        std::optional<afd::LaunchedProcess> p = afd::launched_process();
        if (!p) return py::none();
        auto [role, rank] = afd::instance_of(*p, c);
        py::dict d;
        d["launcher"] = p->launcher;
        d["process"] = p->rank;
        d["role"] = afd::to_string(role);
        d["rank"] = rank;
        d["local_rank"] = p->local_rank;
        d["store"] = p->store;
        return d;
      },
      py::arg("config"),
      "This process's place in `config`'s job from the launcher that started it "
      "(afd/launched.hpp), or None where no launcher's variables are set.");
}

}  // namespace hetmesh::python
