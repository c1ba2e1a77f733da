// The embedded TCP store's server: TcpStoreServer, an in-memory map served over the protocol of
// store_wire.hpp.
//
// Concurrency: a gate (socket_gate.hpp) runs every connection's proof of the job's secret at
// once in one thread, each to its own deadline, so a silent or slow connection delays nobody and
// holds no thread. A client that proved the secret joins the idle clients, which one thread
// watches (epoll, one-shot): an idle client costs a descriptor, never a thread, however long it
// idles (an instance holds its connection for the whole job). When a client's request arrives, a
// worker takes the client, serves that one request and hands it back to the watcher; workers are
// started as requests need them, up to kMaxWorkers (a get that waits holds its worker), and past
// that a request waits for a free one. A get waits on a condition variable signalled by every set
// and add. Once a request has started, every wait is bounded by a deadline, so a dead or stalled
// client costs a timeout, never a hang; the destructor shuts every socket down, which wakes each
// worker. The server closes the connection of a client that breaks any rule of the protocol,
// logging why.
#include "store_wire.hpp"

#include <hetmesh/core/log.hpp>
#include <hetmesh/core/rendezvous.hpp>
#include <hetmesh/core/socket.hpp>
#include <hetmesh/core/socket_gate.hpp>
#include <hetmesh/core/thread.hpp>

#include <fmt/format.h>

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <list>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <utility>

namespace hetmesh {
namespace {

using namespace store_wire;
using net::Clock;
using net::Fd;
using std::chrono::milliseconds;

// Once a request has started, the rest of it (and the reply) must move within this time, so a
// client that stalls mid-frame cannot hold its server thread forever.
constexpr milliseconds kFrameTimeout{10000};
// How often a server thread waiting in get() checks that its client is still there.
constexpr milliseconds kHangupCheck{250};
// Requests served at once (each worker a thread; a get holds one while it waits). Idle clients
// cost none: their number is bounded only by the process's descriptors.
constexpr size_t kMaxWorkers = 1024;

}  // namespace

class TcpStoreServer::Impl {
 public:
  Impl(const std::string& listen, std::optional<JobSecret> secret, StoreLimits limits);
  ~Impl();
  const std::string& address() const { return address_; }

 private:
  struct Client {
    Fd fd;
    std::string peer;
  };
  struct Reply {
    Status status = kOk;
    std::vector<uint8_t> value;
  };

  class Opening;
  // Adds a client that proved the secret to the idle ones (in the gate's thread).
  void admit(Fd fd, const std::string& peer);
  // The watcher's loop: hands each idle client whose request arrives to a worker.
  void watch();
  // A worker's loop: serves one request of each client handed over.
  void work();
  // Serves one request of `client`; false when its connection is over.
  bool serve(Client& client);
  bool serve_one(Client& client);
  // Ends a client's connection and forgets it.
  void drop(Client* client);
  std::optional<Reply> execute(int fd, const Frame& frame, const std::string& key,
                               std::vector<uint8_t> value);
  Reply add(const std::string& key, int64_t delta);

  // A set's or a counter's refusal when storing `bytes` under `key` would pass the limits;
  // nullopt when it fits. Caller holds mutex_.
  std::optional<Reply> over_limits(const std::string& key, size_t bytes) const;
  // Stores `value` under `key`, keeping stored_bytes_. Caller holds mutex_.
  void store(const std::string& key, std::vector<uint8_t> value);

  std::string address_;
  JobSecret secret_ = JobSecret::none();
  StoreLimits limits_;
  uint64_t stored_bytes_ = 0;  // keys and values of data_, under mutex_

  std::mutex mutex_;  // guards data_ and stopping_
  std::condition_variable changed_;
  std::unordered_map<std::string, std::vector<uint8_t>> data_;
  std::atomic<bool> stopping_{false};

  std::mutex clients_mutex_;  // guards clients_
  std::unordered_map<Client*, std::unique_ptr<Client>> clients_;
  Fd epoll_;  // the idle clients, one-shot: a client is out of it while a worker serves it
  Fd wake_;   // eventfd in epoll_: stops the watcher
  std::mutex queue_mutex_;  // guards ready_ and idle_workers_
  std::condition_variable queued_;
  std::deque<Client*> ready_;  // clients whose request arrived, for the next free worker
  size_t idle_workers_ = 0;
  std::vector<std::thread> workers_;  // started by the watcher; joined after it ended
  bool worker_failure_said_ = false;  // the watcher's own
  std::thread watcher_;
  std::unique_ptr<net::Gate> gate_;
};

// The store's side of the challenge-response of store_wire.hpp, for one connection.
class TcpStoreServer::Impl::Opening : public net::Opening {
 public:
  explicit Opening(const JobSecret& secret) : secret_(secret) {}

  Step start() override {
    std::vector<uint8_t> challenge(kChallengeBytes);
    put_hello_head(challenge.data());
    random_bytes(std::span(challenge).subspan(8, kNonceBytes));
    std::memcpy(nonce_, challenge.data() + 8, kNonceBytes);
    return Step{std::move(challenge), kAnswerBytes, false, {}};
  }

  Step next(std::span<const uint8_t> answer) override {
    Step step;
    try {
      check_hello_head(answer.data());
    } catch (const Malformed& e) {
      step.refusal = e.what();
      return step;
    }
    std::span<const uint8_t> client_nonce = answer.subspan(8, kNonceBytes);
    JobSecret::Mac claimed;
    std::memcpy(claimed.data(), answer.data() + 8 + kNonceBytes, claimed.size());
    step.send.assign(kVerdictBytes, 0);
    if (JobSecret::same(claimed, secret_.mac(kClientLabel, nonce_, client_nonce))) {
      JobSecret::Mac mine = secret_.mac(kServerLabel, client_nonce, nonce_);
      std::memcpy(step.send.data() + 1, mine.data(), mine.size());
      step.admitted = true;
    } else {
      step.send[0] = 1;
      step.refusal = "it does not hold the job's secret";
    }
    return step;
  }

 private:
  const JobSecret& secret_;
  uint8_t nonce_[kNonceBytes]{};
};

TcpStoreServer::Impl::Impl(const std::string& listen, std::optional<JobSecret> secret,
                           StoreLimits limits)
    : limits_(limits) {
  if (!secret) secret = JobSecret::from_environment();
  const net::Address where = net::resolve(listen, /*passive=*/true, "store address").front();
  if (!secret && !net::is_loopback(where))
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("tcp store: refusing to listen on {} without the job's secret: anyone "
                            "who reaches it could read and change the job's keys (name a secret "
                            "file: [rendezvous] secret_file, or {})",
                            listen, JobSecret::kFileVariable));
  if (secret) secret_ = *secret;
  Fd listener = net::listen_on(where, "tcp store " + listen);
  address_ = net::to_string(net::local_address(listener.get()));
  epoll_ = Fd(epoll_create1(EPOLL_CLOEXEC));
  wake_ = Fd(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  epoll_event wake{};
  wake.events = EPOLLIN;
  wake.data.ptr = nullptr;
  if (!epoll_ || !wake_ || epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, wake_.get(), &wake) != 0)
    throw Error(HM_ERR_BACKEND, fmt::format("tcp store {}: creating its client watcher: {}",
                                            address_, describe_errno(errno)));
  watcher_ = start_thread("hm-store-watch", [this] { watch(); });
  net::GateLimits gate_limits;
  gate_limits.deadline = kFrameTimeout;
  gate_ = std::make_unique<net::Gate>(
      std::move(listener), "tcp store " + address_,
      [this](int, const std::string&) { return std::make_unique<Opening>(secret_); },
      [this](Fd fd, net::Opening&, const std::string& peer) { admit(std::move(fd), peer); },
      gate_limits);
  log(LogLevel::info, "tcp store listening on {}", address_);
}

TcpStoreServer::Impl::~Impl() {
  {
    std::lock_guard lock(mutex_);  // so no get() misses the wake-up between check and wait
    stopping_ = true;
  }
  changed_.notify_all();
  gate_.reset();  // no client is admitted after this
  uint64_t one = 1;
  if (::write(wake_.get(), &one, sizeof one) != sizeof one)
    log(LogLevel::error, "tcp store {}: cannot wake its watcher: {}", address_, strerror(errno));
  watcher_.join();  // no client is handed to a worker after this
  {
    // Shutting a socket down wakes the worker serving it; the socket is closed only when it is
    // forgotten, under this lock, so its number cannot be reused under a running worker.
    std::lock_guard lock(clients_mutex_);
    for (const auto& [_, client] : clients_)
      client->fd.shutdown();
  }
  {
    std::lock_guard lock(queue_mutex_);
    ready_.clear();
  }
  queued_.notify_all();
  for (std::thread& worker : workers_)
    worker.join();
}

void TcpStoreServer::Impl::admit(Fd fd, const std::string& peer) {
  auto client = std::make_unique<Client>();
  client->fd = std::move(fd);
  client->peer = peer;
  epoll_event event{};
  event.events = EPOLLIN | EPOLLRDHUP | EPOLLONESHOT;
  event.data.ptr = client.get();
  std::lock_guard lock(clients_mutex_);
  if (epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, client->fd.get(), &event) != 0) {
    log(LogLevel::warn, "tcp store {}: refusing {}: cannot watch its connection: {}", address_,
        peer, describe_errno(errno));
    return;
  }
  Client* key = client.get();
  clients_.emplace(key, std::move(client));
}

void TcpStoreServer::Impl::watch() {
  epoll_event events[64];
  for (;;) {
    const int n = epoll_wait(epoll_.get(), events, 64, -1);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      log(LogLevel::error, "tcp store {}: epoll_wait: {}; no more requests are served", address_,
          strerror(errno));
      return;
    }
    std::vector<Client*> arrived;
    for (int i = 0; i < n; ++i) {
      auto* client = static_cast<Client*>(events[i].data.ptr);
      if (client == nullptr) return;  // stopping
      // A client gone with no request left in its socket (its process ended) is forgotten here:
      // a job's end, every instance at once, starts no worker.
      bool gone = false;
      if ((events[i].events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) != 0) {
        uint8_t byte;
        const ssize_t r = ::recv(client->fd.get(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
        gone = r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
      }
      if (gone)
        drop(client);
      else
        arrived.push_back(client);
    }
    // Every client handed over has a worker of its own: an idle one, or one started now (a get
    // may hold its worker long, so none waits behind another).
    size_t start = 0;
    {
      std::lock_guard lock(queue_mutex_);
      ready_.insert(ready_.end(), arrived.begin(), arrived.end());
      if (ready_.size() > idle_workers_)
        start = std::min(ready_.size() - idle_workers_, kMaxWorkers - workers_.size());
      idle_workers_ += start;  // counted idle from now: each takes a client as it starts
    }
    for (size_t i = 0; i < start; ++i) {
      try {
        workers_.emplace_back([this] { work(); });
      } catch (const std::system_error& e) {  // the clients wait for a worker that exists
        if (!worker_failure_said_)            // once: it is tried again for every client that comes
          log(LogLevel::warn, "tcp store {}: cannot start a worker ({} run): {}", address_,
              workers_.size(), e.what());
        worker_failure_said_ = true;
        std::lock_guard lock(queue_mutex_);
        idle_workers_ -= start - i;
        break;
      }
    }
    queued_.notify_all();
  }
}

void TcpStoreServer::Impl::work() {
  std::unique_lock lock(queue_mutex_);
  for (;;) {  // counted in idle_workers_ here (by the watcher, for the first round)
    queued_.wait(lock, [&] { return stopping_ || !ready_.empty(); });
    --idle_workers_;
    if (stopping_) return;
    Client* client = ready_.front();
    ready_.pop_front();
    lock.unlock();
    if (!serve(*client) || stopping_) {
      drop(client);
    } else {
      // Back to the idle ones; a request already waiting in the socket fires at once.
      epoll_event event{};
      event.events = EPOLLIN | EPOLLRDHUP | EPOLLONESHOT;
      event.data.ptr = client;
      if (epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, client->fd.get(), &event) != 0) {
        log(LogLevel::warn, "tcp store {}: closing the connection from {}: cannot watch it: {}",
            address_, client->peer, describe_errno(errno));
        drop(client);
      }
    }
    lock.lock();
    ++idle_workers_;
  }
}

void TcpStoreServer::Impl::drop(Client* client) {
  std::lock_guard lock(clients_mutex_);
  epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, client->fd.get(), nullptr);
  clients_.erase(client);  // closes the socket: the peer sees the close now
}

bool TcpStoreServer::Impl::serve(Client& client) {
  try {
    return serve_one(client);
  } catch (const Malformed& e) {
    log(LogLevel::warn, "tcp store {}: closing the connection from {}: malformed request: {}",
        address_, client.peer, e.what());
  } catch (const std::exception& e) {
    if (!stopping_)
      log(LogLevel::warn, "tcp store {}: closing the connection from {}: {}", address_, client.peer,
          e.what());
  }
  return false;
}

bool TcpStoreServer::Impl::serve_one(Client& client) {
  int fd = client.fd.get();
  uint8_t raw[kRequestHeaderBytes];
  // The watcher saw the request's first byte (or the connection's end) arrive: a started frame
  // has a limit. A client that goes away between requests (closed, or reset: its process ended
  // or was killed) is an ordinary end, not worth a warning.
  net::Deadline deadline = Clock::now() + kFrameTimeout;
  try {
    if (!net::recv_exact(fd, raw, 1, "request", deadline)) return false;
  } catch (const Error& e) {
    if (e.status() != kStatusPeerLost) throw;
    return false;
  }
  net::recv_all(fd, raw + 1, sizeof raw - 1, "request header", deadline);
  Frame frame = decode_request(raw);
  std::string key(frame.key_length, '\0');
  net::recv_all(fd, key.data(), key.size(), "request key", deadline);
  // Allocated as its bytes arrive: a request that declares 16 MiB and sends nothing costs nothing.
  constexpr size_t kStep = 64 << 10;
  std::vector<uint8_t> value;
  for (size_t got = 0; got < frame.value_length;) {
    const size_t n = std::min<size_t>(kStep, frame.value_length - got);
    value.resize(got + n);
    net::recv_all(fd, value.data() + got, n, "request value", deadline);
    got += n;
  }

  std::optional<Reply> reply = execute(fd, frame, key, std::move(value));
  if (!reply) return false;
  std::vector<uint8_t> bytes = encode_reply(reply->status, reply->value);
  net::send_all(fd, bytes.data(), bytes.size(), "reply", Clock::now() + kFrameTimeout);
  return true;
}

std::optional<TcpStoreServer::Impl::Reply> TcpStoreServer::Impl::execute(
    int fd, const Frame& frame, const std::string& key, std::vector<uint8_t> value) {
  std::unique_lock lock(mutex_);
  switch (frame.code) {
    case kSet:
      if (auto refused = over_limits(key, value.size())) return refused;
      store(key, std::move(value));
      lock.unlock();
      changed_.notify_all();
      return Reply{};
    case kGet: {
      milliseconds wait(static_cast<int64_t>(
          std::min<uint64_t>(get_u64(value.data()), static_cast<uint64_t>(kMaxWait.count()))));
      auto deadline = Clock::now() + wait;
      auto ready = [&] { return stopping_ || data_.count(key) > 0; };
      // Waits in slices, to notice a client that died meanwhile: its thread is freed at once
      // rather than when its (possibly long) wait ends.
      while (!ready() && Clock::now() < deadline) {
        changed_.wait_until(lock, std::min(deadline, Clock::now() + kHangupCheck), ready);
        if (!ready() && net::hung_up(fd)) return std::nullopt;
      }
      if (stopping_) return std::nullopt;
      auto it = data_.find(key);
      if (it == data_.end()) return Reply{kTimedOut, {}};
      return Reply{kOk, it->second};
    }
    case kTryGet: {
      auto it = data_.find(key);
      if (it == data_.end()) return Reply{kNotFound, {}};
      return Reply{kOk, it->second};
    }
    case kAdd: {
      Reply reply = add(key, static_cast<int64_t>(get_u64(value.data())));
      lock.unlock();
      changed_.notify_all();  // the counter may be what a get() waits for
      return reply;
    }
    case kErase:
      if (auto it = data_.find(key); it != data_.end()) {
        stored_bytes_ -= key.size() + it->second.size();
        data_.erase(it);
      }
      return Reply{};
  }
  return Reply{kRefused, {}};  // unreachable: decode_request checked the op
}

// Counters are stored as decimal text, so get() on one reads as "3".
TcpStoreServer::Impl::Reply TcpStoreServer::Impl::add(const std::string& key, int64_t delta) {
  auto refuse = [](const std::string& why) {
    return Reply{kRefused, std::vector<uint8_t>(why.begin(), why.end())};
  };
  int64_t current = 0;
  if (auto it = data_.find(key); it != data_.end()) {
    const char* begin = reinterpret_cast<const char*>(it->second.data());
    const char* end = begin + it->second.size();
    auto [stop, ec] = std::from_chars(begin, end, current);
    if (it->second.empty() || ec != std::errc() || stop != end)
      return refuse("the key holds a value that is not a counter");
  }
  int64_t next;
  if (__builtin_add_overflow(current, delta, &next)) return refuse("the counter would overflow");
  std::string text = std::to_string(next);
  if (auto refused = over_limits(key, text.size())) return *refused;
  store(key, std::vector<uint8_t>(text.begin(), text.end()));
  return Reply{kOk, encode_i64(next)};
}

std::optional<TcpStoreServer::Impl::Reply> TcpStoreServer::Impl::over_limits(const std::string& key,
                                                                             size_t bytes) const {
  auto it = data_.find(key);
  const bool fresh = it == data_.end();
  const uint64_t after =
      stored_bytes_ - (fresh ? 0 : it->second.size()) + bytes + (fresh ? key.size() : 0);
  std::string why;
  if (fresh && data_.size() >= limits_.max_keys)
    why = fmt::format("the store holds {} keys, its cap", data_.size());
  else if (after > limits_.max_bytes)
    why =
        fmt::format("the store would hold {} bytes, over its cap of {}", after, limits_.max_bytes);
  if (why.empty()) return std::nullopt;
  log(LogLevel::warn, "tcp store {}: refusing to store '{}': {}", address_, key, why);
  return Reply{kFull, std::vector<uint8_t>(why.begin(), why.end())};
}

void TcpStoreServer::Impl::store(const std::string& key, std::vector<uint8_t> value) {
  auto [it, fresh] = data_.try_emplace(key);
  stored_bytes_ = stored_bytes_ - it->second.size() + value.size() + (fresh ? key.size() : 0);
  it->second = std::move(value);
}

TcpStoreServer::TcpStoreServer(const std::string& listen, std::optional<JobSecret> secret,
                               StoreLimits limits)
    : impl_(std::make_unique<Impl>(listen, std::move(secret), limits)) {}
TcpStoreServer::~TcpStoreServer() = default;
std::string TcpStoreServer::address() const {
  return impl_->address();
}

}  // namespace hetmesh
