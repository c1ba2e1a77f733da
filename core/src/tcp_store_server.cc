// The embedded TCP key-value store: server, client and their wire protocol.
//
// Wire protocol, version 1. Every integer is little-endian. A client sends requests and reads one
// reply to each, in order, on one connection.
//   request:  u32 magic "HMKV" | u8 version | u8 op | u16 zero | u32 key_len | u32 value_len
//             | key | value
//   reply:    u32 magic "HMKV" | u8 version | u8 status | u16 zero | u32 value_len | value
// Ops and their request values: set (the value), get (u64 wait in ms), try_get (none),
// add (i64 delta), erase (none). Replies: ok with the value (get, try_get), the new counter as
// i64 (add) or nothing; not_found (try_get); timeout (get); refused with a reason text (add on a
// value that is not a counter, or an overflow).
// Keys are 1..4096 bytes, values at most 16 MiB. The server closes the connection of a client
// that breaks any rule (logging why), and never trusts a length before checking it.
//
// Concurrency: the server runs an accept thread and one thread per client; a get waits on a
// condition variable signalled by every set and add. Sockets are non-blocking and every wait is a
// poll() with a deadline, so a dead or stalled peer costs a timeout, never a hang; the destructor
// shuts every socket down, which wakes each thread's poll.
#include <hetmesh/core/log.hpp>
#include <hetmesh/core/rendezvous.hpp>

#include <fmt/format.h>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <condition_variable>
#include <cstring>
#include <list>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <utility>

namespace hetmesh {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
// When an I/O wait gives up; nullopt waits without limit (the server between requests).
using Deadline = std::optional<Clock::time_point>;

constexpr uint32_t kMagic = 0x564b4d48;  // "HMKV" as little-endian bytes
constexpr uint8_t kVersion = 1;
constexpr size_t kRequestHeaderBytes = 16;
constexpr size_t kReplyHeaderBytes = 12;

enum Op : uint8_t { kSet = 1, kGet = 2, kTryGet = 3, kAdd = 4, kErase = 5 };
enum Status : uint8_t { kOk = 0, kNotFound = 1, kTimedOut = 2, kRefused = 3 };

// Once a request has started, the rest of it (and the reply) must move within this time, so a
// client that stalls mid-frame cannot hold its server thread forever.
constexpr milliseconds kFrameTimeout{10000};
// Longest server-side wait of a get; keeps deadlines far from overflow.
constexpr milliseconds kMaxWait{24LL * 3600 * 1000};
// How often a server thread waiting in get() checks that its client is still there.
constexpr milliseconds kHangupCheck{250};
// Connections beyond this are refused: each costs a thread.
constexpr size_t kMaxClients = 1024;

const char* op_name(uint8_t op) {
  switch (op) {
    case kSet:
      return "set";
    case kGet:
      return "get";
    case kTryGet:
      return "try_get";
    case kAdd:
      return "add";
    case kErase:
      return "erase";
    default:
      return "unknown op";
  }
}

void put_u16(uint8_t* p, uint16_t v) {
  for (int i = 0; i < 2; ++i)
    p[i] = static_cast<uint8_t>(v >> (8 * i));
}
void put_u32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i)
    p[i] = static_cast<uint8_t>(v >> (8 * i));
}
void put_u64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i)
    p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint16_t get_u16(const uint8_t* p) {
  return static_cast<uint16_t>(p[0] | p[1] << 8);
}
uint32_t get_u32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i)
    v = v << 8 | p[i];
  return v;
}
uint64_t get_u64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i)
    v = v << 8 | p[i];
  return v;
}

std::vector<uint8_t> encode_i64(int64_t v) {
  std::vector<uint8_t> out(8);
  put_u64(out.data(), static_cast<uint64_t>(v));
  return out;
}

// A request or reply header: the two share magic, version and value_len.
struct Frame {
  uint8_t code = 0;  // op of a request, status of a reply
  uint32_t key_length = 0;
  uint32_t value_length = 0;
};

std::vector<uint8_t> encode_request(Op op, const std::string& key, size_t value_length) {
  std::vector<uint8_t> out(kRequestHeaderBytes + key.size());
  put_u32(&out[0], kMagic);
  out[4] = kVersion;
  out[5] = op;
  put_u16(&out[6], 0);
  put_u32(&out[8], static_cast<uint32_t>(key.size()));
  put_u32(&out[12], static_cast<uint32_t>(value_length));
  std::copy(key.begin(), key.end(), out.begin() + kRequestHeaderBytes);
  return out;
}

std::vector<uint8_t> encode_reply(Status status, const std::vector<uint8_t>& value) {
  std::vector<uint8_t> out(kReplyHeaderBytes + value.size());
  put_u32(&out[0], kMagic);
  out[4] = kVersion;
  out[5] = status;
  put_u16(&out[6], 0);
  put_u32(&out[8], static_cast<uint32_t>(value.size()));
  std::copy(value.begin(), value.end(), out.begin() + kReplyHeaderBytes);
  return out;
}

// A peer broke the protocol; the message says how.
class Malformed : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

void check_common(const uint8_t* raw) {
  if (get_u32(raw) != kMagic)
    throw Malformed(fmt::format("bad magic 0x{:08x} (expected 0x{:08x})", get_u32(raw), kMagic));
  if (raw[4] != kVersion)
    throw Malformed(fmt::format("protocol version {} (this build speaks {})", raw[4], kVersion));
  if (get_u16(raw + 6) != 0) throw Malformed("reserved header bits are set");
}

Frame decode_request(const uint8_t* raw) {
  check_common(raw);
  Frame f{raw[5], get_u32(raw + 8), get_u32(raw + 12)};
  if (f.code < kSet || f.code > kErase) throw Malformed(fmt::format("unknown op {}", f.code));
  if (f.key_length == 0 || f.key_length > KeyValueStore::kMaxKeyBytes)
    throw Malformed(
        fmt::format("key length {} is outside 1..{}", f.key_length, KeyValueStore::kMaxKeyBytes));
  size_t expected = f.code == kGet || f.code == kAdd ? 8 : 0;
  if (f.code == kSet ? f.value_length > KeyValueStore::kMaxValueBytes : f.value_length != expected)
    throw Malformed(fmt::format("{} with a value of {} bytes", op_name(f.code), f.value_length));
  return f;
}

Frame decode_reply(const uint8_t* raw) {
  check_common(raw);
  Frame f{raw[5], 0, get_u32(raw + 8)};
  if (f.code > kRefused) throw Malformed(fmt::format("unknown reply status {}", f.code));
  if (f.value_length > KeyValueStore::kMaxValueBytes)
    throw Malformed(fmt::format("reply value of {} bytes", f.value_length));
  return f;
}

// ---- sockets -------------------------------------------------------------------------------

class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Fd& operator=(Fd&& other) noexcept {
    if (this != &other) reset(std::exchange(other.fd_, -1));
    return *this;
  }
  ~Fd() { reset(); }
  int get() const { return fd_; }
  explicit operator bool() const { return fd_ >= 0; }
  void reset(int fd = -1) {
    if (fd_ >= 0) close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

[[noreturn]] void fail_errno(hm_status status, const std::string& what) {
  throw Error(status, fmt::format("{}: {}", what, std::strerror(errno)));
}

// Milliseconds poll() may wait: rounded up, so a wait never ends just before its deadline.
int poll_ms(const Deadline& deadline) {
  if (!deadline) return -1;
  auto left = *deadline - Clock::now();
  if (left <= Clock::duration::zero()) return 0;
  auto ms = std::chrono::ceil<milliseconds>(left).count();
  return static_cast<int>(std::min<int64_t>(ms, 1 << 30));
}

// Waits until `fd` is ready for `events` (or has an error or hang-up, which the following
// recv/send reports). Throws Error(HM_ERR_TIMEOUT) at the deadline.
void await(int fd, short events, const Deadline& deadline, const char* what) {
  for (;;) {
    pollfd p{fd, events, 0};
    int rc = ::poll(&p, 1, poll_ms(deadline));
    if (rc > 0) return;
    if (rc < 0 && errno != EINTR) fail_errno(HM_ERR_BACKEND, fmt::format("poll ({})", what));
    if (rc == 0 && Clock::now() >= *deadline)
      throw Error(HM_ERR_TIMEOUT, fmt::format("{}: timed out", what));
  }
}

// Reads exactly `size` bytes. Returns false if the peer closed cleanly before the first byte;
// throws Error(kStatusPeerLost) if it closed later or the connection broke.
bool recv_exact(int fd, void* data, size_t size, const Deadline& deadline, const char* what) {
  auto* p = static_cast<uint8_t*>(data);
  size_t done = 0;
  while (done < size) {
    ssize_t n = ::recv(fd, p + done, size - done, 0);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n == 0) {
      if (done == 0 && size > 0) return false;
      throw Error(kStatusPeerLost, fmt::format("{}: connection closed mid-frame", what));
    }
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
      await(fd, POLLIN, deadline, what);
      continue;
    }
    fail_errno(kStatusPeerLost, what);
  }
  return true;
}

void send_exact(int fd, const void* data, size_t size, const Deadline& deadline, const char* what) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (size > 0) {
    // MSG_NOSIGNAL: a peer that went away is an error to report, not a SIGPIPE that kills us.
    ssize_t n = ::send(fd, p, size, MSG_NOSIGNAL);
    if (n > 0) {
      p += n;
      size -= static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      await(fd, POLLOUT, deadline, what);
      continue;
    }
    fail_errno(kStatusPeerLost, what);
  }
}

// Whether the peer has closed or reset the connection (without consuming anything).
bool hung_up(int fd) {
  pollfd p{fd, POLLRDHUP, 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

struct HostPort {
  std::string host, port;
};

HostPort split_host_port(const std::string& text) {
  size_t colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == text.size())
    throw Error(HM_ERR_INVALID_ARGUMENT, fmt::format("store address '{}' is not host:port", text));
  std::string host = text.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  return {host, text.substr(colon + 1)};
}

struct AddrInfoDeleter {
  void operator()(addrinfo* a) const { freeaddrinfo(a); }
};
using AddrInfo = std::unique_ptr<addrinfo, AddrInfoDeleter>;

AddrInfo resolve(const std::string& address, bool passive) {
  HostPort hp = split_host_port(address);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  addrinfo* found = nullptr;
  if (int rc = getaddrinfo(hp.host.c_str(), hp.port.c_str(), &hints, &found); rc != 0)
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("cannot resolve store address '{}': {}", address, gai_strerror(rc)));
  return AddrInfo(found);
}

std::string format_address(const sockaddr_storage& s) {
  char host[INET6_ADDRSTRLEN] = {};
  if (s.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&s);
    inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
    return fmt::format("{}:{}", host, ntohs(in->sin_port));
  }
  const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&s);
  inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof host);
  return fmt::format("[{}]:{}", host, ntohs(in6->sin6_port));
}

void set_nodelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

// One non-blocking connect attempt to one address, bounded by the deadline. Returns the
// connected socket, or an empty Fd with *error set to the errno.
Fd try_connect(const addrinfo& a, const Deadline& deadline, int* error) {
  Fd fd(::socket(a.ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd || ::connect(fd.get(), a.ai_addr, a.ai_addrlen) == 0) {
    *error = errno;
    if (fd) set_nodelay(fd.get());
    return fd;
  }
  if (errno != EINPROGRESS) {
    *error = errno;
    return Fd();
  }
  pollfd p{fd.get(), POLLOUT, 0};
  int rc;
  while ((rc = ::poll(&p, 1, poll_ms(deadline))) < 0 && errno == EINTR) {
  }
  if (rc <= 0) {
    *error = rc == 0 ? ETIMEDOUT : errno;
    return Fd();
  }
  socklen_t length = sizeof *error;
  if (getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, error, &length) != 0) *error = errno;
  if (*error != 0) return Fd();
  set_nodelay(fd.get());
  return fd;
}

}  // namespace

// ---- server --------------------------------------------------------------------------------

class TcpStoreServer::Impl {
 public:
  explicit Impl(const std::string& listen);
  ~Impl();
  const std::string& address() const { return address_; }

 private:
  struct Client {
    Fd fd;
    std::string peer;
    std::thread thread;
    std::atomic<bool> done{false};
  };
  struct Reply {
    Status status = kOk;
    std::vector<uint8_t> value;
  };

  void accept_loop();
  void accept_one();
  void wake();
  void reap();
  void serve(Client& client);
  bool serve_one(Client& client);
  // Returns nullopt when the server is stopping and the request gets no reply.
  std::optional<Reply> execute(int fd, const Frame& frame, const std::string& key,
                               std::vector<uint8_t> value);
  Reply add(const std::string& key, int64_t delta);

  std::string address_;
  Fd listener_;
  Fd wake_;  // eventfd: wakes the accept thread to reap a finished client, or to stop

  std::mutex mutex_;  // guards data_ and stopping_
  std::condition_variable changed_;
  std::unordered_map<std::string, std::vector<uint8_t>> data_;
  std::atomic<bool> stopping_{false};

  // Touched only by the accept thread while it runs, and by the destructor after it joined.
  std::list<Client> clients_;
  std::thread acceptor_;
};

TcpStoreServer::Impl::Impl(const std::string& listen) {
  AddrInfo found = resolve(listen, /*passive=*/true);
  const addrinfo& a = *found;
  listener_ = Fd(::socket(a.ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!listener_) fail_errno(HM_ERR_BACKEND, "tcp store: socket");
  int one = 1;
  setsockopt(listener_.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(listener_.get(), a.ai_addr, a.ai_addrlen) != 0)
    fail_errno(HM_ERR_INVALID_ARGUMENT, fmt::format("tcp store: cannot listen on {}", listen));
  if (::listen(listener_.get(), 128) != 0) fail_errno(HM_ERR_BACKEND, "tcp store: listen");
  sockaddr_storage bound{};
  socklen_t length = sizeof bound;
  getsockname(listener_.get(), reinterpret_cast<sockaddr*>(&bound), &length);
  address_ = format_address(bound);
  wake_ = Fd(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake_) fail_errno(HM_ERR_BACKEND, "tcp store: eventfd");
  acceptor_ = std::thread([this] { accept_loop(); });
  log(LogLevel::info, "tcp store listening on {}", address_);
}

TcpStoreServer::Impl::~Impl() {
  {
    std::lock_guard lock(mutex_);  // so no get() misses the wake-up between check and wait
    stopping_ = true;
  }
  changed_.notify_all();
  wake();
  acceptor_.join();
  // Shutting a socket down wakes its thread's poll(); the thread then ends and the socket is
  // closed only after the join, so its number cannot be reused under a running thread.
  for (Client& client : clients_)
    ::shutdown(client.fd.get(), SHUT_RDWR);
  for (Client& client : clients_)
    client.thread.join();
}

void TcpStoreServer::Impl::accept_loop() {
  while (!stopping_) {
    pollfd fds[2] = {{listener_.get(), POLLIN, 0}, {wake_.get(), POLLIN, 0}};
    int rc = ::poll(fds, 2, -1);
    if (stopping_) return;
    if (rc > 0 && (fds[1].revents & POLLIN)) {
      uint64_t count;  // drains the eventfd; EAGAIN only means another read got there first
      if (::read(wake_.get(), &count, sizeof count) < 0 && errno != EAGAIN)
        log(LogLevel::warn, "tcp store {}: eventfd: {}", address_, std::strerror(errno));
      reap();
    }
    if (rc > 0 && (fds[0].revents & POLLIN)) accept_one();
  }
}

void TcpStoreServer::Impl::wake() {
  uint64_t one = 1;
  if (::write(wake_.get(), &one, sizeof one) < 0)
    log(LogLevel::warn, "tcp store {}: cannot wake the accept thread: {}", address_,
        std::strerror(errno));
}

void TcpStoreServer::Impl::accept_one() {
  sockaddr_storage peer{};
  socklen_t length = sizeof peer;
  Fd fd(accept4(listener_.get(), reinterpret_cast<sockaddr*>(&peer), &length,
                SOCK_CLOEXEC | SOCK_NONBLOCK));
  if (!fd) {
    if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED) {
      // EMFILE and friends leave the connection queued: back off instead of spinning.
      log(LogLevel::warn, "tcp store {}: accept: {}", address_, std::strerror(errno));
      std::this_thread::sleep_for(milliseconds(50));
    }
    return;
  }
  if (clients_.size() >= kMaxClients) {
    log(LogLevel::warn, "tcp store {}: refusing {}: already {} clients", address_,
        format_address(peer), kMaxClients);
    return;
  }
  set_nodelay(fd.get());
  Client& client = clients_.emplace_back();
  client.fd = std::move(fd);
  client.peer = format_address(peer);
  try {
    client.thread = std::thread([this, &client] { serve(client); });
  } catch (const std::system_error& e) {
    log(LogLevel::warn, "tcp store {}: no thread for {}: {}", address_, client.peer, e.what());
    clients_.pop_back();
  }
}

void TcpStoreServer::Impl::reap() {
  for (auto it = clients_.begin(); it != clients_.end();) {
    if (it->done) {
      it->thread.join();
      it = clients_.erase(it);
    } else {
      ++it;
    }
  }
}

void TcpStoreServer::Impl::serve(Client& client) {
  try {
    while (!stopping_ && serve_one(client)) {
    }
  } catch (const Malformed& e) {
    log(LogLevel::warn, "tcp store {}: closing the connection from {}: malformed request: {}",
        address_, client.peer, e.what());
  } catch (const std::exception& e) {
    if (!stopping_)
      log(LogLevel::warn, "tcp store {}: closing the connection from {}: {}", address_, client.peer,
          e.what());
  }
  // The peer sees the close now; the descriptor itself is closed by the accept thread after the
  // join, so its number cannot be reused while the destructor might still shut it down.
  ::shutdown(client.fd.get(), SHUT_RDWR);
  client.done = true;
  wake();
}

bool TcpStoreServer::Impl::serve_one(Client& client) {
  int fd = client.fd.get();
  uint8_t raw[kRequestHeaderBytes];
  // Clients idle between requests for as long as the job runs: only a started frame has a limit.
  if (!recv_exact(fd, raw, 1, std::nullopt, "request")) return false;
  Deadline deadline = Clock::now() + kFrameTimeout;
  recv_exact(fd, raw + 1, sizeof raw - 1, deadline, "request header");
  Frame frame = decode_request(raw);
  std::string key(frame.key_length, '\0');
  recv_exact(fd, key.data(), key.size(), deadline, "request key");
  std::vector<uint8_t> value(frame.value_length);
  recv_exact(fd, value.data(), value.size(), deadline, "request value");

  std::optional<Reply> reply = execute(fd, frame, key, std::move(value));
  if (!reply) return false;
  std::vector<uint8_t> bytes = encode_reply(reply->status, reply->value);
  send_exact(fd, bytes.data(), bytes.size(), Clock::now() + kFrameTimeout, "reply");
  return true;
}

std::optional<TcpStoreServer::Impl::Reply> TcpStoreServer::Impl::execute(
    int fd, const Frame& frame, const std::string& key, std::vector<uint8_t> value) {
  std::unique_lock lock(mutex_);
  switch (frame.code) {
    case kSet:
      data_[key] = std::move(value);
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
        if (!ready() && hung_up(fd)) return std::nullopt;
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
      data_.erase(key);
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
  data_[key].assign(text.begin(), text.end());
  return Reply{kOk, encode_i64(next)};
}

TcpStoreServer::TcpStoreServer(const std::string& listen) : impl_(std::make_unique<Impl>(listen)) {}
TcpStoreServer::~TcpStoreServer() = default;
std::string TcpStoreServer::address() const {
  return impl_->address();
}

// ---- client --------------------------------------------------------------------------------

namespace {

// Requests go over a small pool of connections: a get() blocked on one connection does not hold
// up other threads' calls (a barrier needs them), and a connection that failed mid-request is
// dropped, never reused out of step.
class TcpStoreClient final : public KeyValueStore {
 public:
  TcpStoreClient(std::string address, AddrInfo resolved, Fd first, milliseconds io_timeout)
      : address_(std::move(address)), resolved_(std::move(resolved)), io_timeout_(io_timeout) {
    idle_.push_back(std::move(first));
  }

  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    call(kSet, key, value, milliseconds(0));
  }

  std::vector<uint8_t> get(const std::string& key, milliseconds timeout) override {
    timeout = std::clamp(timeout, milliseconds(0), kMaxWait);
    std::vector<uint8_t> wait(8);
    put_u64(wait.data(), static_cast<uint64_t>(timeout.count()));
    auto [status, value] = call(kGet, key, wait, timeout);
    if (status == kTimedOut)
      throw Error(HM_ERR_TIMEOUT, fmt::format("{}: key '{}' did not appear within {} ms",
                                              describe(), key, timeout.count()));
    return value;
  }

  std::optional<std::vector<uint8_t>> try_get(const std::string& key) override {
    auto [status, value] = call(kTryGet, key, {}, milliseconds(0));
    if (status == kNotFound) return std::nullopt;
    return value;
  }

  int64_t add(const std::string& key, int64_t delta) override {
    auto [status, value] = call(kAdd, key, encode_i64(delta), milliseconds(0));
    if (status == kRefused)
      throw Error(HM_ERR_INVALID_ARGUMENT, fmt::format("{}: add to '{}': {}", describe(), key,
                                                       std::string(value.begin(), value.end())));
    if (value.size() != 8)
      throw Error(kStatusProtocolError,
                  fmt::format("{}: add to '{}': the reply holds {} bytes, not a counter",
                              describe(), key, value.size()));
    return static_cast<int64_t>(get_u64(value.data()));
  }

  void erase(const std::string& key) override { call(kErase, key, {}, milliseconds(0)); }

  std::string describe() const override { return "tcp store " + address_; }

 private:
  struct Result {
    Status status;
    std::vector<uint8_t> value;
  };
  static constexpr size_t kMaxIdle = 4;

  // One request and its reply. `wait` is how long the server may hold the reply back (get).
  Result call(Op op, const std::string& key, const std::vector<uint8_t>& value, milliseconds wait) {
    if (key.empty() || key.size() > kMaxKeyBytes)
      throw Error(HM_ERR_INVALID_ARGUMENT,
                  fmt::format("{}: {}: key of {} bytes is outside 1..{}", describe(), op_name(op),
                              key.size(), kMaxKeyBytes));
    if (value.size() > kMaxValueBytes)
      throw Error(HM_ERR_INVALID_ARGUMENT,
                  fmt::format("{}: {} '{}': value of {} bytes exceeds {}", describe(), op_name(op),
                              key, value.size(), kMaxValueBytes));
    auto fail = [&](hm_status status, const std::string& why) {
      return Error(status, fmt::format("{}: {} '{}': {}", describe(), op_name(op), key, why));
    };
    Deadline deadline = Clock::now() + io_timeout_ + wait;
    Fd fd = acquire(deadline, [&](const std::string& why) { return fail(kStatusPeerLost, why); });
    try {
      std::vector<uint8_t> head = encode_request(op, key, value.size());
      send_exact(fd.get(), head.data(), head.size(), deadline, "sending the request");
      send_exact(fd.get(), value.data(), value.size(), deadline, "sending the value");
      uint8_t raw[kReplyHeaderBytes];
      if (!recv_exact(fd.get(), raw, sizeof raw, deadline, "reading the reply"))
        throw Error(kStatusPeerLost, "the store closed the connection");
      Frame frame = decode_reply(raw);
      Result result{static_cast<Status>(frame.code), std::vector<uint8_t>(frame.value_length)};
      recv_exact(fd.get(), result.value.data(), result.value.size(), deadline,
                 "reading the reply value");
      release(std::move(fd));
      return result;
    } catch (const Malformed& e) {
      throw fail(kStatusProtocolError, fmt::format("bad reply: {}", e.what()));
    } catch (const Error& e) {
      if (e.status() == HM_ERR_TIMEOUT)
        throw fail(HM_ERR_TIMEOUT,
                   fmt::format("no reply within {} ms", (io_timeout_ + wait).count()));
      throw fail(e.status(), fmt::format("{} (is the store's host still running?)", e.what()));
    }
  }

  // An idle connection, or a new one. Unlike the first connect, this one does not retry: the
  // store was up, so a refusal now means it is gone.
  template <typename Fail>
  Fd acquire(const Deadline& deadline, Fail fail) {
    {
      std::lock_guard lock(mutex_);
      if (!idle_.empty()) {
        Fd fd = std::move(idle_.back());
        idle_.pop_back();
        return fd;
      }
    }
    int error = 0;
    for (const addrinfo* a = resolved_.get(); a; a = a->ai_next)
      if (Fd fd = try_connect(*a, deadline, &error)) return fd;
    throw fail(fmt::format("cannot reconnect: {} (is the store's host still running?)",
                           std::strerror(error)));
  }

  void release(Fd fd) {
    std::lock_guard lock(mutex_);
    if (idle_.size() < kMaxIdle) idle_.push_back(std::move(fd));
  }

  std::string address_;
  AddrInfo resolved_;
  milliseconds io_timeout_;
  std::mutex mutex_;  // guards idle_
  std::vector<Fd> idle_;
};

}  // namespace

std::unique_ptr<KeyValueStore> connect_tcp_store(const std::string& address, milliseconds timeout) {
  AddrInfo found = resolve(address, /*passive=*/false);
  Deadline deadline = Clock::now() + timeout;
  for (;;) {
    int error = 0;
    for (const addrinfo* a = found.get(); a; a = a->ai_next) {
      Fd fd = try_connect(*a, deadline, &error);
      if (fd)
        return std::make_unique<TcpStoreClient>(address, std::move(found), std::move(fd), timeout);
    }
    // The server may simply not listen yet: retry refused connections until the deadline.
    bool retry = error == ECONNREFUSED || error == EAGAIN || error == EINTR || error == ETIMEDOUT;
    if (!retry || Clock::now() >= *deadline)
      throw Error(retry ? HM_ERR_TIMEOUT : kStatusPeerLost,
                  fmt::format("cannot connect to tcp store {} within {} ms: {}", address,
                              timeout.count(), std::strerror(error)));
    std::this_thread::sleep_for(milliseconds(10));
  }
}

}  // namespace hetmesh
