// Rendezvous: how the processes of a job find each other before any data moves.
//
// Everything goes through a small key-value interface with two stores behind it: the embedded
// TCP store (the default: one process hosts a TcpStoreServer, every process connects to it) and
// etcd, where each instance's keys live on a lease that expires when it dies. On top of any store
// there are a reusable barrier and Rendezvous, which publishes an instance's blobs (endpoint and
// slot-table descriptors) under "<job>/<role>/<rank>/<what>" and waits for the whole world.
//
// Every blocking call takes a timeout; a store that dies makes calls fail promptly with
// Error(kStatusPeerLost) (or HM_ERR_TIMEOUT when it stops answering), never hang.
//
// A job's first failure: an instance that cannot go on (a bad device selector, a bad plugin
// option) publishes why under "<job>/failed" (Rendezvous::report_failure), and every wait of the
// job's rendezvous checks that key between slices of at most kFailureCheck and then throws
// Error(kStatusJobFailed) carrying that report. So one bad instance fails the others within a
// fraction of a second, with its own error and origin, not after their whole join timeouts.
#pragma once

#include <hetmesh/core/error.hpp>
#include <hetmesh/core/job_secret.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

// Exported from the library, which hides every other symbol (core/README.md, "Exports").
#pragma GCC visibility push(default)

namespace hetmesh {

class KeyValueStore {
 public:
  // Limits every store enforces, so a blob fits in one request of the TCP store's protocol.
  static constexpr size_t kMaxKeyBytes = 4 * 1024;
  static constexpr size_t kMaxValueBytes = 16 * 1024 * 1024;

  virtual ~KeyValueStore();
  // Creates or replaces the key, and wakes every get() waiting for it.
  virtual void set(const std::string& key, const std::vector<uint8_t>& value) = 0;
  // Waits until the key exists; throws Error(HM_ERR_TIMEOUT) naming the key and the store.
  virtual std::vector<uint8_t> get(const std::string& key, std::chrono::milliseconds timeout) = 0;
  virtual std::optional<std::vector<uint8_t>> try_get(const std::string& key) = 0;
  // Atomic add on a counter (created at 0), returning the new value: for barriers and rank
  // assignment. The counter's value reads back through get() as decimal text, e.g. "3". Throws
  // Error(INVALID_ARGUMENT) if the key holds something that is not a counter.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // Removes the key; erasing a missing key is not an error.
  virtual void erase(const std::string& key) = 0;
  // For messages: "tcp store 127.0.0.1:29500".
  virtual std::string describe() const = 0;
  // Another client of the same store, with connections of its own: for an object or thread that
  // may outlive this client (an engine's rejoin thread). Throws as connecting does.
  virtual std::unique_ptr<KeyValueStore> clone() const = 0;
  // Keys that this client (or a clone) sets under `prefix` from now on belong to this process: a
  // store with leases (etcd) deletes them once the process stops renewing its lease (it died, or
  // lost the store), which ends every wait_removed on them. The embedded store keeps every key
  // until it is erased.
  virtual void own_keys(const std::string& prefix);
  // Waits until `key` does not exist: true if it is gone, false if it still exists after
  // `timeout`. etcd watches for the deletion; the embedded store looks every 20 ms.
  virtual bool wait_removed(const std::string& key, std::chrono::milliseconds timeout);
};

// What one embedded store holds at most, keys and values together: a set or an add beyond either
// cap is refused (Error(HM_ERR_OUT_OF_MEMORY) at the client), so no client can grow the store's
// memory without bound. A job's keys are a few per instance and epoch.
struct StoreLimits {
  size_t max_keys = size_t{1} << 20;
  uint64_t max_bytes = uint64_t{1} << 30;
};

// The embedded store: an in-memory map served over TCP, one thread per client. Hosted by one
// process of the job (the engine's launcher); it lives as long as this object.
class TcpStoreServer {
 public:
  // Listens on "host:port" ("[::1]:port" for IPv6); port 0 picks a free one. Every connection
  // must prove `secret` (job_secret.hpp) before a request is read; without one (nullopt: the one
  // JobSecret::from_environment() finds, if any) the store serves only loopback addresses, and
  // refuses to listen beyond them. Throws Error if it cannot listen.
  explicit TcpStoreServer(const std::string& listen, std::optional<JobSecret> secret = std::nullopt,
                          StoreLimits limits = {});
  // Stops accepting, disconnects every client (their calls fail with kStatusPeerLost) and joins
  // every thread.
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  // "host:port" with the real port: what clients pass to connect_tcp_store. With a wildcard
  // listen host ("0.0.0.0") it is the wildcard: clients on other hosts use this host's name.
  std::string address() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

// Connects to a TcpStoreServer at "host:port", retrying until it is up or `timeout` passes
// (Error(HM_ERR_TIMEOUT)), and proves `secret` on each of its connections (nullopt: the one
// JobSecret::from_environment() finds, else none); a store that refuses it is
// Error(kStatusNotAuthorized), and one that cannot prove the same secret back is refused. The
// same timeout bounds each later request's round trip; get() waits its own timeout on top. The
// store is safe to share between threads: concurrent calls use separate connections, so one
// thread's blocking get() never holds up another's set().
std::unique_ptr<KeyValueStore> connect_tcp_store(const std::string& address,
                                                 std::chrono::milliseconds timeout,
                                                 std::optional<JobSecret> secret = std::nullopt);

// A store in etcd (Debian etcd-server 3.4), through its v3 JSON gateway.
struct EtcdOptions {
  // "http://host:port" (loopback only: plain HTTP beyond it is refused) or "https://host:port".
  std::string endpoint = "http://127.0.0.1:2379";
  // Every key goes under it: one job's keys never meet another's ("hetmesh/<job>/").
  std::string prefix;
  // The keys a process owns (own_keys) are deleted this long after it stops renewing them.
  std::chrono::seconds lease_ttl{5};
  // TLS with etcd's client certificates, where etcd is configured for it: PEM files. Empty: the
  // system's CAs and no client certificate. connect_store takes them from HETMESH_ETCD_CA_FILE,
  // HETMESH_ETCD_CERT_FILE and HETMESH_ETCD_KEY_FILE.
  std::string ca_file, cert_file, key_file;
  // One of etcd's own users, where etcd has authentication on (`etcdctl auth enable`): its name
  // and the file that holds its password (only its owner may read it; never a command line).
  // Empty: none. connect_store takes them from HETMESH_ETCD_USER and HETMESH_ETCD_PASSWORD_FILE.
  std::string user, password_file;
};

// Connects to etcd, retrying until it answers or `timeout` passes (Error(HM_ERR_TIMEOUT) saying
// why); the same timeout bounds each later request. Throws Error(INVALID_ARGUMENT) for an
// endpoint that is not http(s)://host:port, or plain HTTP beyond loopback. Safe to share between
// threads; get() and wait_removed() wait on etcd watches.
std::unique_ptr<KeyValueStore> connect_etcd_store(const EtcdOptions& options,
                                                  std::chrono::milliseconds timeout);

// The store at `address`: etcd for "http://host:port" or "https://host:port" (keys under
// "hetmesh/", TLS files from the environment), else the embedded TCP store at "host:port"
// (connect_tcp_store, with `secret`, or else the one from the environment).
std::unique_ptr<KeyValueStore> connect_store(const std::string& address,
                                             std::chrono::milliseconds timeout,
                                             std::optional<JobSecret> secret = std::nullopt);

// How often a rendezvous wait looks for its job's published failure.
constexpr std::chrono::milliseconds kFailureCheck{100};

// Publishes `report` as the failure of job `job_id`, unless an instance did so first; returns
// whether this call was the first. The first report is the job's root cause: later ones are
// usually its consequences.
bool publish_job_failure(KeyValueStore& store, const std::string& job_id,
                         const std::string& report);
// The failure published for job `job_id`, if any.
std::optional<std::string> job_failure(KeyValueStore& store, const std::string& job_id);

// store.get(key, timeout), watching job `job_id`'s failure: throws Error(kStatusJobFailed)
// "job 'ID' failed: REPORT" within about kFailureCheck of its publication. An empty job_id
// watches nothing.
std::vector<uint8_t> wait_for_key(KeyValueStore& store, const std::string& key,
                                  std::chrono::milliseconds timeout, const std::string& job_id);

// Blocks until `world_size` callers have reached the barrier `name`, or throws
// Error(HM_ERR_TIMEOUT) saying how many arrived. Reusable: every participant may call it again
// with the same name, as long as all call it the same number of times. A timeout leaves that
// name unusable (the job is failing anyway). With a job id, it ends early when that job's failure
// is published (wait_for_key).
void barrier(KeyValueStore& store, const std::string& name, int world_size,
             std::chrono::milliseconds timeout, const std::string& job_id = {});

// One instance's view of a job's rendezvous. Keys are "<job_id>/<role>/<rank>/<what>".
class Rendezvous {
 public:
  // role is "attention" or "ffn"; job_id is non-empty and has no '/'. Throws
  // Error(INVALID_ARGUMENT) otherwise.
  Rendezvous(KeyValueStore& store, std::string job_id, std::string role, int rank);

  const std::string& job_id() const { return job_id_; }
  const std::string& role() const { return role_; }
  int rank() const { return rank_; }

  // Publishes a blob of this instance under `what` ("endpoint", "slots", ...).
  void publish(const std::string& what, const std::vector<uint8_t>& blob);
  // Publishes this instance's failure for the whole job as "ROLE:RANK on HOST pid PID: message"
  // (publish_job_failure); returns whether it was the job's first.
  bool report_failure(const std::string& message);
  // Waits for another instance's blob; ends early if the job's failure is published.
  std::vector<uint8_t> fetch(const std::string& role, int rank, const std::string& what,
                             std::chrono::milliseconds timeout);
  // Publishes "ready" for this instance, then waits until every instance of the world
  // (`attention` A ranks and `ffn` F ranks) has: call it after publishing everything peers need.
  // On timeout the message lists who is missing; ends early if the job's failure is published.
  void wait_for_world(int attention, int ffn, std::chrono::milliseconds timeout);
  // Marks this instance as gone ("left"), so peers and the store's host see a clean teardown
  // rather than a crash. Idempotent.
  void leave();
  // Whether the instance has left.
  bool has_left(const std::string& role, int rank);

  std::string key(const std::string& role, int rank, const std::string& what) const;

 private:
  KeyValueStore& store_;
  std::string job_id_;
  std::string role_;
  int rank_;
  bool left_ = false;
};

// Waits until every instance of job `job_id` (`attention` A and `ffn` F ranks) has called
// Rendezvous::leave(). The store's host, which need not be an instance itself, calls this before
// it destroys the server, so nobody loses the store mid-teardown. On timeout the message lists
// who has not left; ends early if the job's failure is published.
void wait_for_departure(KeyValueStore& store, const std::string& job_id, int attention, int ffn,
                        std::chrono::milliseconds timeout);

}  // namespace hetmesh

#pragma GCC visibility pop
