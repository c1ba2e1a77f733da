// etcd's v3 JSON gateway over libcurl (etcd_client.hpp).
#include "etcd_client.hpp"

#include <fmt/format.h>

#include <curl/curl.h>
#include <openssl/evp.h>

#include <algorithm>
#include <charconv>
#include <memory>
#include <string_view>
#include <utility>

namespace hetmesh::etcd {
namespace {

using std::chrono::milliseconds;

// A reply bigger than this is not one etcd sends for our requests.
constexpr size_t kMaxReplyBytes = 64 << 20;

void global_init() {
  static const CURLcode once = curl_global_init(CURL_GLOBAL_DEFAULT);
  if (once != CURLE_OK)
    throw Error(HM_ERR_BACKEND,
                fmt::format("etcd: curl_global_init: {}", curl_easy_strerror(once)));
}

struct Body {
  std::string text;
  bool too_big = false;
};

size_t collect(char* data, size_t size, size_t count, void* user) {
  auto* body = static_cast<Body*>(user);
  size_t n = size * count;
  if (body->text.size() + n > kMaxReplyBytes) {
    body->too_big = true;
    return 0;
  }
  body->text.append(data, n);
  return n;
}

// What a watch stream's write callback needs: the lines so far and the caller's test.
struct WatchState {
  std::string pending;
  const std::function<bool(const nlohmann::json&)>* done;
  bool satisfied = false;
  std::string error;
};

size_t watch_chunk(char* data, size_t size, size_t count, void* user) {
  auto* w = static_cast<WatchState*>(user);
  size_t n = size * count;
  w->pending.append(data, n);
  if (w->pending.size() > kMaxReplyBytes) {
    w->error = "a watch reply line is too long";
    return 0;
  }
  for (size_t end; (end = w->pending.find('\n')) != std::string::npos;) {
    std::string line = w->pending.substr(0, end);
    w->pending.erase(0, end + 1);
    nlohmann::json message = nlohmann::json::parse(line, nullptr, false);
    if (message.is_discarded() || !message.is_object()) {
      w->error = "a watch reply that is not JSON";
      return 0;
    }
    if (message.contains("error")) {
      w->error = message["error"].dump();
      return 0;
    }
    // Nothing may throw through libcurl's C frames: a malformed event ends the watch here.
    try {
      const nlohmann::json& result = message.value("result", nlohmann::json::object());
      if (!result.is_object() || !result.contains("events")) continue;
      for (const nlohmann::json& event : result["events"])
        if ((*w->done)(event)) {
          w->satisfied = true;
          return 0;  // ends the transfer: the caller has what it waited for
        }
    } catch (const std::exception& e) {
      w->error = fmt::format("a malformed watch event: {}", e.what());
      return 0;
    }
  }
  return n;
}

// The headers of one request: JSON, and the token where there is one.
struct Headers {
  curl_slist* list = nullptr;
  explicit Headers(const std::string& token) {
    list = curl_slist_append(list, "Content-Type: application/json");
    if (list != nullptr && !token.empty())
      list = curl_slist_append(list, ("Authorization: " + token).c_str());
    if (list == nullptr) throw Error(HM_ERR_OUT_OF_MEMORY, "etcd: curl_slist_append failed");
  }
  ~Headers() { curl_slist_free_all(list); }
  Headers(const Headers&) = delete;
  Headers& operator=(const Headers&) = delete;
};

// What etcd says of a token it no longer knows (expired: log in again).
constexpr std::string_view kExpiredToken = "invalid auth token";

bool token_expired(const Error& e) {
  return e.status() == kStatusNotAuthorized &&
         std::string_view(e.what()).find(kExpiredToken) != std::string_view::npos;
}

// What etcd's refusal means (its message, as its gateway passes it on) and what to do about it:
// a token it no longer knows, no user where it has authentication on, a user's password or
// permissions (kStatusNotAuthorized); anything else is HM_ERR_BACKEND.
std::pair<hm_status, std::string> refusal(const std::string& message, bool has_user) {
  if (message.find(kExpiredToken) != std::string::npos) return {kStatusNotAuthorized, ""};
  if (message.find("user name is empty") != std::string::npos)
    return {kStatusNotAuthorized,
            has_user ? std::string()
                     : " (etcd has authentication on: name a user in HETMESH_ETCD_USER and the "
                       "file that holds its password in HETMESH_ETCD_PASSWORD_FILE)"};
  if (message.find("authentication failed") != std::string::npos) return {kStatusNotAuthorized, ""};
  if (message.find("permission denied") != std::string::npos)
    return {kStatusNotAuthorized,
            " (grant the user's role read and write on the job's keys: etcdctl role "
            "grant-permission ROLE --prefix=true readwrite hetmesh/)"};
  return {HM_ERR_BACKEND, ""};
}

// A failed transfer: TLS refused both ways (a certificate, a key, a CA) is NOT_AUTHORIZED, which
// retrying cannot cure; anything else is etcd out of reach (PEER_LOST).
hm_status failure_status(CURLcode rc) {
  switch (rc) {
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CERTPROBLEM:
    case CURLE_SSL_CIPHER:
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_SSL_ISSUER_ERROR:
    case CURLE_SSL_CLIENTCERT:
      return kStatusNotAuthorized;
    default:
      return kStatusPeerLost;
  }
}

}  // namespace

std::string base64(std::span<const uint8_t> bytes) {
  std::string out(4 * ((bytes.size() + 2) / 3), '\0');
  int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()), bytes.data(),
                          static_cast<int>(bytes.size()));
  out.resize(static_cast<size_t>(n));
  return out;
}

std::string base64(std::string_view text) {
  return base64(std::span(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
}

std::vector<uint8_t> unbase64(std::string_view text, std::string_view what) {
  if (text.size() % 4 != 0)
    throw Error(kStatusProtocolError, fmt::format("etcd sent {} that is not base64", what));
  std::vector<uint8_t> out(text.size() / 4 * 3);
  int n = EVP_DecodeBlock(out.data(), reinterpret_cast<const unsigned char*>(text.data()),
                          static_cast<int>(text.size()));
  if (n < 0)
    throw Error(kStatusProtocolError, fmt::format("etcd sent {} that is not base64", what));
  size_t padding = static_cast<size_t>(
      std::count(text.end() - std::min<size_t>(2, text.size()), text.end(), '='));
  out.resize(static_cast<size_t>(n) - padding);
  return out;
}

int64_t integer(const nlohmann::json& object, const char* field) {
  if (!object.is_object() || !object.contains(field)) return 0;
  const nlohmann::json& v = object[field];
  if (v.is_number_integer()) return v.get<int64_t>();
  if (!v.is_string())
    throw Error(kStatusProtocolError, fmt::format("etcd sent a '{}' that is not a number", field));
  const std::string& text = v.get_ref<const std::string&>();
  int64_t value = 0;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size())
    throw Error(kStatusProtocolError,
                fmt::format("etcd sent '{}': '{}', not a number", field, text));
  return value;
}

Client::Client(std::string endpoint, Tls tls, Auth auth)
    : endpoint_(std::move(endpoint)), tls_(std::move(tls)), auth_(std::move(auth)) {
  global_init();
}

Client::~Client() {
  for (void* curl : idle_)
    curl_easy_cleanup(static_cast<CURL*>(curl));
}

void* Client::handle() {
  {
    std::lock_guard lock(mutex_);
    if (!idle_.empty()) {
      void* curl = idle_.back();
      idle_.pop_back();
      return curl;
    }
  }
  CURL* curl = curl_easy_init();
  if (curl == nullptr) throw Error(HM_ERR_OUT_OF_MEMORY, "etcd: curl_easy_init failed");
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);  // threads: no SIGALRM for timeouts
  curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "http,https");
  if (!tls_.ca_file.empty()) curl_easy_setopt(curl, CURLOPT_CAINFO, tls_.ca_file.c_str());
  if (!tls_.cert_file.empty()) curl_easy_setopt(curl, CURLOPT_SSLCERT, tls_.cert_file.c_str());
  if (!tls_.key_file.empty()) curl_easy_setopt(curl, CURLOPT_SSLKEY, tls_.key_file.c_str());
  return curl;
}

void Client::give_back(void* curl) {
  std::lock_guard lock(mutex_);
  idle_.push_back(curl);
}

nlohmann::json Client::call(const std::string& path, const nlohmann::json& body,
                            milliseconds timeout) {
  const std::string sent = token(timeout);
  try {
    return post(path, body, timeout, sent);
  } catch (const Error& e) {
    // An expired token (etcd's --auth-token-ttl): log in again, once.
    if (sent.empty() || !token_expired(e)) throw;
    forget(sent);
    return post(path, body, timeout, token(timeout));
  }
}

std::string Client::token(milliseconds timeout) {
  if (auth_.user.empty()) return {};
  std::lock_guard lock(token_mutex_);
  if (!token_.empty()) return token_;
  nlohmann::json reply;
  try {
    reply = post("/v3/auth/authenticate", {{"name", auth_.user}, {"password", auth_.password}},
                 timeout, {});
  } catch (const Error& e) {
    if (e.status() != kStatusNotAuthorized) throw;
    throw Error(kStatusNotAuthorized,
                fmt::format("etcd {} refused user '{}': {} (the user and its password are "
                            "HETMESH_ETCD_USER and the file HETMESH_ETCD_PASSWORD_FILE names)",
                            endpoint_, auth_.user, e.what()));
  }
  token_ = reply.value("token", "");
  if (token_.empty())
    throw Error(kStatusProtocolError,
                fmt::format("etcd {}: logging in as '{}' gave no token", endpoint_, auth_.user));
  return token_;
}

void Client::forget(const std::string& stale) {
  std::lock_guard lock(token_mutex_);
  if (token_ == stale) token_.clear();
}

nlohmann::json Client::post(const std::string& path, const nlohmann::json& body,
                            milliseconds timeout, const std::string& token) {
  auto* curl = static_cast<CURL*>(handle());
  std::unique_ptr<CURL, void (*)(CURL*)> dropped(curl, curl_easy_cleanup);  // unless given back
  Headers headers(token);
  const std::string url = endpoint_ + path;
  const std::string request = body.dump();
  Body reply;
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers.list);
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_POSTFIELDS, request.c_str());
  curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE, static_cast<long>(request.size()));
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, collect);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &reply);
  curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS,
                   static_cast<long>(std::max<int64_t>(1, timeout.count())));
  CURLcode rc = curl_easy_perform(curl);
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, nullptr);  // `headers` goes with this call
  long http = 0;
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &http);
  if (rc == CURLE_OPERATION_TIMEDOUT)
    throw Error(HM_ERR_TIMEOUT, fmt::format("etcd {}: {} did not answer within {} ms", endpoint_,
                                            path, timeout.count()));
  if (rc != CURLE_OK)
    throw Error(reply.too_big ? kStatusProtocolError : failure_status(rc),
                fmt::format("etcd {}: {}: {}{}", endpoint_, path,
                            reply.too_big ? "the reply is too big" : curl_easy_strerror(rc),
                            missing_certificate_hint(rc)));
  nlohmann::json answer = nlohmann::json::parse(reply.text, nullptr, false);
  if (answer.is_discarded() || !answer.is_object())
    throw Error(kStatusProtocolError,
                fmt::format("etcd {}: {}: HTTP {} with a reply that is not JSON: {:.200}",
                            endpoint_, path, http, reply.text));
  if (http != 200) {
    const std::string message = answer.value("message", answer.dump());
    auto [status, hint] = refusal(message, !auth_.user.empty());
    throw Error(status,
                fmt::format("etcd {}: {}: HTTP {}: {}{}", endpoint_, path, http, message, hint));
  }
  dropped.release();
  give_back(curl);
  return answer;
}

// TLS 1.3 refuses a missing client certificate after the handshake: the client sees only that
// the connection broke, while it sends or while it receives, as timing has it.
const char* Client::missing_certificate_hint(int rc) const {
  return (rc == CURLE_RECV_ERROR || rc == CURLE_SEND_ERROR) && endpoint_.starts_with("https://") &&
                 tls_.cert_file.empty()
             ? " (if etcd asks for client certificates: name this client's in "
               "HETMESH_ETCD_CERT_FILE and HETMESH_ETCD_KEY_FILE)"
             : "";
}

bool Client::watch(const std::string& key, int64_t revision,
                   const std::function<bool(const nlohmann::json&)>& done, milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (int attempt = 0;; ++attempt) {
    const std::string sent = token(timeout);
    auto left = std::chrono::ceil<milliseconds>(deadline - std::chrono::steady_clock::now());
    try {
      return watch_once(key, revision, done, std::max(milliseconds(1), left), sent);
    } catch (const Error& e) {
      if (attempt > 0 || sent.empty() || !token_expired(e)) throw;
      forget(sent);  // expired: log in again, once
    }
  }
}

bool Client::watch_once(const std::string& key, int64_t revision,
                        const std::function<bool(const nlohmann::json&)>& done,
                        milliseconds timeout, const std::string& token) {
  // A handle of its own: an aborted stream leaves its connection unusable for the pool.
  std::unique_ptr<CURL, void (*)(CURL*)> curl(static_cast<CURL*>(handle()), curl_easy_cleanup);
  Headers headers(token);
  const std::string url = endpoint_ + "/v3/watch";
  nlohmann::json create = {{"key", key}, {"start_revision", std::to_string(revision)}};
  const std::string request = nlohmann::json{{"create_request", create}}.dump();
  WatchState state;
  state.done = &done;
  curl_easy_setopt(curl.get(), CURLOPT_HTTPHEADER, headers.list);
  curl_easy_setopt(curl.get(), CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl.get(), CURLOPT_POSTFIELDS, request.c_str());
  curl_easy_setopt(curl.get(), CURLOPT_POSTFIELDSIZE, static_cast<long>(request.size()));
  curl_easy_setopt(curl.get(), CURLOPT_WRITEFUNCTION, watch_chunk);
  curl_easy_setopt(curl.get(), CURLOPT_WRITEDATA, &state);
  curl_easy_setopt(curl.get(), CURLOPT_TIMEOUT_MS,
                   static_cast<long>(std::max<int64_t>(1, timeout.count())));
  CURLcode rc = curl_easy_perform(curl.get());
  if (state.satisfied) return true;
  if (!state.error.empty()) {
    auto [status, hint] = refusal(state.error, !auth_.user.empty());
    throw Error(status == HM_ERR_BACKEND ? kStatusProtocolError : status,
                fmt::format("etcd {}: watch: {}{}", endpoint_, state.error, hint));
  }
  if (rc == CURLE_OPERATION_TIMEDOUT) return false;
  if (rc == CURLE_OK) {
    // A watch that ends by itself (an error reply, etcd going away) would make the callers'
    // read-then-watch loops spin: it is the store lost.
    long http = 0;
    curl_easy_getinfo(curl.get(), CURLINFO_RESPONSE_CODE, &http);
    throw Error(kStatusPeerLost,
                fmt::format("etcd {}: the watch ended early (HTTP {}){}", endpoint_, http,
                            state.pending.empty() ? "" : ": " + state.pending));
  }
  throw Error(kStatusPeerLost,
              fmt::format("etcd {}: watch: {}", endpoint_, curl_easy_strerror(rc)));
}

}  // namespace hetmesh::etcd
