// Stream sockets shared by the transports: the tcp data path, the verbs out-of-band channel and
// the ipc control channel. Peers connect symmetrically: the endpoint with the smaller id dials,
// the other accepts, and a hello frame says who is who.
#pragma once

#include <hetmesh/core/error.hpp>

#include <sys/socket.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <utility>

namespace hetmesh::detail {

// Owns a file descriptor.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Fd& operator=(Fd&& other) noexcept;
  ~Fd() { reset(); }
  int get() const { return fd_; }
  explicit operator bool() const { return fd_ >= 0; }
  void reset();
  // Wakes a thread blocked on this socket (shutdown), without closing the number under it.
  void shutdown() const;

 private:
  int fd_ = -1;
};

// A random 64-bit endpoint id, as 16 hex digits.
std::string new_endpoint_id();

// A socket address: "tcp://host:port" or "unix:@name" (abstract namespace).
struct SocketAddress {
  std::string text;
};

// Listens, and sorts accepted connections by the endpoint id in their hello frame.
class Listener {
 public:
  // Binds `address` ("tcp://host:0" picks a port; "unix:@name"). Throws Error on failure.
  Listener(const SocketAddress& address, std::string self_id);
  ~Listener();
  // The bound address, with the real port.
  const SocketAddress& address() const { return bound_; }
  // Waits for the peer `peer_id` to dial in; throws Error(TIMEOUT).
  Fd accept_from(const std::string& peer_id, std::chrono::milliseconds timeout);

 private:
  void serve();
  Fd socket_;
  SocketAddress bound_;
  std::string self_id_;
  std::mutex mutex_;
  std::condition_variable arrived_;
  std::map<std::string, Fd> pending_;
  bool stopping_ = false;
  std::thread thread_;
};

// Dials `address`, retrying until `timeout` (the peer may not listen yet), and says hello.
Fd dial(const SocketAddress& address, const std::string& self_id,
        std::chrono::milliseconds timeout);

// Connects to `peer_id` at `peer_address`: dials if self_id < peer_id, else accepts.
Fd connect_symmetric(Listener& listener, const std::string& self_id, const std::string& peer_id,
                     const SocketAddress& peer_address, std::chrono::milliseconds timeout);

// Blocking full-buffer I/O. send_all never raises SIGPIPE. Both throw Error(kStatusPeerLost) when
// the peer closes or the connection breaks, naming `what`.
void send_all(int fd, const void* data, size_t size, const char* what);
void recv_all(int fd, void* data, size_t size, const char* what);
// Scatter send of two buffers (header + payload) in one call where possible.
void send_two(int fd, const void* a, size_t a_size, const void* b, size_t b_size, const char* what);

}  // namespace hetmesh::detail
