#include "socket_link.hpp"

#include <fmt/format.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>

namespace hetmesh::detail {
namespace {

constexpr uint32_t kHelloMagic = 0x4c484d48;  // "HMHL"
constexpr uint16_t kHelloVersion = 1;

struct Hello {
  uint32_t magic;
  uint16_t version;
  uint16_t id_length;
  char id[32];
};

[[noreturn]] void fail_errno(hm_status status, const std::string& what) {
  throw Error(status, fmt::format("{}: {}", what, std::strerror(errno)));
}

// Parsed form of a SocketAddress.
struct Resolved {
  sockaddr_storage storage{};
  socklen_t length = 0;
  int family = 0;
};

Resolved resolve(const SocketAddress& address) {
  Resolved r;
  const std::string& text = address.text;
  if (text.rfind("unix:@", 0) == 0) {
    std::string name = text.substr(6);
    auto* un = reinterpret_cast<sockaddr_un*>(&r.storage);
    if (name.empty() || name.size() + 1 > sizeof un->sun_path)
      throw Error(HM_ERR_INVALID_ARGUMENT, fmt::format("bad unix socket name in '{}'", text));
    un->sun_family = AF_UNIX;
    un->sun_path[0] = '\0';  // abstract namespace: nothing left behind in the file system
    std::memcpy(un->sun_path + 1, name.data(), name.size());
    r.length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
    r.family = AF_UNIX;
    return r;
  }
  if (text.rfind("tcp://", 0) != 0)
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("socket address '{}' is neither tcp://host:port nor unix:@name", text));
  std::string rest = text.substr(6);
  size_t colon = rest.rfind(':');
  if (colon == std::string::npos)
    throw Error(HM_ERR_INVALID_ARGUMENT, fmt::format("socket address '{}' has no port", text));
  std::string host = rest.substr(0, colon), port = rest.substr(colon + 1);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &found); rc != 0)
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("cannot resolve '{}': {}", text, gai_strerror(rc)));
  std::memcpy(&r.storage, found->ai_addr, found->ai_addrlen);
  r.length = found->ai_addrlen;
  r.family = found->ai_family;
  freeaddrinfo(found);
  return r;
}

void tune(int fd, int family) {
  if (family == AF_UNIX) return;
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

std::string describe_bound(int fd, const SocketAddress& requested) {
  if (requested.text.rfind("unix:", 0) == 0) return requested.text;
  sockaddr_storage storage{};
  socklen_t length = sizeof storage;
  getsockname(fd, reinterpret_cast<sockaddr*>(&storage), &length);
  char host[INET6_ADDRSTRLEN] = {};
  uint16_t port = 0;
  if (storage.ss_family == AF_INET) {
    auto* in = reinterpret_cast<sockaddr_in*>(&storage);
    inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
    port = ntohs(in->sin_port);
    return fmt::format("tcp://{}:{}", host, port);
  }
  auto* in6 = reinterpret_cast<sockaddr_in6*>(&storage);
  inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof host);
  port = ntohs(in6->sin6_port);
  return fmt::format("tcp://[{}]:{}", host, port);
}

}  // namespace

Fd& Fd::operator=(Fd&& other) noexcept {
  if (this != &other) {
    reset();
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

void Fd::reset() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

void Fd::shutdown() const {
  if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
}

std::string new_endpoint_id() {
  std::random_device entropy;
  uint64_t value = (static_cast<uint64_t>(entropy()) << 32) ^ entropy();
  return fmt::format("{:016x}", value);
}

Listener::Listener(const SocketAddress& address, std::string self_id)
    : self_id_(std::move(self_id)) {
  Resolved r = resolve(address);
  socket_ = Fd(socket(r.family, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!socket_) fail_errno(HM_ERR_BACKEND, "socket");
  int one = 1;
  setsockopt(socket_.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(socket_.get(), reinterpret_cast<sockaddr*>(&r.storage), r.length) != 0)
    fail_errno(HM_ERR_INVALID_ARGUMENT, fmt::format("cannot listen on {}", address.text));
  if (listen(socket_.get(), 128) != 0) fail_errno(HM_ERR_BACKEND, "listen");
  bound_.text = describe_bound(socket_.get(), address);
  thread_ = std::thread([this] { serve(); });
}

Listener::~Listener() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  socket_.shutdown();
  thread_.join();
}

void Listener::serve() {
  for (;;) {
    pollfd p{socket_.get(), POLLIN, 0};
    int n = ::poll(&p, 1, 100);
    {
      std::lock_guard lock(mutex_);
      if (stopping_) return;
    }
    if (n <= 0) continue;
    Fd peer(accept4(socket_.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!peer) continue;
    // A peer that connects and says nothing must not stall the listener.
    timeval limit{5, 0};
    setsockopt(peer.get(), SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
    Hello hello{};
    if (recv(peer.get(), &hello, sizeof hello, MSG_WAITALL) != static_cast<ssize_t>(sizeof hello) ||
        hello.magic != kHelloMagic || hello.version != kHelloVersion ||
        hello.id_length > sizeof hello.id)
      continue;  // not one of ours: drop it
    timeval none{0, 0};
    setsockopt(peer.get(), SOL_SOCKET, SO_RCVTIMEO, &none, sizeof none);
    sockaddr_storage local{};
    socklen_t length = sizeof local;
    getsockname(peer.get(), reinterpret_cast<sockaddr*>(&local), &length);
    tune(peer.get(), local.ss_family);
    std::string id(hello.id, hello.id_length);
    {
      std::lock_guard lock(mutex_);
      pending_[id] = std::move(peer);
    }
    arrived_.notify_all();
  }
}

Fd Listener::accept_from(const std::string& peer_id, std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  if (!arrived_.wait_for(lock, timeout, [&] { return pending_.count(peer_id) > 0; }))
    throw Error(HM_ERR_TIMEOUT, fmt::format("peer {} did not connect to {} within {} ms", peer_id,
                                            bound_.text, timeout.count()));
  Fd fd = std::move(pending_[peer_id]);
  pending_.erase(peer_id);
  return fd;
}

Fd dial(const SocketAddress& address, const std::string& self_id,
        std::chrono::milliseconds timeout) {
  Resolved r = resolve(address);
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    Fd fd(socket(r.family, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!fd) fail_errno(HM_ERR_BACKEND, "socket");
    if (connect(fd.get(), reinterpret_cast<sockaddr*>(&r.storage), r.length) == 0) {
      tune(fd.get(), r.family);
      Hello hello{kHelloMagic, kHelloVersion, static_cast<uint16_t>(self_id.size()), {}};
      std::memcpy(hello.id, self_id.data(), std::min(self_id.size(), sizeof hello.id));
      send_all(fd.get(), &hello, sizeof hello, "hello");
      return fd;
    }
    int err = errno;
    bool retry = err == ECONNREFUSED || err == ENOENT || err == EAGAIN || err == EINTR;
    if (!retry || std::chrono::steady_clock::now() >= deadline)
      throw Error(retry ? HM_ERR_TIMEOUT : kStatusPeerLost,
                  fmt::format("cannot connect to {} within {} ms: {}", address.text,
                              timeout.count(), std::strerror(err)));
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

Fd connect_symmetric(Listener& listener, const std::string& self_id, const std::string& peer_id,
                     const SocketAddress& peer_address, std::chrono::milliseconds timeout) {
  if (self_id == peer_id)
    throw Error(HM_ERR_INVALID_ARGUMENT, "cannot connect an endpoint to itself");
  if (self_id < peer_id) return dial(peer_address, self_id, timeout);
  return listener.accept_from(peer_id, timeout);
}

void send_all(int fd, const void* data, size_t size, const char* what) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (size > 0) {
    ssize_t n = send(fd, p, size, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      throw Error(kStatusPeerLost, fmt::format("sending {} failed: {}", what,
                                               n < 0 ? std::strerror(errno) : "connection closed"));
    p += n;
    size -= static_cast<size_t>(n);
  }
}

void send_two(int fd, const void* a, size_t a_size, const void* b, size_t b_size,
              const char* what) {
  iovec parts[2] = {{const_cast<void*>(a), a_size}, {const_cast<void*>(b), b_size}};
  msghdr message{};
  message.msg_iov = parts;
  message.msg_iovlen = b_size > 0 ? 2 : 1;
  ssize_t n;
  do {
    n = sendmsg(fd, &message, MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  if (n < 0)
    throw Error(kStatusPeerLost, fmt::format("sending {} failed: {}", what, std::strerror(errno)));
  size_t sent = static_cast<size_t>(n);
  if (sent < a_size) {
    send_all(fd, static_cast<const uint8_t*>(a) + sent, a_size - sent, what);
    sent = a_size;
  }
  if (sent - a_size < b_size)
    send_all(fd, static_cast<const uint8_t*>(b) + (sent - a_size), b_size - (sent - a_size), what);
}

void recv_all(int fd, void* data, size_t size, const char* what) {
  auto* p = static_cast<uint8_t*>(data);
  while (size > 0) {
    ssize_t n = recv(fd, p, size, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      throw Error(kStatusPeerLost,
                  fmt::format("receiving {} failed: {}", what,
                              n < 0 ? std::strerror(errno) : "peer closed the connection"));
    p += n;
    size -= static_cast<size_t>(n);
  }
}

}  // namespace hetmesh::detail
