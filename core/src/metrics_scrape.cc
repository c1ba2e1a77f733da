// A scrape of a metrics endpoint (metrics_server.hpp): bench afd's scraper and the tests.
#include <hetmesh/core/error.hpp>
#include <hetmesh/core/metrics_server.hpp>
#include <hetmesh/core/socket.hpp>

#include <fmt/format.h>

namespace hetmesh::metrics {

std::string scrape(std::string_view address, std::string_view token,
                   std::chrono::milliseconds timeout) {
  const std::string what = fmt::format("metrics at {}", address);
  const net::Deadline deadline = net::Clock::now() + timeout;
  net::Fd fd = net::connect_with_retry(net::resolve(address, false, what), timeout,
                                       std::chrono::milliseconds(10), what);
  const std::string request = fmt::format(
      "GET /metrics HTTP/1.0\r\nHost: {}\r\n{}\r\n", address,
      token.empty() ? std::string() : fmt::format("Authorization: Bearer {}\r\n", token));
  net::send_all(fd.get(), request.data(), request.size(), what.c_str(), deadline);
  std::string response;
  char chunk[16384];
  // HTTP/1.0: the server closes after the body.
  while (size_t n = net::recv_some(fd.get(), chunk, sizeof chunk, what.c_str(), deadline)) {
    response.append(chunk, n);
    if (response.size() > (64 << 20))
      throw Error(kStatusProtocolError, fmt::format("{}: more than 64 MiB", what));
  }
  const size_t body = response.find("\r\n\r\n");
  if (!response.starts_with("HTTP/1.") || response.size() < 12 || body == std::string::npos)
    throw Error(kStatusProtocolError, fmt::format("{}: not an HTTP response", what));
  const std::string status = response.substr(9, 3);
  if (status == "401")
    throw Error(kStatusNotAuthorized, fmt::format("{}: refused (401): no or wrong token", what));
  if (status != "200") throw Error(HM_ERR_BACKEND, fmt::format("{}: HTTP {}", what, status));
  return response.substr(body + 4);
}

}  // namespace hetmesh::metrics
