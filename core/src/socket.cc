// Stream sockets (socket.hpp): the one copy of fd ownership, address handling, connect, listen,
// accept and deadline-bounded full-buffer I/O.
#include <hetmesh/core/socket.hpp>

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

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <memory>
#include <thread>

namespace hetmesh::net {
namespace {

using std::chrono::milliseconds;

// Throws Error(status) "<doing> <what>: <errno's text>"; doing is "receiving", "sending", ...
[[noreturn]] void fail_errno(hm_status status, std::string_view doing, std::string_view what) {
  int error = errno;  // before anything below can change it
  throw Error(status, fmt::format("{} {}: {}", doing, what, std::strerror(error)));
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
// recv/send reports). Throws Error(HM_ERR_TIMEOUT) "<doing> <what>: timed out" at the deadline.
void await(int fd, short events, const Deadline& deadline, const char* doing, const char* what) {
  for (;;) {
    pollfd p{fd, events, 0};
    int rc = ::poll(&p, 1, poll_ms(deadline));
    if (rc > 0) return;
    if (rc < 0 && errno != EINTR) {
      int error = errno;
      throw Error(HM_ERR_BACKEND,
                  fmt::format("{} {}: poll: {}", doing, what, std::strerror(error)));
    }
    if (rc == 0 && deadline && Clock::now() >= *deadline)
      throw Error(HM_ERR_TIMEOUT, fmt::format("{} {}: timed out", doing, what));
  }
}

// The flags that make one call honour a deadline: with one, it must not block in the kernel.
int wait_flags(const Deadline& deadline) {
  return deadline ? MSG_DONTWAIT : 0;
}

bool would_block() {
  return errno == EAGAIN || errno == EWOULDBLOCK;
}

void set_nodelay(int fd, int family) {
  if (family != AF_INET && family != AF_INET6) return;
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

bool set_blocking(int fd) {
  int flags = fcntl(fd, F_GETFL);
  return flags >= 0 && fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) == 0;
}

struct AddrInfoDeleter {
  void operator()(addrinfo* a) const { freeaddrinfo(a); }
};

// Errors of a connect attempt that mean "not listening yet": worth another try.
bool worth_retrying(int error) {
  return error == ECONNREFUSED || error == ENOENT || error == EAGAIN || error == EINTR ||
         error == ETIMEDOUT;
}

}  // namespace

// ---- descriptors ---------------------------------------------------------------------------

Fd& Fd::operator=(Fd&& other) noexcept {
  if (this != &other) reset(std::exchange(other.fd_, -1));
  return *this;
}

void Fd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

void Fd::shutdown() const {
  if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
}

// ---- addresses -----------------------------------------------------------------------------

std::optional<HostPort> parse_host_port(std::string_view text) {
  const size_t colon = text.rfind(':');
  if (colon == std::string_view::npos || colon == 0) return std::nullopt;
  std::string_view host = text.substr(0, colon), digits = text.substr(colon + 1);
  const bool bracketed = host.front() == '[';
  if (bracketed != (host.back() == ']') || (bracketed && host.size() < 3)) return std::nullopt;
  if (bracketed)
    host = host.substr(1, host.size() - 2);
  else if (host.find(':') != std::string_view::npos)
    return std::nullopt;
  unsigned port = 0;
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), port);
  if (digits.empty() || ec != std::errc() || end != digits.data() + digits.size() || port > 65535)
    return std::nullopt;
  return HostPort{std::string(host), static_cast<uint16_t>(port)};
}

std::string join_host_port(std::string_view host, uint16_t port) {
  if (host.find(':') != std::string_view::npos && host.front() != '[')
    return fmt::format("[{}]:{}", host, port);
  return fmt::format("{}:{}", host, port);
}

std::vector<Address> resolve(std::string_view host_port, bool passive, std::string_view what) {
  const std::optional<HostPort> hp = parse_host_port(host_port);
  if (!hp)
    throw Error(HM_ERR_INVALID_ARGUMENT, fmt::format("{} '{}' is not host:port", what, host_port));
  const std::string port = std::to_string(hp->port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  addrinfo* found = nullptr;
  if (int rc = getaddrinfo(hp->host.c_str(), port.c_str(), &hints, &found); rc != 0)
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("cannot resolve {} '{}': {}", what, host_port, gai_strerror(rc)));
  std::unique_ptr<addrinfo, AddrInfoDeleter> owned(found);
  std::vector<Address> addresses;
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
    Address& address = addresses.emplace_back();
    std::memcpy(&address.storage, a->ai_addr, a->ai_addrlen);
    address.length = a->ai_addrlen;
  }
  return addresses;
}

bool is_loopback(const Address& address) {
  if (address.family() == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&address.storage);
    return (ntohl(in->sin_addr.s_addr) >> 24) == 127;
  }
  if (address.family() == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&address.storage);
    if (IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr)) return true;
    return IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr) && in6->sin6_addr.s6_addr[12] == 127;
  }
  return false;
}

Address unix_abstract(std::string_view name, std::string_view what) {
  Address address;
  auto* un = reinterpret_cast<sockaddr_un*>(&address.storage);
  if (name.empty() || name.size() + 1 > sizeof un->sun_path)
    throw Error(HM_ERR_INVALID_ARGUMENT, fmt::format("bad unix socket name in {}", what));
  un->sun_family = AF_UNIX;
  un->sun_path[0] = '\0';  // the abstract namespace
  std::memcpy(un->sun_path + 1, name.data(), name.size());
  address.length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  return address;
}

std::string to_string(const Address& address) {
  char host[INET6_ADDRSTRLEN] = {};
  switch (address.family()) {
    case AF_INET: {
      const auto* in = reinterpret_cast<const sockaddr_in*>(&address.storage);
      inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
      return fmt::format("{}:{}", host, ntohs(in->sin_port));
    }
    case AF_INET6: {
      const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&address.storage);
      inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof host);
      return fmt::format("[{}]:{}", host, ntohs(in6->sin6_port));
    }
    case AF_UNIX: {
      const auto* un = reinterpret_cast<const sockaddr_un*>(&address.storage);
      constexpr size_t kPath = offsetof(sockaddr_un, sun_path);
      size_t name = address.length > kPath ? address.length - kPath : 0;
      if (name > 0 && un->sun_path[0] == '\0') return "@" + std::string(un->sun_path + 1, name - 1);
      return std::string(un->sun_path, strnlen(un->sun_path, name));
    }
    default:
      return fmt::format("(address family {})", address.family());
  }
}

Address local_address(int fd) {
  Address address;
  address.length = sizeof address.storage;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&address.storage), &address.length) != 0)
    address.length = 0;
  return address;
}

// ---- connecting ----------------------------------------------------------------------------

Fd try_connect(const Address& address, const Deadline& deadline, int& error) {
  error = 0;
  Fd fd(::socket(address.family(), SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd) {
    error = errno;
    return fd;
  }
  if (::connect(fd.get(), address.get(), address.length) != 0) {
    if (errno != EINPROGRESS) {
      error = errno;
      return Fd();
    }
    pollfd p{fd.get(), POLLOUT, 0};
    int rc;
    while ((rc = ::poll(&p, 1, poll_ms(deadline))) < 0 && errno == EINTR) {
    }
    if (rc <= 0) {
      error = rc == 0 ? ETIMEDOUT : errno;
      return Fd();
    }
    socklen_t length = sizeof error;
    if (getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &error, &length) != 0) error = errno;
    if (error != 0) return Fd();
  }
  if (!set_blocking(fd.get())) {
    error = errno;
    return Fd();
  }
  set_nodelay(fd.get(), address.family());
  return fd;
}

Fd connect_with_retry(const std::vector<Address>& candidates, milliseconds timeout,
                      milliseconds retry_every, std::string_view what) {
  if (candidates.empty())
    throw Error(HM_ERR_INVALID_ARGUMENT, fmt::format("cannot connect to {}: no address", what));
  Deadline deadline = Clock::now() + timeout;
  for (;;) {
    int error = 0;
    for (const Address& address : candidates)
      if (Fd fd = try_connect(address, deadline, error)) return fd;
    bool retry = worth_retrying(error);
    if (!retry || Clock::now() >= *deadline)
      throw Error(retry ? HM_ERR_TIMEOUT : kStatusPeerLost,
                  fmt::format("cannot connect to {} within {} ms: {}", what, timeout.count(),
                              describe_errno(error)));
    std::this_thread::sleep_for(retry_every);
  }
}

// ---- listening -----------------------------------------------------------------------------

Fd listen_on(const Address& address, std::string_view what) {
  Fd fd(::socket(address.family(), SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  auto fail = [&](hm_status status, const char* step) {
    int error = errno;
    throw Error(status,
                fmt::format("cannot listen on {}: {}{}", what, step, describe_errno(error)));
  };
  if (!fd) fail(HM_ERR_BACKEND, "socket: ");
  int one = 1;
  setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  // Bind fails for the caller's reasons (address in use, not this host's): an invalid argument.
  if (::bind(fd.get(), address.get(), address.length) != 0) fail(HM_ERR_INVALID_ARGUMENT, "");
  if (::listen(fd.get(), 128) != 0) fail(HM_ERR_BACKEND, "listen: ");
  return fd;
}

Fd accept_connection(const Fd& listener, Address* peer) {
  Address from;
  from.length = sizeof from.storage;
  // No SOCK_NONBLOCK: the connection is blocking even though the listener is not.
  Fd fd(accept4(listener.get(), reinterpret_cast<sockaddr*>(&from.storage), &from.length,
                SOCK_CLOEXEC));
  if (!fd) return fd;
  set_nodelay(fd.get(), from.family());
  if (peer != nullptr) *peer = from;
  return fd;
}

// ---- I/O -----------------------------------------------------------------------------------

size_t recv_some(int fd, void* data, size_t size, const char* what, const Deadline& deadline) {
  for (;;) {
    const ssize_t n = ::recv(fd, data, size, wait_flags(deadline));
    if (n >= 0) return static_cast<size_t>(n);
    if (errno == EINTR) continue;
    if (!would_block()) fail_errno(kStatusPeerLost, "receiving", what);
    await(fd, POLLIN, deadline, "receiving", what);
  }
}

bool recv_exact(int fd, void* data, size_t size, const char* what, const Deadline& deadline) {
  auto* p = static_cast<uint8_t*>(data);
  for (size_t done = 0; done < size;) {
    const size_t n = recv_some(fd, p + done, size - done, what, deadline);
    if (n == 0 && done == 0) return false;
    if (n == 0)
      throw Error(kStatusPeerLost, fmt::format("receiving {}: connection closed mid-frame", what));
    done += n;
  }
  return true;
}

void recv_all(int fd, void* data, size_t size, const char* what, const Deadline& deadline) {
  if (!recv_exact(fd, data, size, what, deadline))
    throw Error(kStatusPeerLost, fmt::format("receiving {}: the peer closed the connection", what));
}

void send_all(int fd, const void* data, size_t size, const char* what, const Deadline& deadline) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (size > 0) {
    // MSG_NOSIGNAL: a peer that went away is an error to report, not a SIGPIPE that kills us.
    ssize_t n = ::send(fd, p, size, MSG_NOSIGNAL | wait_flags(deadline));
    if (n > 0) {
      p += n;
      size -= static_cast<size_t>(n);
      continue;
    }
    if (n == 0) throw Error(kStatusPeerLost, fmt::format("sending {}: connection closed", what));
    if (errno == EINTR) continue;
    if (would_block()) {
      await(fd, POLLOUT, deadline, "sending", what);
      continue;
    }
    fail_errno(kStatusPeerLost, "sending", what);
  }
}

void send_two(int fd, const void* a, size_t a_size, const void* b, size_t b_size, const char* what,
              const Deadline& deadline) {
  iovec parts[2] = {{const_cast<void*>(a), a_size}, {const_cast<void*>(b), b_size}};
  msghdr message{};
  message.msg_iov = parts;
  message.msg_iovlen = b_size > 0 ? 2 : 1;
  ssize_t n;
  for (;;) {
    n = ::sendmsg(fd, &message, MSG_NOSIGNAL | wait_flags(deadline));
    if (n >= 0) break;
    if (errno == EINTR) continue;
    if (!would_block()) fail_errno(kStatusPeerLost, "sending", what);
    await(fd, POLLOUT, deadline, "sending", what);
  }
  // The rest of whatever the socket did not take at once.
  size_t sent = static_cast<size_t>(n);
  if (sent < a_size) {
    send_all(fd, static_cast<const uint8_t*>(a) + sent, a_size - sent, what, deadline);
    sent = a_size;
  }
  if (sent - a_size < b_size)
    send_all(fd, static_cast<const uint8_t*>(b) + (sent - a_size), b_size - (sent - a_size), what,
             deadline);
}

bool hung_up(int fd) {
  pollfd p{fd, POLLRDHUP, 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

std::optional<ucred> peer_credentials(int fd) {
  ucred credentials{};
  socklen_t length = sizeof credentials;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &credentials, &length) != 0) return std::nullopt;
  return credentials;
}

}  // namespace hetmesh::net
