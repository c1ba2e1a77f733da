// Stream sockets, the one layer under every socket user in hetmesh: the embedded TCP store, the
// tcp transport, the verbs out-of-band channel and the ipc control channel. Descriptor ownership,
// addresses, connect with a deadline, listen and accept, and full-buffer I/O.
//
// Connected sockets are blocking, so their owners may also read them directly (a progress thread's
// recv, recvmsg with descriptors). A call given a deadline bounds its own waits, whatever the
// socket's mode (MSG_DONTWAIT, then poll until the deadline), so a dead or stalled peer costs a
// timeout, never a hang. Listening sockets are non-blocking: an accept after poll() never blocks.
#pragma once

#include <hetmesh/core/error.hpp>

#include <sys/socket.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

// Exported from the library, which hides every other symbol (core/README.md, "Exports").
#pragma GCC visibility push(default)

namespace hetmesh::net {

using Clock = std::chrono::steady_clock;
// When an I/O wait gives up; nullopt waits without limit.
using Deadline = std::optional<Clock::time_point>;

// Owns a file descriptor (a socket, an eventfd, a memfd).
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Fd& operator=(Fd&& other) noexcept;
  ~Fd() { reset(); }
  int get() const { return fd_; }
  explicit operator bool() const { return fd_ >= 0; }
  // Closes the descriptor held, if any, and holds `fd` instead.
  void reset(int fd = -1);
  // Wakes every thread blocked on this socket (shutdown(SHUT_RDWR)) without closing it, so its
  // number cannot be reused under them.
  void shutdown() const;

 private:
  int fd_ = -1;
};

// A socket address: IPv4 or IPv6 with a port, or a unix socket.
struct Address {
  sockaddr_storage storage{};
  socklen_t length = 0;
  int family() const { return storage.ss_family; }
  const sockaddr* get() const { return reinterpret_cast<const sockaddr*>(&storage); }
};

// "host:port" taken apart: the host without an IPv6 address's brackets, and the port.
struct HostPort {
  std::string host;
  uint16_t port = 0;
};
// nullopt unless `text` is host:port with a decimal port up to 65535 and an IPv6 host in
// brackets ("[::1]:29500"): "::1:29500" is ambiguous and refused.
std::optional<HostPort> parse_host_port(std::string_view text);
// "host:port", with an IPv6 host (one holding ':') in brackets.
std::string join_host_port(std::string_view host, uint16_t port);

// Every address "host:port" names (numeric port; an IPv6 host in brackets: "[::1]:29500"), in
// getaddrinfo's order. passive: for listening, where "0.0.0.0" means every interface. Throws
// Error(HM_ERR_INVALID_ARGUMENT) naming `what` ("store address") when the text is not host:port
// or the host does not resolve.
std::vector<Address> resolve(std::string_view host_port, bool passive, std::string_view what);
// A unix socket in the abstract namespace: nothing is left behind in the file system. Throws
// Error(HM_ERR_INVALID_ARGUMENT) naming `what` if the name is empty or too long.
Address unix_abstract(std::string_view name, std::string_view what);
// "host:port", "[v6]:port", or "@name" for an abstract unix socket.
std::string to_string(const Address& address);
// Whether only this host can reach it: 127.0.0.0/8, ::1, or ::ffff:127.x.
bool is_loopback(const Address& address);
// The address a socket is bound to: a listener's real port.
Address local_address(int fd);

// One connect attempt (non-blocking connect, then poll), bounded by the deadline. Returns the
// connected socket, or an empty Fd with `error` set to the errno (ETIMEDOUT at the deadline).
Fd try_connect(const Address& address, const Deadline& deadline, int& error);
// Connects to the first of `candidates` that accepts. While all refuse (the peer may not listen
// yet) it retries every `retry_every` until `timeout` has passed, then throws
// Error(HM_ERR_TIMEOUT); an error that retrying cannot cure throws Error(kStatusPeerLost). The
// message is "cannot connect to <what> within <timeout> ms: <reason>".
Fd connect_with_retry(const std::vector<Address>& candidates, std::chrono::milliseconds timeout,
                      std::chrono::milliseconds retry_every, std::string_view what);

// A socket listening on `address` (SO_REUSEADDR, a backlog of 128). Throws
// Error(HM_ERR_INVALID_ARGUMENT) "cannot listen on <what>: <reason>" if it cannot bind, and
// Error(HM_ERR_BACKEND) for failures of the machine.
Fd listen_on(const Address& address, std::string_view what);
// Accepts one waiting connection, and tells its address to `peer` if given. Returns an empty Fd
// with errno set when there is none (EAGAIN) or accept failed.
Fd accept_connection(const Fd& listener, Address* peer = nullptr);

// Sockets from try_connect and accept_connection have TCP_NODELAY set (TCP only): every user
// sends small frames whose latency matters.

// Reads what has arrived, up to `size` bytes, waiting for the first: returns how many, 0 once the
// peer has closed. Errors as recv_exact's.
size_t recv_some(int fd, void* data, size_t size, const char* what, const Deadline& deadline = {});
// Reads exactly `size` bytes. Returns false if the peer closed cleanly before the first byte;
// throws Error(kStatusPeerLost) if it closed later ("connection closed mid-frame") or the
// connection broke, and Error(HM_ERR_TIMEOUT) at the deadline. Messages say "receiving <what>".
bool recv_exact(int fd, void* data, size_t size, const char* what, const Deadline& deadline = {});
// As recv_exact, but a close before the first byte throws Error(kStatusPeerLost) too.
void recv_all(int fd, void* data, size_t size, const char* what, const Deadline& deadline = {});
// Writes all `size` bytes. Never raises SIGPIPE: a peer that went away is Error(kStatusPeerLost);
// the deadline passing is Error(HM_ERR_TIMEOUT). Messages say "sending <what>".
void send_all(int fd, const void* data, size_t size, const char* what,
              const Deadline& deadline = {});
// send_all of two buffers (header and payload), in one system call where the socket takes both.
void send_two(int fd, const void* a, size_t a_size, const void* b, size_t b_size, const char* what,
              const Deadline& deadline = {});
// Whether the peer has closed or reset the connection (consuming nothing).
bool hung_up(int fd);
// The process at the other end of a unix socket (SO_PEERCRED), if the kernel says.
std::optional<ucred> peer_credentials(int fd);

}  // namespace hetmesh::net

#pragma GCC visibility pop
