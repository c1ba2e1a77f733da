// A build without libmicrohttpd: the metrics endpoint is refused, saying why (metrics_server.hpp).
#include <hetmesh/core/error.hpp>
#include <hetmesh/core/metrics_server.hpp>

#include <fmt/format.h>

namespace hetmesh::metrics {

struct Server::State {
  std::string address;
};

Server::Server(Registry&, std::string_view listen, const JobSecret*, std::string_view what) {
  throw Error(HM_ERR_NOT_SUPPORTED,
              fmt::format("{} ([metrics] listen = {}): this hetmesh was built without "
                          "libmicrohttpd (Debian libmicrohttpd-dev), which serves the metrics",
                          what, listen));
}

Server::~Server() = default;

const std::string& Server::address() const {
  return state_->address;
}

}  // namespace hetmesh::metrics
