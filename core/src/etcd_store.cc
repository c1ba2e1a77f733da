// The etcd store: connect_etcd_store and the KeyValueStore it returns (rendezvous.hpp).
//
// Every key lives under the job's prefix. Keys under a prefix this process owns (own_keys) are put
// on the process's lease, which a thread keeps alive; when the process dies its lease expires and
// etcd deletes them, which wakes every wait_removed watching them. Counters are read-compare-
// write transactions, retried until no other writer came between.
#include "etcd_client.hpp"
#include "private_file.hpp"

#include <hetmesh/core/log.hpp>
#include <hetmesh/core/rendezvous.hpp>
#include <hetmesh/core/socket.hpp>
#include <hetmesh/core/thread.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <condition_variable>
#include <cstdlib>
#include <thread>

namespace hetmesh {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

// How long connect_etcd_store waits between attempts while etcd does not answer yet.
constexpr milliseconds kConnectRetry{50};

// What the store and its clones share: the connection pool, the lease and the owned prefixes.
struct Shared {
  std::shared_ptr<etcd::Client> client;
  EtcdOptions options;
  milliseconds timeout;
  std::mutex mutex;
  std::condition_variable stop;
  std::vector<std::string> owned;  // prefixes of this process's keys
  int64_t lease = 0;               // granted with the first owned key
  bool stopping = false;
  std::thread keeper;

  ~Shared() {
    {
      std::lock_guard lock(mutex);
      stopping = true;
    }
    stop.notify_all();
    if (keeper.joinable()) keeper.join();
    // Not revoked: a finished instance's keys (its "left" mark) outlive it by the lease's TTL.
  }

  bool owns(const std::string& key) {
    std::lock_guard lock(mutex);
    return std::any_of(owned.begin(), owned.end(),
                       [&](const std::string& p) { return key.starts_with(p); });
  }

  // The lease of this process's keys: granted on first use, then renewed every third of its TTL
  // by the keeper thread. Renewal failures are logged; once etcd says the lease is gone, so are
  // the keys, and the peers have been told.
  int64_t lease_id() {
    std::lock_guard lock(mutex);
    if (lease != 0) return lease;
    json granted = client->call("/v3/lease/grant",
                                {{"TTL", std::to_string(options.lease_ttl.count())}}, timeout);
    lease = etcd::integer(granted, "ID");
    if (lease == 0)
      throw Error(kStatusProtocolError,
                  fmt::format("etcd {}: lease grant answered without an ID", client->endpoint()));
    if (keeper.joinable()) keeper.join();  // the keeper of an expired lease, which has ended
    keeper = start_thread("hm-etcd-lease", [this] { keep_alive(); });
    return lease;
  }

  void keep_alive() {
    std::unique_lock lock(mutex);
    const auto every = std::chrono::duration_cast<milliseconds>(options.lease_ttl) / 3;
    while (!stop.wait_for(lock, every, [&] { return stopping; })) {
      const int64_t id = lease;
      lock.unlock();
      try {
        json answer = client->call("/v3/lease/keepalive", {{"ID", std::to_string(id)}}, every);
        if (etcd::integer(answer.value("result", json::object()), "TTL") <= 0) {
          log(LogLevel::error,
              "etcd {}: this process's lease {} has expired: its keys are gone, and its peers "
              "were told it is lost; its next keys go on a new lease",
              client->endpoint(), id);
          lock.lock();
          lease = 0;  // the next owned set grants a new one (and starts no second keeper)
          return;
        }
      } catch (const Error& e) {
        log(LogLevel::warn, "etcd {}: cannot renew lease {}: {}", client->endpoint(), id, e.what());
      }
      lock.lock();
    }
  }
};

class EtcdStore final : public KeyValueStore {
 public:
  explicit EtcdStore(std::shared_ptr<Shared> shared) : s_(std::move(shared)) {}

  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    check("set", key, value.size());
    call("/v3/kv/put", put_request(key, value));
  }

  std::vector<uint8_t> get(const std::string& key, milliseconds timeout) override {
    check("get", key, 0);
    const auto deadline = Clock::now() + timeout;
    for (;;) {
      auto [value, revision] = read(key);
      if (value) return *value;
      auto left = std::chrono::ceil<milliseconds>(deadline - Clock::now());
      if (left <= milliseconds(0))
        throw Error(HM_ERR_TIMEOUT, fmt::format("{}: key '{}' did not appear within {} ms",
                                                describe(), key, timeout.count()));
      // From the revision after the read: a put in between is not missed.
      s_->client->watch(
          full(key), revision + 1,
          [](const json& event) { return event.value("type", "PUT") == "PUT"; }, left);
    }
  }

  std::optional<std::vector<uint8_t>> try_get(const std::string& key) override {
    check("try_get", key, 0);
    return read(key).first;
  }

  int64_t add(const std::string& key, int64_t delta) override {
    check("add", key, 0);
    for (;;) {
      json range = call("/v3/kv/range", {{"key", full(key)}});
      const json* kv = first_kv(range);
      int64_t current = 0;
      if (kv) {
        std::vector<uint8_t> bytes = etcd::unbase64(kv->value("value", ""), "a counter");
        const char* begin = reinterpret_cast<const char*>(bytes.data());
        auto [end, error] = std::from_chars(begin, begin + bytes.size(), current);
        if (bytes.empty() || error != std::errc() || end != begin + bytes.size())
          throw Error(HM_ERR_INVALID_ARGUMENT,
                      fmt::format("{}: add to '{}': the key holds a value that is not a counter",
                                  describe(), key));
      }
      // A read of the counter (pollers add 0) writes nothing: an etcd write is a raft commit.
      if (delta == 0) return current;
      int64_t next;
      if (__builtin_add_overflow(current, delta, &next))
        throw Error(HM_ERR_INVALID_ARGUMENT,
                    fmt::format("{}: add to '{}': the counter would overflow", describe(), key));
      // Written only if nobody wrote the key since it was read (or created it, if it was absent).
      json compare = kv ? json{{"key", full(key)},
                               {"target", "MOD"},
                               {"mod_revision", std::to_string(etcd::integer(*kv, "mod_revision"))}}
                        : json{{"key", full(key)}, {"target", "CREATE"}, {"create_revision", "0"}};
      std::string text = std::to_string(next);
      json txn = {{"compare", json::array({compare})},
                  {"success",
                   json::array({{{"request_put", put_request(key, {text.begin(), text.end()})}}})}};
      if (call("/v3/kv/txn", txn).value("succeeded", false)) return next;
    }
  }

  void erase(const std::string& key) override {
    check("erase", key, 0);
    call("/v3/kv/deleterange", {{"key", full(key)}});
  }

  void own_keys(const std::string& prefix) override {
    std::lock_guard lock(s_->mutex);
    s_->owned.push_back(prefix);
  }

  bool wait_removed(const std::string& key, milliseconds timeout) override {
    const auto deadline = Clock::now() + timeout;
    for (;;) {
      auto [value, revision] = read(key);
      if (!value) return true;
      auto left = std::chrono::ceil<milliseconds>(deadline - Clock::now());
      if (left <= milliseconds(0)) return false;
      s_->client->watch(
          full(key), revision + 1,
          [](const json& event) { return event.value("type", "PUT") == "DELETE"; }, left);
    }
  }

  std::string describe() const override {
    return fmt::format("etcd store {} (keys under '{}')", s_->client->endpoint(),
                       s_->options.prefix);
  }

  std::unique_ptr<KeyValueStore> clone() const override { return std::make_unique<EtcdStore>(s_); }

 private:
  std::string full(const std::string& key) const { return etcd::base64(s_->options.prefix + key); }

  json put_request(const std::string& key, const std::vector<uint8_t>& value) {
    json put = {{"key", full(key)}, {"value", etcd::base64(value)}};
    if (s_->owns(key)) put["lease"] = std::to_string(s_->lease_id());
    return put;
  }

  // The limits every store enforces, with the embedded store's words.
  void check(const char* op, const std::string& key, size_t value_bytes) const {
    if (key.empty() || key.size() > kMaxKeyBytes)
      throw Error(HM_ERR_INVALID_ARGUMENT, fmt::format("{}: {}: key of {} bytes is outside 1..{}",
                                                       describe(), op, key.size(), kMaxKeyBytes));
    if (value_bytes > kMaxValueBytes)
      throw Error(HM_ERR_INVALID_ARGUMENT,
                  fmt::format("{}: {} '{}': value of {} bytes exceeds {}", describe(), op, key,
                              value_bytes, kMaxValueBytes));
  }

  json call(const std::string& path, const json& body) {
    try {
      return s_->client->call(path, body, s_->timeout);
    } catch (const Error& e) {
      throw Error(e.status(), fmt::format("{}: {}", describe(), e.what()));
    }
  }

  static const json* first_kv(const json& range) {
    if (!range.contains("kvs") || !range["kvs"].is_array() || range["kvs"].empty()) return nullptr;
    return &range["kvs"][0];
  }

  // The key's value if it exists, and the store's revision at the read.
  std::pair<std::optional<std::vector<uint8_t>>, int64_t> read(const std::string& key) {
    json range = call("/v3/kv/range", {{"key", full(key)}});
    int64_t revision = etcd::integer(range.value("header", json::object()), "revision");
    const json* kv = first_kv(range);
    if (!kv) return {std::nullopt, revision};
    return {etcd::unbase64(kv->value("value", ""), "a value"), revision};
  }

  std::shared_ptr<Shared> s_;
};

}  // namespace

std::unique_ptr<KeyValueStore> connect_etcd_store(const EtcdOptions& options,
                                                  milliseconds timeout) {
  std::string endpoint = options.endpoint;
  if (endpoint.find("://") == std::string::npos) endpoint = "http://" + endpoint;
  if (!endpoint.starts_with("http://") && !endpoint.starts_with("https://"))
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("etcd endpoint '{}' is neither http://host:port nor https://host:port",
                            options.endpoint));
  if (endpoint.starts_with("http://")) {
    std::string host_port = endpoint.substr(7);
    if (auto slash = host_port.find('/'); slash != std::string::npos) host_port.resize(slash);
    const net::Address where = net::resolve(host_port, /*passive=*/false, "etcd endpoint").front();
    if (!net::is_loopback(where))
      throw Error(HM_ERR_INVALID_ARGUMENT,
                  fmt::format("refusing etcd at {} without TLS: anyone who reaches it could read "
                              "and change the job's keys (use https://, with the files "
                              "HETMESH_ETCD_CA_FILE, HETMESH_ETCD_CERT_FILE and "
                              "HETMESH_ETCD_KEY_FILE name)",
                              endpoint));
  }
  if (options.prefix.empty())
    throw Error(HM_ERR_INVALID_ARGUMENT, "etcd store: the key prefix is empty");
  if (options.user.empty() != options.password_file.empty())
    throw Error(
        HM_ERR_INVALID_ARGUMENT,
        fmt::format("etcd store {}: {} without {}: name both, or neither", endpoint,
                    options.user.empty() ? "a password file" : "a user",
                    options.user.empty() ? "a user (HETMESH_ETCD_USER)"
                                         : "its password file (HETMESH_ETCD_PASSWORD_FILE)"));
  etcd::Auth auth;
  if (!options.user.empty())
    auth = {options.user,
            read_private_file(options.password_file,
                              fmt::format("etcd password file of user '{}'", options.user), 4096)};
  auto shared = std::make_shared<Shared>();
  shared->client = std::make_shared<etcd::Client>(
      endpoint, etcd::Tls{options.ca_file, options.cert_file, options.key_file}, std::move(auth));
  shared->options = options;
  shared->timeout = timeout;
  // Up before anything is published: a range of the prefix, retried while etcd is not listening.
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    try {
      shared->client->call("/v3/kv/range", {{"key", etcd::base64(options.prefix)}}, timeout);
      break;
    } catch (const Error& e) {
      if (e.status() != kStatusPeerLost) throw;
      if (Clock::now() + kConnectRetry >= deadline)
        throw Error(HM_ERR_TIMEOUT, fmt::format("etcd store {}: not reachable within {} ms: {}",
                                                endpoint, timeout.count(), e.what()));
      std::this_thread::sleep_for(kConnectRetry);
    }
  }
  return std::make_unique<EtcdStore>(std::move(shared));
}

}  // namespace hetmesh
