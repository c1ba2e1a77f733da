// hetmesh._native.StoreServer and write_secret: hosting a job's embedded store from Python, and
// making the job's secret file that every process of the job reads.
#include "engines.hpp"

#include <hetmesh/core/error.hpp>
#include <hetmesh/core/job_secret.hpp>
#include <hetmesh/core/rendezvous.hpp>

#include <pybind11/stl.h>
#include <pybind11/stl/filesystem.h>

#include <filesystem>
#include <memory>
#include <optional>

namespace hetmesh::python {

namespace {

struct HostedStore {
  std::unique_ptr<TcpStoreServer> server;
  const TcpStoreServer& get() const {
    if (!server) throw Error(HM_ERR_INVALID_ARGUMENT, "the store was closed");
    return *server;
  }
};

}  // namespace

void bind_store(py::module_& m) {
  py::class_<HostedStore>(m, "StoreServer",
                          "The job's embedded rendezvous store, served by this process until "
                          "close() or until it is dropped.")
      .def(py::init([](const std::string& address,
                       const std::optional<std::filesystem::path>& secret_file) {
             std::optional<JobSecret> secret;
             if (secret_file) secret = JobSecret::read_file(secret_file->string());
             py::gil_scoped_release unlocked;
             return HostedStore{std::make_unique<TcpStoreServer>(address, std::move(secret))};
           }),
           py::arg("address") = "127.0.0.1:0", py::arg("secret_file") = py::none())
      .def_property_readonly(
          "address", [](const HostedStore& s) { return s.get().address(); },
          "host:port, for the engines' store=")
      .def(
          "close",
          [](HostedStore& s) {
            std::unique_ptr<TcpStoreServer> closing = std::move(s.server);  // under the GIL
            py::gil_scoped_release unlocked;  // joins the store's threads
            closing.reset();
          },
          "Stops serving: every client's next call fails with PeerLostError.");
  m.def(
      "write_secret",
      [](const std::filesystem::path& path) { JobSecret::generate().write_file(path.string()); },
      py::arg("path"), "Writes a new job secret to `path` (mode 0600).");
}

}  // namespace hetmesh::python
