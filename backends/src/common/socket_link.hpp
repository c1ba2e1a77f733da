// How the transports' peers find each other's stream socket (the tcp data path, the verbs
// out-of-band channel, the ipc control channel), on top of the core's socket layer
// (<hetmesh/core/socket.hpp>): endpoint ids, socket addresses as text, and symmetric connects.
// The endpoint with the smaller id dials, the other accepts. Before either side is handed the
// socket, the two prove the job's secret to each other, so a process outside the job can neither
// pose as a peer nor take a real peer's place.
//
// The link handshake (integers little-endian; an id is 16 hex digits):
//   dialer:    u32 "HMHL" | u16 version | u16 0 | dialer id | acceptor id | dialer nonce (32)
//   acceptor:  u32 "HMHL" | u8 verdict | 3 zero | acceptor nonce (32)
//              | HMAC(secret, "hetmesh link acceptor" | ids | nonces)
//   dialer:    u32 "HMHL" | 4 zero | HMAC(secret, "hetmesh link dialer" | ids | nonces)
//   acceptor:  u32 "HMHL" | u8 verdict | 3 zero
// where ids = dialer id | acceptor id and nonces = dialer nonce | acceptor nonce. Each transport
// has a new endpoint id, so each incarnation of an instance does: the MACs bind a connection to
// the job (its secret), to these two incarnations (the ids, which the rendezvous store published
// under the store's own authentication) and to this attempt (the nonces). A verdict other than
// "accepted" closes the connection, and the dialer throws naming it. Every answer starts with
// the magic and the verdict, and a listener reads a whole hello before it refuses one, so that a
// dialer of another version of the handshake hears why it was refused.
//
// The listener runs every handshake at its gate (socket_gate.hpp): all at once, each to its own
// deadline, bounded, without spinning when descriptors run out. Only the ids that the owner asks
// for are handed over, each once. On a unix socket both sides also check that the other runs as
// the same user (SO_PEERCRED).
#pragma once

#include <hetmesh/core/error.hpp>
#include <hetmesh/core/job_secret.hpp>
#include <hetmesh/core/socket.hpp>
#include <hetmesh/core/socket_gate.hpp>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>

namespace hetmesh {
struct TransportOptions;
}

namespace hetmesh::detail {

// The core's socket layer, under the names the transports use.
using net::Fd;
using net::recv_all;
using net::send_all;
using net::send_two;

// A random 64-bit endpoint id, as 16 hex digits.
std::string new_endpoint_id();

// The secret a transport's links prove: the options' own, else the one the launcher handed this
// process (JobSecret::from_environment), else none (a job on one host's loopback).
JobSecret link_secret(const TransportOptions& options);

// A socket address: "tcp://host:port" or "unix:@name" (abstract namespace).
struct SocketAddress {
  std::string text;
};

// Listens, runs the link handshake with every connection (at its gate, socket_gate.hpp), and
// hands each proven peer to the accept_from that asks for its id.
class Listener {
 public:
  // Binds `address` ("tcp://host:0" picks a port; "unix:@name"). Throws Error: INVALID_ARGUMENT
  // for an address that cannot be bound, or a tcp address beyond loopback with no secret (anyone
  // who reached it could connect as a peer).
  Listener(const SocketAddress& address, std::string self_id, JobSecret secret);
  ~Listener();
  // The bound address, with the real port.
  const SocketAddress& address() const { return bound_; }
  const JobSecret& secret() const { return secret_; }
  // Waits for the peer `peer_id` to dial in and prove the secret; throws Error(TIMEOUT). Each id
  // is handed over once: a later connection claiming it is refused as a duplicate, unless
  // accept_from is called for it again, or the one waiting was hung up on by its dialer.
  Fd accept_from(const std::string& peer_id, std::chrono::milliseconds timeout);

 private:
  friend class LinkOpening;
  struct Proven {
    Fd fd;
    std::chrono::steady_clock::time_point since;
  };
  // Forgets `peer_id`'s connection waiting to be asked for if its dialer hung up on it (it gave
  // up and dials again: a rail coming back), so the new one is not refused as a duplicate.
  // Caller holds mutex_.
  void drop_abandoned(const std::string& peer_id);
  // Closes proven connections that nobody asked for in time. Caller holds mutex_.
  void expire_unclaimed();

  SocketAddress bound_;
  std::string self_id_;
  JobSecret secret_;
  bool local_ = false;  // a unix socket: the peer's user is checked
  std::mutex mutex_;
  std::condition_variable arrived_;
  std::map<std::string, Proven> proven_;         // proven peers not yet asked for
  std::set<std::string> handed_;                 // ids handed over (duplicates are refused)
  std::map<std::string, std::string> refusals_;  // why an id's last attempt was refused
  bool stopping_ = false;
  std::unique_ptr<net::Gate> gate_;  // last: its thread stops before the rest goes
};

// Dials `address`, retrying until `timeout` (the peer may not listen yet), and runs the link
// handshake as `self_id` towards `peer_id`. Throws Error(HM_ERR_TIMEOUT) when nobody listened in
// time, Error(kStatusNotAuthorized) when the two do not hold the same secret, and
// Error(kStatusPeerLost) for other failures, each naming the address and the peer.
Fd dial(const SocketAddress& address, const std::string& self_id, const std::string& peer_id,
        const JobSecret& secret, std::chrono::milliseconds timeout);

// Connects to `peer_id` at `peer_address`: dials if self_id < peer_id, else accepts.
Fd connect_symmetric(Listener& listener, const std::string& self_id, const std::string& peer_id,
                     const SocketAddress& peer_address, std::chrono::milliseconds timeout);

}  // namespace hetmesh::detail
