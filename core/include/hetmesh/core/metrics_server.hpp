// Serves a metrics registry (metrics.hpp) at http://<listen>/metrics for a Prometheus server to
// scrape, with libmicrohttpd (Debian libmicrohttpd-dev) in a thread of its own.
//
// Nothing listens beyond loopback without the job's secret (shared design §9): on any other
// address every scrape must carry `Authorization: Bearer <metrics_token(secret)>`, a token derived
// from the secret (so a token seen on the wire is not the secret that admits a peer to the store),
// which Prometheus sends from a file (`authorization: {credentials_file: ...}`); a scrape without
// it gets 401. Only GET and HEAD of /metrics are served; connections are few and time out, so a
// slow or hostile client costs a bounded share of one thread and never touches the engine.
#pragma once

#include <hetmesh/core/job_secret.hpp>
#include <hetmesh/core/metrics.hpp>

#include <chrono>
#include <memory>
#include <string>
#include <string_view>

// Exported from the library, which hides every other symbol (core/README.md, "Exports").
#pragma GCC visibility push(default)

namespace hetmesh::metrics {

// The bearer token of a job's metrics: 64 hex digits, HMAC-SHA256 of a fixed label under the
// job's secret. `hetmesh config --metrics-token` prints it.
std::string metrics_token(const JobSecret& secret);

// One scrape of the endpoint at `address` ("127.0.0.1:9400"): GET /metrics, with the bearer
// token if one is given, within `timeout`. Returns the exposition; throws Error(NOT_AUTHORIZED)
// for a 401, Error(BACKEND) for another status, and the socket layer's errors.
std::string scrape(std::string_view address, std::string_view token,
                   std::chrono::milliseconds timeout);

class Server {
 public:
  // Serves `registry` (which must outlive the server) on `listen` ("host:port"; port 0: any free
  // one). `secret` (may be null) is required for an address beyond loopback. `what` names the
  // server in errors and the log ("ffn 1's metrics"). Throws Error(INVALID_ARGUMENT) for a bad
  // address or a public one without a secret, Error(BACKEND) when it cannot listen there, and
  // Error(NOT_SUPPORTED) in a build without libmicrohttpd.
  Server(Registry& registry, std::string_view listen, const JobSecret* secret,
         std::string_view what);
  ~Server();  // stops serving; a scrape under way is cut off
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Where it listens: "127.0.0.1:9400", the real port when 0 was asked for.
  const std::string& address() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace hetmesh::metrics

#pragma GCC visibility pop
