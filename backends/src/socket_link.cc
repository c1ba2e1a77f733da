// Symmetric connects between transport endpoints (socket_link.hpp): endpoint ids, the text form of
// socket addresses, the hello frame, and the listener that sorts dialled-in peers by id.
#include "socket_link.hpp"

#include <fmt/format.h>

#include <poll.h>

#include <algorithm>
#include <cstring>
#include <random>

namespace hetmesh::detail {
namespace {

constexpr uint32_t kHelloMagic = 0x4c484d48;  // "HMHL"
constexpr uint16_t kHelloVersion = 1;
// A peer that connects and says nothing must not stall the listener longer than this.
constexpr std::chrono::seconds kHelloTimeout{5};
// How long dial() waits between attempts while the peer does not listen yet.
constexpr std::chrono::milliseconds kDialRetry{5};

struct Hello {
  uint32_t magic;
  uint16_t version;
  uint16_t id_length;
  char id[32];
};

constexpr std::string_view kTcpScheme = "tcp://";
constexpr std::string_view kUnixScheme = "unix:@";

// Every address a SocketAddress names (one, for a unix socket).
std::vector<net::Address> resolve(const SocketAddress& address, bool passive) {
  std::string_view text = address.text;
  if (text.starts_with(kUnixScheme))
    return {net::unix_abstract(text.substr(kUnixScheme.size()),
                               fmt::format("socket address '{}'", text))};
  if (!text.starts_with(kTcpScheme))
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("socket address '{}' is neither tcp://host:port nor unix:@name", text));
  return net::resolve(text.substr(kTcpScheme.size()), passive, "socket address");
}

}  // namespace

std::string new_endpoint_id() {
  std::random_device entropy;
  uint64_t value = (static_cast<uint64_t>(entropy()) << 32) ^ entropy();
  return fmt::format("{:016x}", value);
}

Listener::Listener(const SocketAddress& address, std::string self_id)
    : self_id_(std::move(self_id)) {
  socket_ = net::listen_on(resolve(address, /*passive=*/true).front(), address.text);
  net::Address bound = net::local_address(socket_.get());
  bound_.text =
      bound.family() == AF_UNIX ? address.text : std::string(kTcpScheme) + net::to_string(bound);
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
    Fd peer = net::accept_connection(socket_);
    if (!peer) continue;
    Hello hello{};
    try {
      if (!net::recv_exact(peer.get(), &hello, sizeof hello, "hello",
                           net::Clock::now() + kHelloTimeout))
        continue;
    } catch (const Error&) {
      continue;  // silent, or gone: drop it
    }
    if (hello.magic != kHelloMagic || hello.version != kHelloVersion ||
        hello.id_length > sizeof hello.id)
      continue;  // not one of ours: drop it
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
  net::Deadline deadline = net::Clock::now() + timeout;
  Fd fd = net::connect_with_retry(resolve(address, /*passive=*/false), timeout, kDialRetry,
                                  address.text);
  Hello hello{kHelloMagic, kHelloVersion, static_cast<uint16_t>(self_id.size()), {}};
  std::memcpy(hello.id, self_id.data(), std::min(self_id.size(), sizeof hello.id));
  send_all(fd.get(), &hello, sizeof hello, "hello", deadline);
  return fd;
}

Fd connect_symmetric(Listener& listener, const std::string& self_id, const std::string& peer_id,
                     const SocketAddress& peer_address, std::chrono::milliseconds timeout) {
  if (self_id == peer_id)
    throw Error(HM_ERR_INVALID_ARGUMENT, "cannot connect an endpoint to itself");
  if (self_id < peer_id) return dial(peer_address, self_id, timeout);
  return listener.accept_from(peer_id, timeout);
}

}  // namespace hetmesh::detail
