// Symmetric connects between transport endpoints (socket_link.hpp): endpoint ids, the text form of
// socket addresses, the link handshake (the listener's side an opening at its gate, the dialer's
// a blocking exchange), and the listener that hands each proven peer to the accept_from that
// asks for it.
#include "common/socket_link.hpp"

#include <hetmesh/core/log.hpp>
#include <hetmesh/transport/transport.hpp>

#include <fmt/format.h>

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <random>

namespace hetmesh::detail {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr uint32_t kMagic = 0x4c484d48;  // "HMHL"
// 2: the handshake proves the job's secret both ways.
constexpr uint16_t kVersion = 2;
constexpr size_t kIdBytes = 16;
constexpr size_t kNonceBytes = 32;
constexpr const char* kAcceptorLabel = "hetmesh link acceptor";
constexpr const char* kDialerLabel = "hetmesh link dialer";
// Each connection must finish its part of the handshake within this, or it is dropped.
constexpr std::chrono::seconds kHandshakeTimeout{5};
// A proven peer that nobody asks for is closed after this (its dialer then loses the link).
constexpr std::chrono::minutes kUnclaimedTimeout{2};
// Bounds on what a listener holds for connections it has not handed over (the gate bounds the
// handshakes under way).
constexpr size_t kMaxProven = 256;
constexpr size_t kMaxRefusalsKept = 64;
// How long dial() waits between attempts while the peer does not listen yet (or is too busy).
constexpr milliseconds kDialRetry{5};

enum Verdict : uint8_t {
  kAccepted = 0,
  kWrongEndpoint = 1,  // the hello named another acceptor than this listener's
  kNotProven = 2,      // the dialer's MAC was wrong: it does not hold this job's secret
  kDuplicate = 3,      // a connection of this id is already proven here or handed over
  kBusy = 4,           // too many proven peers wait to be asked for
  kWrongVersion = 5,   // the hello is of another version of this handshake
  kWrongUser = 6       // on a unix socket: the dialer runs as another user
};

struct DialerHello {
  uint32_t magic;
  uint16_t version;
  uint16_t zero;
  char dialer[kIdBytes];
  char acceptor[kIdBytes];
  uint8_t nonce[kNonceBytes];
};
struct Challenge {
  uint32_t magic;
  uint8_t verdict;
  uint8_t zero[3];
  uint8_t nonce[kNonceBytes];
  uint8_t mac[32];
};
struct Proof {
  uint32_t magic;
  uint32_t zero;
  uint8_t mac[32];
};
struct Outcome {
  uint32_t magic;
  uint8_t verdict;
  uint8_t zero[3];
};
static_assert(sizeof(DialerHello) == 72 && sizeof(Challenge) == 72 && sizeof(Proof) == 40 &&
              sizeof(Outcome) == 8);

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

bool is_endpoint_id(std::string_view id) {
  return id.size() == kIdBytes && std::all_of(id.begin(), id.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

// HMAC(secret, label | dialer id | acceptor id | dialer nonce | acceptor nonce).
JobSecret::Mac link_mac(const JobSecret& secret, const char* label, const DialerHello& hello,
                        const uint8_t* acceptor_nonce) {
  uint8_t ids[2 * kIdBytes];
  std::memcpy(ids, hello.dialer, kIdBytes);
  std::memcpy(ids + kIdBytes, hello.acceptor, kIdBytes);
  uint8_t nonces[2 * kNonceBytes];
  std::memcpy(nonces, hello.nonce, kNonceBytes);
  std::memcpy(nonces + kNonceBytes, acceptor_nonce, kNonceBytes);
  return secret.mac(label, ids, nonces);
}

bool same_mac(const uint8_t* claimed, const JobSecret::Mac& expected) {
  JobSecret::Mac mac;
  std::memcpy(mac.data(), claimed, mac.size());
  return JobSecret::same(mac, expected);
}

const char* missing_secret_hint(const JobSecret& secret) {
  return secret.is_none() ? " (this endpoint has none: name the job's secret file in [rendezvous] "
                            "secret_file, or in HETMESH_JOB_SECRET_FILE)"
                          : "";
}

}  // namespace

std::string new_endpoint_id() {
  std::random_device entropy;
  uint64_t value = (static_cast<uint64_t>(entropy()) << 32) ^ entropy();
  return fmt::format("{:016x}", value);
}

JobSecret link_secret(const TransportOptions& options) {
  if (options.secret) return *options.secret;
  if (auto handed = JobSecret::from_environment()) return *handed;
  return JobSecret::none();
}

// ---- the listener ------------------------------------------------------------------------------

namespace {

template <typename Frame>
std::vector<uint8_t> bytes_of(const Frame& frame) {
  const auto* p = reinterpret_cast<const uint8_t*>(&frame);
  return {p, p + sizeof frame};
}

net::Opening::Step refused(std::vector<uint8_t> answer, std::string why) {
  net::Opening::Step step;
  step.send = std::move(answer);
  step.refusal = std::move(why);
  return step;
}

}  // namespace

// The listener's side of the link handshake for one connection.
class LinkOpening : public net::Opening {
 public:
  LinkOpening(Listener& listener, int fd, std::string from)
      : listener_(listener), fd_(fd), from_(std::move(from)) {}

  // Another user's process is refused before a byte is read (a hetmesh dialer checks the
  // listener's user before it sends one). Every other refusal waits for the whole hello, so that
  // the verdict reaches the dialer (a close with unread bytes would reset the connection).
  Step start() override {
    if (listener_.local_) {
      std::optional<ucred> dialer = net::peer_credentials(fd_);
      if (!dialer || dialer->uid != ::geteuid()) {
        Challenge c{kMagic, kWrongUser, {}, {}, {}};
        return refused(bytes_of(c),
                       fmt::format("it does not run as this process's user ({})", ::geteuid()));
      }
    }
    return Step{{}, sizeof(DialerHello), false, {}};
  }

  Step next(std::span<const uint8_t> frame) override {
    if (hello_in_) {
      Proof proof;
      std::memcpy(&proof, frame.data(), sizeof proof);
      return judge(proof);
    }
    std::memcpy(&hello_, frame.data(), sizeof hello_);
    hello_in_ = true;
    if (hello_.magic != kMagic)
      return refused({}, fmt::format("not a hetmesh link hello (magic {:08x})", hello_.magic));
    Challenge c{kMagic, kAccepted, {}, {}, {}};
    if (hello_.version != kVersion) {
      c.verdict = kWrongVersion;
      return refused(bytes_of(c), fmt::format("its hello is of link version {}; this is version {}",
                                              hello_.version, kVersion));
    }
    std::string acceptor(hello_.acceptor, kIdBytes);
    if (!is_endpoint_id(peer()) || !is_endpoint_id(acceptor))
      return refused({}, "its hello's endpoint ids are not 16 hex digits");
    if (acceptor != listener_.self_id_) {
      c.verdict = kWrongEndpoint;
      return refused(bytes_of(c), fmt::format("it dialled endpoint {}; this is {}", acceptor,
                                              listener_.self_id_));
    }
    random_bytes(nonce_);
    std::memcpy(c.nonce, nonce_, kNonceBytes);
    JobSecret::Mac mac = link_mac(listener_.secret_, kAcceptorLabel, hello_, nonce_);
    std::memcpy(c.mac, mac.data(), mac.size());
    return Step{bytes_of(c), sizeof(Proof), false, {}};
  }

  std::string peer() const { return {hello_.dialer, kIdBytes}; }

 private:
  // The dialer's proof is in: admit the connection, or say why not.
  Step judge(const Proof& proof) {
    Outcome o{kMagic, kAccepted, {}};
    std::string why;
    std::lock_guard lock(listener_.mutex_);
    const bool proven =
        proof.magic == kMagic &&
        same_mac(proof.mac, link_mac(listener_.secret_, kDialerLabel, hello_, nonce_));
    if (proven) listener_.drop_abandoned(peer());
    if (!proven) {
      o.verdict = kNotProven;
      why = fmt::format("it claimed to be endpoint {} but does not hold this job's secret{}",
                        peer(), missing_secret_hint(listener_.secret_));
    } else if (listener_.proven_.count(peer()) || listener_.handed_.count(peer())) {
      o.verdict = kDuplicate;
      why =
          fmt::format("endpoint {} is already connected or waiting here (the first stays)", peer());
    } else if (listener_.proven_.size() >= kMaxProven) {
      o.verdict = kBusy;
      why = fmt::format("{} proven peers already wait to be asked for", kMaxProven);
    } else {
      return Step{bytes_of(o), 0, true, {}};
    }
    auto& refusals = listener_.refusals_;
    if (refusals.size() >= kMaxRefusalsKept && !refusals.count(peer())) refusals.clear();
    refusals[peer()] = fmt::format("{}: {}", from_, why);
    return refused(bytes_of(o), why);
  }

  Listener& listener_;
  int fd_;
  std::string from_;
  bool hello_in_ = false;
  DialerHello hello_{};
  uint8_t nonce_[kNonceBytes]{};
};

Listener::Listener(const SocketAddress& address, std::string self_id, JobSecret secret)
    : self_id_(std::move(self_id)), secret_(std::move(secret)) {
  net::Address where = resolve(address, /*passive=*/true).front();
  local_ = where.family() == AF_UNIX;
  if (secret_.is_none() && !local_ && !net::is_loopback(where))
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("refusing to listen on {} without the job's secret: anyone who "
                            "reaches it could connect as a peer (name a secret file: "
                            "[rendezvous] secret_file, or {})",
                            address.text, JobSecret::kFileVariable));
  Fd socket = net::listen_on(where, address.text);
  net::Address bound = net::local_address(socket.get());
  bound_.text = local_ ? address.text : std::string(kTcpScheme) + net::to_string(bound);
  net::GateLimits limits;
  limits.deadline = kHandshakeTimeout;
  gate_ = std::make_unique<net::Gate>(
      std::move(socket), bound_.text,
      [this](int fd, const std::string& from) {
        return std::make_unique<LinkOpening>(*this, fd, from);
      },
      [this](Fd fd, net::Opening& opening, const std::string&) {
        std::lock_guard lock(mutex_);
        expire_unclaimed();
        proven_.emplace(static_cast<LinkOpening&>(opening).peer(),
                        Proven{std::move(fd), Clock::now()});
        arrived_.notify_all();
      },
      limits);
}

Listener::~Listener() {
  gate_.reset();  // no connection is admitted after this
  std::lock_guard lock(mutex_);
  stopping_ = true;
  arrived_.notify_all();
}

void Listener::expire_unclaimed() {
  auto now = Clock::now();
  std::erase_if(proven_, [&](const auto& entry) {
    if (now - entry.second.since < kUnclaimedTimeout) return false;
    log(LogLevel::warn,
        "{}: closing the connection of endpoint {}: nothing asked for it within {} s", bound_.text,
        entry.first, std::chrono::duration_cast<std::chrono::seconds>(kUnclaimedTimeout).count());
    return true;
  });
}

void Listener::drop_abandoned(const std::string& peer_id) {
  auto it = proven_.find(peer_id);
  if (it == proven_.end() || !net::hung_up(it->second.fd.get())) return;
  log(LogLevel::info,
      "{}: endpoint {} dialled again after hanging up on its earlier connection, which was not "
      "asked for yet: the new one takes its place",
      bound_.text, peer_id);
  proven_.erase(it);
}

Fd Listener::accept_from(const std::string& peer_id, std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  expire_unclaimed();
  handed_.erase(peer_id);  // asked for again: one more connection of it is welcome
  // One its dialer hung up on is not handed over: that dialer dials again.
  arrived_.wait_for(lock, timeout, [&] {
    drop_abandoned(peer_id);
    return proven_.count(peer_id) > 0 || stopping_;
  });
  auto it = proven_.find(peer_id);
  if (it == proven_.end()) {
    auto refusal = refusals_.find(peer_id);
    throw Error(
        HM_ERR_TIMEOUT,
        fmt::format("peer {} did not connect to {} and prove the job's secret within {} "
                    "ms{}",
                    peer_id, bound_.text, timeout.count(),
                    refusal == refusals_.end() ? std::string()
                                               : fmt::format(" (refused: {})", refusal->second)));
  }
  Fd fd = std::move(it->second.fd);
  proven_.erase(it);
  handed_.insert(peer_id);
  return fd;
}

// ---- the dialer --------------------------------------------------------------------------------

namespace {

enum class Attempt { accepted, again };

// The dialer's side of the handshake on a connected socket. `again`: the listener closed before
// answering (it shed the connection) or was too busy; throws for answers that retrying cannot
// change.
Attempt handshake(const Fd& fd, const SocketAddress& address, const std::string& self_id,
                  const std::string& peer_id, const JobSecret& secret, net::Deadline deadline) {
  if (address.text.starts_with(kUnixScheme)) {
    std::optional<ucred> owner = net::peer_credentials(fd.get());
    if (!owner || owner->uid != ::geteuid())
      throw Error(kStatusNotAuthorized,
                  fmt::format("{} belongs to another user ({}) than this process's ({}): it is "
                              "not peer {}",
                              address.text, owner ? std::to_string(owner->uid) : "unknown",
                              ::geteuid(), peer_id));
  }
  DialerHello hello{kMagic, kVersion, 0, {}, {}, {}};
  std::memcpy(hello.dialer, self_id.data(), kIdBytes);
  std::memcpy(hello.acceptor, peer_id.data(), kIdBytes);
  random_bytes(hello.nonce);
  send_all(fd.get(), &hello, sizeof hello, "the link hello", deadline);
  Challenge c{};
  try {
    if (!net::recv_exact(fd.get(), &c, sizeof c, "the link challenge", deadline))
      return Attempt::again;
  } catch (const Error& e) {
    // Closed or reset before a word: the listener shed the connection (out of descriptors, or
    // too many opening at once). Anything else is for the caller.
    if (e.status() != kStatusPeerLost) throw;
    return Attempt::again;
  }
  if (c.magic != kMagic)
    throw Error(kStatusProtocolError,
                fmt::format("{} answered the link hello with something else (magic {:08x}): it "
                            "is not a hetmesh endpoint",
                            address.text, c.magic));
  if (c.verdict == kWrongVersion)
    throw Error(kStatusProtocolError,
                fmt::format("peer {} at {} speaks another version of the link handshake than this "
                            "endpoint's ({}): are both ends the same hetmesh release?",
                            peer_id, address.text, kVersion));
  if (c.verdict == kWrongUser)
    throw Error(kStatusNotAuthorized,
                fmt::format("peer {} at {} refused this process's user ({}): both ends of an ipc "
                            "link must run as one user",
                            peer_id, address.text, ::geteuid()));
  if (c.verdict == kWrongEndpoint)
    throw Error(kStatusPeerLost,
                fmt::format("the endpoint at {} is not peer {} (another endpoint reused its "
                            "address: the peer is gone)",
                            address.text, peer_id));
  if (c.verdict != kAccepted)
    throw Error(kStatusProtocolError,
                fmt::format("peer {} at {} refused the link hello with verdict {}, which this "
                            "endpoint does not know",
                            peer_id, address.text, c.verdict));
  Proof proof{kMagic, 0, {}};
  bool proven = same_mac(c.mac, link_mac(secret, kAcceptorLabel, hello, c.nonce));
  if (proven) {
    JobSecret::Mac mac = link_mac(secret, kDialerLabel, hello, c.nonce);
    std::memcpy(proof.mac, mac.data(), mac.size());
  }
  // An unproven acceptor still gets a (zero) proof, so that its side logs the refusal too.
  send_all(fd.get(), &proof, sizeof proof, "the link proof", deadline);
  if (!proven)
    throw Error(kStatusNotAuthorized,
                fmt::format("peer {} at {} holds another job secret than this endpoint{}", peer_id,
                            address.text, missing_secret_hint(secret)));
  Outcome o{};
  recv_all(fd.get(), &o, sizeof o, "the link verdict", deadline);
  switch (o.magic == kMagic ? o.verdict : 0xff) {
    case kAccepted:
      return Attempt::accepted;
    case kBusy:
      return Attempt::again;
    case kNotProven:
      throw Error(kStatusNotAuthorized,
                  fmt::format("peer {} at {} refused this endpoint's proof of the job's secret",
                              peer_id, address.text));
    case kDuplicate:
      throw Error(kStatusProtocolError,
                  fmt::format("peer {} at {} already has a connection from endpoint {}", peer_id,
                              address.text, self_id));
    default:
      throw Error(kStatusProtocolError, fmt::format("peer {} at {} sent a malformed link verdict",
                                                    peer_id, address.text));
  }
}

}  // namespace

Fd dial(const SocketAddress& address, const std::string& self_id, const std::string& peer_id,
        const JobSecret& secret, std::chrono::milliseconds timeout) {
  if (!is_endpoint_id(self_id) || !is_endpoint_id(peer_id))
    throw Error(kStatusProtocolError,
                fmt::format("endpoint ids must be 16 hex digits: '{}', '{}'", self_id, peer_id));
  const auto deadline = Clock::now() + timeout;
  const std::vector<net::Address> candidates = resolve(address, /*passive=*/false);
  for (;;) {
    auto left = std::max(std::chrono::ceil<milliseconds>(deadline - Clock::now()), milliseconds(1));
    Fd fd = net::connect_with_retry(candidates, left, kDialRetry, address.text);
    if (handshake(fd, address, self_id, peer_id, secret, deadline) == Attempt::accepted) return fd;
    if (Clock::now() + kDialRetry >= deadline)
      throw Error(HM_ERR_TIMEOUT,
                  fmt::format("peer {} at {} did not accept this endpoint within {} ms (it shed "
                              "the connection, or was too busy)",
                              peer_id, address.text, timeout.count()));
    std::this_thread::sleep_for(kDialRetry);
  }
}

Fd connect_symmetric(Listener& listener, const std::string& self_id, const std::string& peer_id,
                     const SocketAddress& peer_address, std::chrono::milliseconds timeout) {
  if (self_id == peer_id)
    throw Error(HM_ERR_INVALID_ARGUMENT, "cannot connect an endpoint to itself");
  if (!is_endpoint_id(peer_id))
    throw Error(kStatusProtocolError,
                fmt::format("peer endpoint id '{}' is not 16 hex digits", peer_id));
  if (self_id < peer_id) return dial(peer_address, self_id, peer_id, listener.secret(), timeout);
  return listener.accept_from(peer_id, timeout);
}

}  // namespace hetmesh::detail
