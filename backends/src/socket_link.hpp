// How the transports' peers find each other's stream socket (the tcp data path, the verbs
// out-of-band channel, the ipc control channel), on top of the core's socket layer
// (<hetmesh/core/socket.hpp>): endpoint ids, socket addresses as text, and symmetric connects.
// The endpoint with the smaller id dials, the other accepts, and a hello frame says who is who.
#pragma once

#include <hetmesh/core/error.hpp>
#include <hetmesh/core/socket.hpp>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <span>
#include <string>
#include <thread>

namespace hetmesh::detail {

// The core's socket layer, under the names the transports use.
using net::Fd;
using net::recv_all;
using net::send_all;
using net::send_two;

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

// Dials `address`, retrying until `timeout` (the peer may not listen yet), and says hello. Throws
// Error(HM_ERR_TIMEOUT) when nobody listened in time, Error(kStatusPeerLost) for other failures.
Fd dial(const SocketAddress& address, const std::string& self_id,
        std::chrono::milliseconds timeout);

// Connects to `peer_id` at `peer_address`: dials if self_id < peer_id, else accepts.
Fd connect_symmetric(Listener& listener, const std::string& self_id, const std::string& peer_id,
                     const SocketAddress& peer_address, std::chrono::milliseconds timeout);

}  // namespace hetmesh::detail
