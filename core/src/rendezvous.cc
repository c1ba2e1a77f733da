// Store-independent rendezvous helpers: a job's published failure, the waits that watch it, the
// reusable barrier and Rendezvous (rendezvous.hpp).
#include <hetmesh/core/rendezvous.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <thread>

namespace hetmesh {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

KeyValueStore::~KeyValueStore() = default;

void KeyValueStore::own_keys(const std::string&) {}

std::unique_ptr<KeyValueStore> connect_store(const std::string& address,
                                             std::chrono::milliseconds timeout,
                                             std::optional<JobSecret> secret) {
  if (!address.starts_with("http://") && !address.starts_with("https://"))
    return connect_tcp_store(address, timeout, std::move(secret));
  auto from_environment = [](const char* name) {
    const char* value = std::getenv(name);
    return std::string(value ? value : "");
  };
  EtcdOptions options;
  options.endpoint = address;
  options.prefix = "hetmesh/";  // then the job id: every key is "hetmesh/<job>/..."
  options.ca_file = from_environment("HETMESH_ETCD_CA_FILE");
  options.cert_file = from_environment("HETMESH_ETCD_CERT_FILE");
  options.key_file = from_environment("HETMESH_ETCD_KEY_FILE");
  options.user = from_environment("HETMESH_ETCD_USER");
  options.password_file = from_environment("HETMESH_ETCD_PASSWORD_FILE");
  return connect_etcd_store(options, timeout);
}

bool KeyValueStore::wait_removed(const std::string& key, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (try_get(key)) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

namespace {

std::string failure_key(const std::string& job_id) {
  return job_id + "/failed";
}

}  // namespace

bool publish_job_failure(KeyValueStore& store, const std::string& job_id,
                         const std::string& report) {
  // The counter makes "first" atomic; a waiter that looks between the add and the set sees the
  // report one check later.
  if (store.add(job_id + "/failures", 1) != 1) return false;
  store.set(failure_key(job_id), std::vector<uint8_t>(report.begin(), report.end()));
  return true;
}

std::optional<std::string> job_failure(KeyValueStore& store, const std::string& job_id) {
  auto report = store.try_get(failure_key(job_id));
  if (!report) return std::nullopt;
  return std::string(report->begin(), report->end());
}

std::vector<uint8_t> wait_for_key(KeyValueStore& store, const std::string& key,
                                  milliseconds timeout, const std::string& job_id) {
  if (job_id.empty()) return store.get(key, timeout);
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    const auto left = std::max(milliseconds(0),
                               std::chrono::duration_cast<milliseconds>(deadline - Clock::now()));
    const milliseconds slice = std::min(left, kFailureCheck);
    try {
      return store.get(key, slice);
    } catch (const Error& e) {
      if (e.status() != HM_ERR_TIMEOUT) throw;
    }
    // A store that stopped answering fails this look with its own error. (How long the slice
    // took says nothing: on a loaded machine a 100 ms slice can take seconds.)
    if (auto report = job_failure(store, job_id))
      throw Error(kStatusJobFailed, fmt::format("job '{}' failed: {}", job_id, *report));
    if (slice == left)
      throw Error(HM_ERR_TIMEOUT, fmt::format("{}: key '{}' did not appear within {} ms",
                                              store.describe(), key, timeout.count()));
  }
}

// Arrivals are counted on one ever-growing counter, so arrival n belongs to generation
// (n-1)/world_size, and the last arrival of a generation opens it by setting its "done" key.
// Reuse needs no reset: a caller that is already in generation g+1 only ever waits on g+1's key.
void barrier(KeyValueStore& store, const std::string& name, int world_size, milliseconds timeout,
             const std::string& job_id) {
  if (world_size < 1)
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("barrier '{}': world size {} is not positive", name, world_size));
  const std::string counter = "barrier/" + name + "/arrived";
  auto done_key = [&](int64_t generation) {
    return fmt::format("barrier/{}/done/{}", name, generation);
  };
  int64_t arrival = store.add(counter, 1);
  int64_t generation = (arrival - 1) / world_size;
  if (arrival % world_size == 0) {
    store.set(done_key(generation), {1});
    // Every caller of this generation has returned from the previous one (they had to, to
    // arrive here), so nobody can still wait on its key.
    if (generation > 0) store.erase(done_key(generation - 1));
  }
  try {
    wait_for_key(store, done_key(generation), timeout, job_id);
  } catch (const Error& e) {
    if (e.status() != HM_ERR_TIMEOUT) throw;
    int64_t arrived = store.add(counter, 0) - generation * world_size;
    throw Error(HM_ERR_TIMEOUT,
                fmt::format("{}: barrier '{}' (round {}): only {} of {} arrived within {} ms",
                            store.describe(), name, generation,
                            std::min<int64_t>(arrived, world_size), world_size, timeout.count()));
  }
}

namespace {

std::string instance_key(const std::string& job_id, const std::string& role, int rank,
                         const std::string& what) {
  return fmt::format("{}/{}/{}/{}", job_id, role, rank, what);
}

// Waits for `what` of every instance of the world, under one deadline; on timeout names the
// missing instances, which is what someone debugging a stuck launch needs.
void wait_for_all(KeyValueStore& store, const std::string& job_id, int attention, int ffn,
                  const std::string& what, milliseconds timeout) {
  const std::pair<const char*, int> world[] = {{"attention", attention}, {"ffn", ffn}};
  auto deadline = Clock::now() + timeout;
  for (const auto& [role, count] : world) {
    for (int rank = 0; rank < count; ++rank) {
      auto left = std::max(milliseconds(0),
                           std::chrono::duration_cast<milliseconds>(deadline - Clock::now()));
      try {
        wait_for_key(store, instance_key(job_id, role, rank, what), left, job_id);
      } catch (const Error& e) {
        if (e.status() != HM_ERR_TIMEOUT) throw;
        std::vector<std::string> missing;
        for (const auto& [r, n] : world)
          for (int i = 0; i < n; ++i)
            if (!store.try_get(instance_key(job_id, r, i, what)))
              missing.push_back(fmt::format("{}/{}", r, i));
        throw Error(HM_ERR_TIMEOUT,
                    fmt::format("{}: job '{}': {} of {} instance(s) not {} within {} ms: {}",
                                store.describe(), job_id, missing.size(), attention + ffn, what,
                                timeout.count(), fmt::join(missing, ", ")));
      }
    }
  }
}

bool valid_role(const std::string& role) {
  return role == "attention" || role == "ffn";
}

void check_role_rank(const std::string& role, int rank) {
  if (!valid_role(role))
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("rendezvous: role '{}' is neither \"attention\" nor \"ffn\"", role));
  if (rank < 0)
    throw Error(HM_ERR_INVALID_ARGUMENT, fmt::format("rendezvous: rank {} is negative", rank));
}

}  // namespace

Rendezvous::Rendezvous(KeyValueStore& store, std::string job_id, std::string role, int rank)
    : store_(store), job_id_(std::move(job_id)), role_(std::move(role)), rank_(rank) {
  // '/' separates the parts of a key, so a job id with one could read another job's keys.
  if (job_id_.empty() || job_id_.find('/') != std::string::npos)
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("rendezvous: job id '{}' must be non-empty and free of '/'", job_id_));
  check_role_rank(role_, rank_);
}

std::string Rendezvous::key(const std::string& role, int rank, const std::string& what) const {
  return instance_key(job_id_, role, rank, what);
}

void Rendezvous::publish(const std::string& what, const std::vector<uint8_t>& blob) {
  store_.set(key(role_, rank_, what), blob);
}

bool Rendezvous::report_failure(const std::string& message) {
  char host[256] = "?";
  gethostname(host, sizeof host - 1);
  return publish_job_failure(
      store_, job_id_,
      fmt::format("{}:{} on {} pid {}: {}", role_, rank_, host, getpid(), message));
}

std::vector<uint8_t> Rendezvous::fetch(const std::string& role, int rank, const std::string& what,
                                       milliseconds timeout) {
  check_role_rank(role, rank);
  return wait_for_key(store_, key(role, rank, what), timeout, job_id_);
}

void Rendezvous::wait_for_world(int attention, int ffn, milliseconds timeout) {
  int own_count = role_ == "attention" ? attention : ffn;
  if (attention < 1 || ffn < 1 || rank_ >= own_count)
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("rendezvous: {} rank {} is not part of a {}A{}F world", role_, rank_,
                            attention, ffn));
  publish("ready", {1});
  wait_for_all(store_, job_id_, attention, ffn, "ready", timeout);
}

void Rendezvous::leave() {
  if (left_) return;
  publish("left", {1});
  left_ = true;
}

bool Rendezvous::has_left(const std::string& role, int rank) {
  check_role_rank(role, rank);
  return store_.try_get(key(role, rank, "left")).has_value();
}

void wait_for_departure(KeyValueStore& store, const std::string& job_id, int attention, int ffn,
                        milliseconds timeout) {
  if (attention < 0 || ffn < 0)
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("wait_for_departure: negative world {}A{}F", attention, ffn));
  wait_for_all(store, job_id, attention, ffn, "left", timeout);
}

}  // namespace hetmesh
