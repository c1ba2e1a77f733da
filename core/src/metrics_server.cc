// The metrics endpoint on libmicrohttpd (metrics_server.hpp).
#include <hetmesh/core/error.hpp>
#include <hetmesh/core/log.hpp>
#include <hetmesh/core/metrics_server.hpp>
#include <hetmesh/core/socket.hpp>

#include <microhttpd.h>
#include <netinet/in.h>
#include <openssl/crypto.h>
#include <unistd.h>

#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <cstring>

namespace hetmesh::metrics {

namespace {

constexpr unsigned kConnections = 16;         // scrapers at once: Prometheus uses one
constexpr unsigned kConnectionTimeoutS = 10;  // an idle or trickling client is dropped
constexpr const char* kContentType = "text/plain; version=0.0.4; charset=utf-8";

void log_from_library(void* what, const char* format, va_list args) {
  char text[512];
  std::vsnprintf(text, sizeof text, format, args);
  log(LogLevel::debug, "{}: libmicrohttpd: {}", static_cast<const std::string*>(what)->c_str(),
      text);
}

}  // namespace

struct Server::State {
  Registry& registry;
  std::string what;
  std::string address;
  std::string authorization;  // "Bearer <token>"; empty on loopback
  std::atomic<int64_t> last_refusal_logged{0};
  MHD_Daemon* daemon = nullptr;

  State(Registry& r, std::string_view w) : registry(r), what(w) {}

  bool authorized(MHD_Connection* connection) const {
    if (authorization.empty()) return true;
    const char* given =
        MHD_lookup_connection_value(connection, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    return given && std::strlen(given) == authorization.size() &&
           CRYPTO_memcmp(given, authorization.data(), authorization.size()) == 0;
  }

  // At most one line a second: a scraper with the wrong token must not flood the log.
  void log_refusal(MHD_Connection* connection, std::string_view why) {
    const int64_t now = std::chrono::duration_cast<std::chrono::seconds>(
                            std::chrono::steady_clock::now().time_since_epoch())
                            .count();
    int64_t last = last_refusal_logged.load();
    if (now == last || !last_refusal_logged.compare_exchange_strong(last, now)) return;
    std::string from = "?";
    if (const MHD_ConnectionInfo* info =
            MHD_get_connection_info(connection, MHD_CONNECTION_INFO_CLIENT_ADDRESS)) {
      net::Address a;
      a.length =
          info->client_addr->sa_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
      std::memcpy(&a.storage, info->client_addr, a.length);
      from = net::to_string(a);
    }
    log(LogLevel::warn, "{} at {}: refused a scrape from {}: {}", what, address, from, why);
  }

  MHD_Result reply(MHD_Connection* connection, unsigned status, const std::string& body,
                   const char* content_type) {
    MHD_Response* response = MHD_create_response_from_buffer(
        body.size(), const_cast<char*>(body.data()), MHD_RESPMEM_MUST_COPY);
    if (!response) return MHD_NO;
    MHD_add_response_header(response, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
    if (status == MHD_HTTP_UNAUTHORIZED)
      MHD_add_response_header(response, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    if (status == MHD_HTTP_METHOD_NOT_ALLOWED)
      MHD_add_response_header(response, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
    const MHD_Result queued = MHD_queue_response(connection, status, response);
    MHD_destroy_response(response);
    return queued;
  }

  MHD_Result serve(MHD_Connection* connection, const char* url, const char* method,
                   size_t* upload_size) {
    if (*upload_size != 0) return MHD_NO;  // a body to a GET: drop the connection
    const bool get = std::strcmp(method, MHD_HTTP_METHOD_GET) == 0;
    if (!get && std::strcmp(method, MHD_HTTP_METHOD_HEAD) != 0)
      return reply(connection, MHD_HTTP_METHOD_NOT_ALLOWED, "only GET /metrics\n", "text/plain");
    if (!authorized(connection)) {
      log_refusal(connection, "no or wrong bearer token");
      return reply(connection, MHD_HTTP_UNAUTHORIZED,
                   "a bearer token is required: hetmesh config --metrics-token\n", "text/plain");
    }
    if (std::strcmp(url, "/metrics") != 0)
      return reply(connection, MHD_HTTP_NOT_FOUND, "only /metrics\n", "text/plain");
    std::string body;
    try {
      body = registry.render();
    } catch (const std::exception& e) {
      log(LogLevel::error, "{}: rendering the metrics failed: {}", what, e.what());
      return reply(connection, MHD_HTTP_INTERNAL_SERVER_ERROR, "rendering failed\n", "text/plain");
    }
    return reply(connection, MHD_HTTP_OK, body, kContentType);
  }

  static MHD_Result handle(void* self, MHD_Connection* connection, const char* url,
                           const char* method, const char*, const char*, size_t* upload_size,
                           void** request) {
    // The first call for a request only announces its headers: answer on the second, so a
    // client's body (none is expected) has been seen.
    if (*request == nullptr) {
      *request = self;
      return MHD_YES;
    }
    return static_cast<State*>(self)->serve(connection, url, method, upload_size);
  }
};

Server::Server(Registry& registry, std::string_view listen, const JobSecret* secret,
               std::string_view what)
    : state_(std::make_unique<State>(registry, what)) {
  const std::string where = fmt::format("{} ([metrics] listen)", what);
  const std::vector<net::Address> addresses = net::resolve(listen, /*passive=*/true, where);
  const net::Address& address = addresses.front();
  if (!net::is_loopback(address)) {
    if (!secret || secret->is_none())
      throw Error(HM_ERR_INVALID_ARGUMENT,
                  fmt::format("{}: {} is beyond loopback, and this job has no secret to guard it "
                              "with ([rendezvous] secret_file): listen on 127.0.0.1, or give the "
                              "job a secret",
                              where, listen));
    state_->authorization = "Bearer " + metrics_token(*secret);
  }
  net::Fd listener = net::listen_on(address, where);
  state_->address = net::to_string(net::local_address(listener.get()));
  // libmicrohttpd closes the socket it serves when it stops: it gets a descriptor of its own.
  const int handed = ::dup(listener.get());
  if (handed < 0) throw Error(HM_ERR_BACKEND, fmt::format("{}: dup: {}", where, strerror(errno)));
  state_->daemon = MHD_start_daemon(
      MHD_USE_POLL_INTERNAL_THREAD | MHD_USE_ERROR_LOG, 0, nullptr, nullptr, &State::handle,
      state_.get(), MHD_OPTION_EXTERNAL_LOGGER, &log_from_library, &state_->what,
      MHD_OPTION_LISTEN_SOCKET, handed, MHD_OPTION_CONNECTION_LIMIT, kConnections,
      MHD_OPTION_CONNECTION_TIMEOUT, kConnectionTimeoutS, MHD_OPTION_END);
  if (!state_->daemon)
    throw Error(HM_ERR_BACKEND,
                fmt::format("{}: libmicrohttpd could not serve {}", where, state_->address));
  log(LogLevel::info, "{}: serving http://{}/metrics{}", what, state_->address,
      state_->authorization.empty() ? "" : " (bearer token required)");
}

Server::~Server() {
  if (state_->daemon) MHD_stop_daemon(state_->daemon);
}

const std::string& Server::address() const {
  return state_->address;
}

}  // namespace hetmesh::metrics
