// hetmesh._native.StoreServer, StoreClient and write_secret: hosting a job's embedded store from
// Python, reaching it (for what a framework agrees on beside the engines: hetmesh.stepmesh's
// barriers), and making the job's secret file that every process of the job reads.
#include "engines.hpp"

#include <hetmesh/core/error.hpp>
#include <hetmesh/core/job_secret.hpp>
#include <hetmesh/core/rendezvous.hpp>

#include <pybind11/stl.h>
#include <pybind11/stl/filesystem.h>

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <memory>
#include <optional>

namespace hetmesh::python {

namespace {

// A timeout in milliseconds from Python; negative or NaN is refused, inf is a year.
std::chrono::milliseconds to_milliseconds(double ms) {
  if (!(ms >= 0))
    throw Error(HM_ERR_INVALID_ARGUMENT, fmt::format("timeout_ms {} is not >= 0", ms));
  return std::chrono::milliseconds(static_cast<int64_t>(std::min(ms, 365.0 * 24 * 3600 * 1000)));
}

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
  py::class_<KeyValueStore>(m, "StoreClient",
                            "A connection to the job's store (the embedded one or etcd), for keys "
                            "of the application's own beside the engines'.")
      .def(py::init([](const std::string& address,
                       const std::optional<std::filesystem::path>& secret_file, double timeout_ms) {
             std::optional<JobSecret> secret;
             if (secret_file) secret = JobSecret::read_file(secret_file->string());
             py::gil_scoped_release unlocked;
             return connect_store(address, to_milliseconds(timeout_ms), std::move(secret));
           }),
           py::arg("address"), py::arg("secret_file") = py::none(), py::arg("timeout_ms") = 10000.0)
      .def(
          "set",
          [](KeyValueStore& s, const std::string& key, const py::bytes& value) {
            const std::string bytes = value;
            py::gil_scoped_release unlocked;
            s.set(key, std::vector<uint8_t>(bytes.begin(), bytes.end()));
          },
          py::arg("key"), py::arg("value"))
      .def(
          "get",
          [](KeyValueStore& s, const std::string& key, double timeout_ms) {
            std::vector<uint8_t> value;
            {
              py::gil_scoped_release unlocked;
              value = s.get(key, to_milliseconds(timeout_ms));
            }
            return py::bytes(reinterpret_cast<const char*>(value.data()), value.size());
          },
          py::arg("key"), py::arg("timeout_ms"),
          "Waits until `key` exists (TimeoutError naming it past timeout_ms) and returns its "
          "value.")
      .def(
          "add",
          [](KeyValueStore& s, const std::string& key, int64_t delta) {
            py::gil_scoped_release unlocked;
            return s.add(key, delta);
          },
          py::arg("key"), py::arg("delta"),
          "Adds `delta` to the counter at `key` (created at 0) and returns its new value.")
      .def_property_readonly("description", &KeyValueStore::describe);
  m.def(
      "write_secret",
      [](const std::filesystem::path& path) { JobSecret::generate().write_file(path.string()); },
      py::arg("path"), "Writes a new job secret to `path` (mode 0600).");
}

}  // namespace hetmesh::python
