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
// that a request waits for a free one. Where no worker runs and none can start (the host is out of
// threads or of address space), nobody would ever serve the request, so the watcher answers it at
// once in a worker's place, unread, with why (unavailable, store_wire.hpp), and ends that
// connection: the client hears the cause instead of waiting out its deadline. The watcher never
// blocks on a client doing so, and a round in which it cannot allocate still answers every client.
// A get waits on a condition variable signalled by every set and add. Once a request has started,
// every wait is bounded by a deadline, so a dead or stalled client costs a timeout, never a hang;
// the destructor shuts every socket down, which wakes each worker. The server closes the
// connection of a client that breaks any rule of the protocol, logging why.
#include "store_wire.hpp"

#include <hetmesh/core/log.hpp>
#include <hetmesh/core/rendezvous.hpp>
#include <hetmesh/core/socket.hpp>
#include <hetmesh/core/socket_gate.hpp>
#include <hetmesh/core/thread.hpp>

#include <fmt/format.h>

#include <pthread.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
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
#include <new>
#include <span>
#include <string_view>
#include <system_error>
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
// Events the watcher takes from epoll at a time.
constexpr int kEvents = 64;
// A refused client may still send the rest of its request; past one request's worth it is not
// following the protocol, and its connection is closed.
constexpr uint64_t kMaxDiscard =
    kRequestHeaderBytes + KeyValueStore::kMaxKeyBytes + KeyValueStore::kMaxValueBytes;
// The most of a refusal's reason that is sent.
constexpr size_t kMaxReason = 1024;

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
    bool refused = false;    // answered unavailable: its connection ends (the watcher's own)
    uint64_t discarded = 0;  // bytes it sent after that, dropped
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
  // Queues the clients whose request arrived for the workers, starting those they need; where no
  // worker runs and none can start, refuses them instead. The watcher's.
  void hand_over(std::span<Client* const> arrived) noexcept;
  // Says, once, that a worker could not start, and keeps why for the refusals.
  void worker_failed(const std::string& cause) noexcept;
  // Answers `client`'s request, unread, with kUnavailable and `why`, and ends its connection.
  void refuse(Client* client, std::string_view why) noexcept;
  // Drops what a refused client still sends, and forgets it once it has closed.
  void discard(Client* client) noexcept;
  // Back to the idle ones (one-shot); false when epoll refuses it.
  bool watch_again(Client* client);
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
  std::string unavailable_;           // why requests are refused while no worker can start
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
  workers_.reserve(kMaxWorkers);  // so adding a started worker never allocates
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
  epoll_event events[kEvents];
  Client* arrived[kEvents];
  for (;;) {
    const int n = epoll_wait(epoll_.get(), events, kEvents, -1);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      log(LogLevel::error, "tcp store {}: epoll_wait: {}; no more requests are served", address_,
          strerror(errno));
      return;
    }
    size_t count = 0;
    for (int i = 0; i < n; ++i) {
      auto* client = static_cast<Client*>(events[i].data.ptr);
      if (client == nullptr) return;  // stopping
      if (client->refused) {
        discard(client);
        continue;
      }
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
        arrived[count++] = client;
    }
    hand_over(std::span<Client* const>(arrived, count));
  }
}

void TcpStoreServer::Impl::hand_over(std::span<Client* const> arrived) noexcept {
  // Every client handed over has a worker of its own: an idle one, or one started now (a get
  // may hold its worker long, so none waits behind another).
  size_t queued = 0, start = 0;
  {
    std::lock_guard lock(queue_mutex_);
    try {
      for (; queued < arrived.size(); ++queued)
        ready_.push_back(arrived[queued]);
    } catch (const std::bad_alloc&) {  // the rest are refused below, never left unanswered
    }
    if (ready_.size() > idle_workers_)
      start = std::min(ready_.size() - idle_workers_, kMaxWorkers - workers_.size());
    idle_workers_ += start;  // counted idle from now: each takes a client as it starts
  }
  for (size_t i = 0; i < start; ++i) {
    std::string cause;  // empty: out of memory
    try {
      try {
        workers_.emplace_back([this] { work(); });  // never reallocates: reserved
        continue;
      } catch (const std::system_error& e) {  // out of threads, or of address space for a stack
        cause = e.code().message();
      }
    } catch (const std::exception&) {  // out of memory, for the thread or for the words
    }
    worker_failed(cause);
    std::lock_guard lock(queue_mutex_);
    idle_workers_ -= start - i;
    break;
  }
  queued_.notify_all();
  // With no worker at all, nobody would ever take a queued client: each hears why now, rather
  // than waiting out its own deadline. (Workers never end before the store, so once one runs,
  // the queue moves.)
  const std::string_view out_of_memory = "the store's host is out of memory";
  if (workers_.empty()) {
    const std::string_view why = unavailable_.empty() ? out_of_memory : unavailable_;
    for (;;) {
      Client* client = nullptr;
      {
        std::lock_guard lock(queue_mutex_);
        if (ready_.empty()) break;
        client = ready_.front();
        ready_.pop_front();
      }
      refuse(client, why);
    }
  }
  for (Client* client : arrived.subspan(queued))  // no room to queue them
    refuse(client, out_of_memory);
}

void TcpStoreServer::Impl::worker_failed(const std::string& cause) noexcept {
  try {
    if (unavailable_.empty())
      unavailable_ = fmt::format(
          "the store's host (pid {}) cannot start a thread to serve the request: {} (it is out of "
          "threads, or of address space for a thread's stack: check ulimit -u and ulimit -v "
          "there, and that machine's free memory)",
          getpid(), cause.empty() ? "out of memory" : cause);
    // Once: it is tried again for every request that comes.
    if (!worker_failure_said_)
      log(LogLevel::warn, "tcp store {}: cannot start a worker ({} run): {}{}", address_,
          workers_.size(), cause.empty() ? "out of memory" : cause,
          workers_.empty() ? "; each request is refused, naming this, until one can start"
                           : "; requests wait for a running one");
    worker_failure_said_ = true;
  } catch (const std::exception&) {  // out of memory for the words: the client hears less
  }
}

void TcpStoreServer::Impl::refuse(Client* client, std::string_view why) noexcept {
  // The reply goes in one non-blocking send, from the stack: between requests the socket's send
  // buffer is empty (the client read every reply before asking again), so it fits, and a client
  // that left it full is not reading: it is closed instead.
  why = why.substr(0, kMaxReason);
  uint8_t head[kReplyHeaderBytes];
  put_reply_header(head, kUnavailable, static_cast<uint32_t>(why.size()));
  iovec parts[2] = {{head, sizeof head}, {const_cast<char*>(why.data()), why.size()}};
  msghdr message{};
  message.msg_iov = parts;
  message.msg_iovlen = 2;
  const ssize_t sent = ::sendmsg(client->fd.get(), &message, MSG_DONTWAIT | MSG_NOSIGNAL);
  if (sent != static_cast<ssize_t>(sizeof head + why.size())) {
    drop(client);
    return;
  }
  // Its request was not read, so the connection is out of step: it ends. The end of stream goes
  // after the reply now, but the socket stays open while the client may still be sending (closing
  // it with bytes unread would reset the connection, which can lose the reply before the client
  // reads it); it is forgotten when the client closes its end.
  ::shutdown(client->fd.get(), SHUT_WR);
  client->refused = true;
  discard(client);
}

void TcpStoreServer::Impl::discard(Client* client) noexcept {
  uint8_t sink[4096];
  for (;;) {
    const ssize_t n = ::recv(client->fd.get(), sink, sizeof sink, MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n > 0) {
      client->discarded += static_cast<uint64_t>(n);
      if (client->discarded <= kMaxDiscard) continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (watch_again(client)) return;
    }
    drop(client);  // it closed (or failed, or sent more than a request)
    return;
  }
}

bool TcpStoreServer::Impl::watch_again(Client* client) {
  epoll_event event{};
  event.events = EPOLLIN | EPOLLRDHUP | EPOLLONESHOT;
  event.data.ptr = client;
  return epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, client->fd.get(), &event) == 0;
}

void TcpStoreServer::Impl::work() {
  pthread_setname_np(pthread_self(), "hm-store-work");
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
      if (!watch_again(client)) {
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
