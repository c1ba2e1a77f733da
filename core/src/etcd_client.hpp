// A client of etcd's v3 JSON gateway (etcd 3.4): POST /v3/kv/range, /v3/kv/put, /v3/kv/txn,
// /v3/kv/deleterange, /v3/lease/grant and /v3/lease/keepalive, and the streamed /v3/watch, over
// libcurl. Keys and values travel base64-encoded (OpenSSL's EVP_EncodeBlock), 64-bit integers as
// decimal strings. Every call has a deadline; a reply is checked before it is trusted. Where etcd
// has its own authentication on, the client logs in as a user (/v3/auth/authenticate) and sends
// the token it gets with every request, logging in again once when etcd says the token expired.
#pragma once

#include <hetmesh/core/error.hpp>

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace hetmesh::etcd {

std::string base64(std::span<const uint8_t> bytes);
std::string base64(std::string_view text);
// Throws Error(kStatusProtocolError) naming `what` if `text` is not base64.
std::vector<uint8_t> unbase64(std::string_view text, std::string_view what);
// A 64-bit integer field of a reply (a decimal string, as the gateway writes them); 0 if absent.
int64_t integer(const nlohmann::json& object, const char* field);

struct Tls {
  std::string ca_file, cert_file, key_file;  // PEM files; empty: the system's CAs, no client cert
};

struct Auth {  // one of etcd's users, where etcd has authentication on; empty user: none
  std::string user, password;
};

class Client {
 public:
  // `endpoint`: "http://host:port" or "https://host:port".
  Client(std::string endpoint, Tls tls, Auth auth = {});
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;
  const std::string& endpoint() const { return endpoint_; }

  // POSTs `body` to `path` ("/v3/kv/range") and returns the reply. Throws Error: kStatusPeerLost
  // when etcd cannot be reached, HM_ERR_TIMEOUT past `timeout`, kStatusNotAuthorized when etcd
  // refuses the user, its token or its permissions (saying what to do), HM_ERR_BACKEND for
  // another error reply (with etcd's message), kStatusProtocolError for a reply that is not JSON.
  nlohmann::json call(const std::string& path, const nlohmann::json& body,
                      std::chrono::milliseconds timeout);

  // Watches `key` (base64) from `revision` on, until `done` returns true for an event (true), or
  // until `timeout` passes (false). Throws as call() does.
  bool watch(const std::string& key, int64_t revision,
             const std::function<bool(const nlohmann::json& event)>& done,
             std::chrono::milliseconds timeout);

 private:
  void* handle();  // a CURL easy handle from the pool, set up for this endpoint
  void give_back(void* curl);
  // One POST with `token` (none when empty), as call() describes it.
  nlohmann::json post(const std::string& path, const nlohmann::json& body,
                      std::chrono::milliseconds timeout, const std::string& token);
  // The token to send: "" without a user; else the one held, logging in first if there is none.
  std::string token(std::chrono::milliseconds timeout);
  // Drops `stale` (etcd said it expired), so that the next token() logs in again.
  void forget(const std::string& stale);
  bool watch_once(const std::string& key, int64_t revision,
                  const std::function<bool(const nlohmann::json& event)>& done,
                  std::chrono::milliseconds timeout, const std::string& token);
  const char* missing_certificate_hint(int curl_code) const;
  std::string endpoint_;
  Tls tls_;
  Auth auth_;
  std::mutex token_mutex_;
  std::string token_;
  std::mutex mutex_;
  std::vector<void*> idle_;  // easy handles keep their connections between calls
};

}  // namespace hetmesh::etcd
