// The embedded TCP store's client: connect_tcp_store and the KeyValueStore it returns.
//
// Requests go over a small pool of connections: a get() blocked on one connection does not hold
// up other threads' calls (a barrier needs them), and a connection that failed mid-request is
// dropped, never reused out of step. Every request's round trip is bounded by a deadline. A new
// connection's hello is checked as its first bytes arrive, within kHelloTimeout, so something
// else on the store's port is named at once, not at the join's deadline.
#include "store_wire.hpp"

#include <hetmesh/core/rendezvous.hpp>
#include <hetmesh/core/socket.hpp>

#include <fmt/format.h>

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <span>
#include <utility>

namespace hetmesh {
namespace {

using namespace store_wire;
using std::chrono::milliseconds;

// How long connect_tcp_store waits between attempts while the server does not listen yet.
constexpr milliseconds kConnectRetry{10};
// How long a new connection waits for the hello's first bytes, which a store sends as it accepts:
// a listener silent that long is not the store (or the store is wedged), whatever the join's
// timeout.
constexpr milliseconds kHelloTimeout{5000};

// `bytes` as a quoted C string: printable ASCII as is, the rest escaped.
std::string printable(std::span<const uint8_t> bytes) {
  std::string out = "\"";
  for (uint8_t b : bytes) {
    if (b == '\r')
      out += "\\r";
    else if (b == '\n')
      out += "\\n";
    else if (b == '\t')
      out += "\\t";
    else if (b == '"' || b == '\\')
      out += fmt::format("\\{}", static_cast<char>(b));
    else if (b >= 0x20 && b < 0x7f)
      out += static_cast<char>(b);
    else
      out += fmt::format("\\x{:02x}", b);
  }
  return out + "\"";
}

class TcpStoreClient final : public KeyValueStore {
 public:
  TcpStoreClient(std::string address, std::vector<net::Address> resolved, net::Fd first,
                 milliseconds io_timeout, JobSecret secret)
      : address_(std::move(address)),
        resolved_(std::move(resolved)),
        io_timeout_(io_timeout),
        secret_(secret) {
    try {
      prove(first.get(), net::Clock::now() + io_timeout_);
    } catch (const Error& e) {
      if (std::string_view(e.what()).starts_with(describe())) throw;
      throw Error(e.status(), fmt::format("{}: the opening (proving the job's secret): {}",
                                          describe(), e.what()));
    }
    idle_.push_back(std::move(first));
  }

  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    auto [status, reason] = call(kSet, key, value, milliseconds(0));
    if (status == kFull)
      throw Error(HM_ERR_OUT_OF_MEMORY, fmt::format("{}: set '{}': {}", describe(), key,
                                                    std::string(reason.begin(), reason.end())));
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
    if (status == kRefused || status == kFull)
      throw Error(status == kFull ? HM_ERR_OUT_OF_MEMORY : HM_ERR_INVALID_ARGUMENT,
                  fmt::format("{}: add to '{}': {}", describe(), key,
                              std::string(value.begin(), value.end())));
    if (value.size() != 8)
      throw Error(kStatusProtocolError,
                  fmt::format("{}: add to '{}': the reply holds {} bytes, not a counter",
                              describe(), key, value.size()));
    return static_cast<int64_t>(get_u64(value.data()));
  }

  void erase(const std::string& key) override { call(kErase, key, {}, milliseconds(0)); }

  std::string describe() const override { return "tcp store " + address_; }

  std::unique_ptr<KeyValueStore> clone() const override {
    return connect_tcp_store(address_, io_timeout_, secret_);
  }

 private:
  struct Result {
    Status status = kOk;
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
    net::Deadline deadline = net::Clock::now() + io_timeout_ + wait;
    net::Fd fd =
        acquire(deadline, [&](const std::string& why) { return fail(kStatusPeerLost, why); });
    Result result;
    try {
      std::vector<uint8_t> head = encode_request(op, key, value.size());
      net::send_all(fd.get(), head.data(), head.size(), "the request", deadline);
      net::send_all(fd.get(), value.data(), value.size(), "the value", deadline);
      uint8_t raw[kReplyHeaderBytes];
      if (!net::recv_exact(fd.get(), raw, sizeof raw, "the reply", deadline))
        throw Error(kStatusPeerLost, "the store closed the connection");
      Frame frame = decode_reply(raw);
      result = Result{static_cast<Status>(frame.code), std::vector<uint8_t>(frame.value_length)};
      net::recv_all(fd.get(), result.value.data(), result.value.size(), "the reply value",
                    deadline);
    } catch (const Malformed& e) {
      throw fail(kStatusProtocolError, fmt::format("bad reply: {}", e.what()));
    } catch (const Error& e) {
      if (e.status() == HM_ERR_TIMEOUT)
        throw fail(HM_ERR_TIMEOUT,
                   fmt::format("no reply within {} ms", (io_timeout_ + wait).count()));
      throw fail(e.status(), fmt::format("{} (is the store's host still running?)", e.what()));
    }
    // The store did not serve the request (it could not start a thread for it) and ends this
    // connection: it is not kept. The words are the store's.
    if (result.status == kUnavailable)
      throw fail(HM_ERR_OUT_OF_MEMORY, std::string(result.value.begin(), result.value.end()));
    release(std::move(fd));
    return result;
  }

  // An idle connection, or a new one. Unlike the first connect, this one does not retry: the
  // store was up, so a refusal now means it is gone.
  template <typename Fail>
  net::Fd acquire(const net::Deadline& deadline, Fail fail) {
    {
      std::lock_guard lock(mutex_);
      if (!idle_.empty()) {
        net::Fd fd = std::move(idle_.back());
        idle_.pop_back();
        return fd;
      }
    }
    int error = 0;
    for (const net::Address& a : resolved_)
      if (net::Fd fd = net::try_connect(a, deadline, error)) {
        prove(fd.get(), deadline);
        return fd;
      }
    throw fail(fmt::format("cannot reconnect: {} (is the store's host still running?)",
                           std::strerror(error)));
  }

  // The client's half of store_wire.hpp's challenge-response on a new connection.
  void prove(int fd, const net::Deadline& deadline) {
    try {
      uint8_t challenge[kChallengeBytes];
      receive_hello(fd, challenge, deadline);
      std::span<const uint8_t> server_nonce(challenge + 8, kNonceBytes);
      uint8_t answer[kAnswerBytes];
      put_hello_head(answer);
      std::span<uint8_t> client_nonce(answer + 8, kNonceBytes);
      random_bytes(client_nonce);
      JobSecret::Mac mine = secret_.mac(kClientLabel, server_nonce, client_nonce);
      std::memcpy(answer + 8 + kNonceBytes, mine.data(), mine.size());
      net::send_all(fd, answer, sizeof answer, "the answer", deadline);
      uint8_t verdict[kVerdictBytes];
      if (!net::recv_exact(fd, verdict, sizeof verdict, "the verdict", deadline))
        throw Error(kStatusPeerLost, "the store closed the connection");
      if (verdict[0] != 0)
        throw Error(kStatusNotAuthorized,
                    fmt::format("{} refused this process: it does not hold the job's secret "
                                "(the file {} names, or [rendezvous] secret_file)",
                                describe(), JobSecret::kFileVariable));
      JobSecret::Mac theirs;
      std::memcpy(theirs.data(), verdict + 1, theirs.size());
      if (!JobSecret::same(theirs, secret_.mac(kServerLabel, client_nonce, server_nonce)))
        throw Error(kStatusNotAuthorized,
                    fmt::format("{} does not hold this job's secret: it is not this job's store",
                                describe()));
    } catch (const Malformed& e) {
      throw Error(kStatusProtocolError, fmt::format("{}: bad hello: {}", describe(), e.what()));
    }
  }

  // The store's challenge. What opens it is checked as it arrives, so that a listener that is
  // not the store (another program on its port) is refused at its first bytes, naming them, and
  // one that says nothing within kHelloTimeout is given up on then, not at the join's deadline.
  void receive_hello(int fd, uint8_t (&challenge)[kChallengeBytes], const net::Deadline& deadline) {
    uint8_t head[8];
    put_hello_head(head);
    const auto until = deadline.value_or(net::Clock::time_point::max());
    const auto hello_deadline = std::min(until, net::Clock::now() + kHelloTimeout);
    size_t got = 0;
    auto sent = [&] { return std::span<const uint8_t>(challenge, got); };
    while (got < 8) {  // the magic and version; then the nonce within the usual deadline
      pollfd p{fd, POLLIN, 0};
      const auto left = std::chrono::ceil<milliseconds>(hello_deadline - net::Clock::now());
      if (::poll(&p, 1, static_cast<int>(std::max<int64_t>(left.count(), 0))) == 0) {
        if (got == 0 && hello_deadline < until)
          throw Error(HM_ERR_TIMEOUT,
                      fmt::format("{}: the listener there sent nothing within {} ms of the "
                                  "connection, where the store's hello comes at once: it is not a "
                                  "hetmesh store (another program holds the port?), or the store "
                                  "is wedged",
                                  describe(), kHelloTimeout.count()));
        throw Error(HM_ERR_TIMEOUT, "receiving the challenge: timed out");
      }
      const ssize_t n = ::recv(fd, challenge + got, sizeof challenge - got, MSG_DONTWAIT);
      if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
      if (n < 0)
        throw Error(kStatusPeerLost, fmt::format("receiving the challenge: {}", strerror(errno)));
      if (n == 0)
        throw Error(kStatusPeerLost,
                    got == 0 ? std::string("the store closed the connection")
                             : fmt::format("{}: the listener there closed the connection after "
                                           "sending {}, which is not the store's hello",
                                           describe(), printable(sent())));
      got += static_cast<size_t>(n);
      if (std::memcmp(challenge, head, std::min<size_t>(got, 4)) != 0)
        throw Error(kStatusProtocolError,
                    fmt::format("{}: the listener there is not a hetmesh store: where the store's "
                                "hello was expected, it sent {}",
                                describe(), printable(sent())));
    }
    check_hello_head(challenge);  // the version, named
    net::recv_all(fd, challenge + got, sizeof challenge - got, "the challenge", deadline);
  }

  void release(net::Fd fd) {
    std::lock_guard lock(mutex_);
    if (idle_.size() < kMaxIdle) idle_.push_back(std::move(fd));
  }

  std::string address_;
  std::vector<net::Address> resolved_;
  milliseconds io_timeout_;
  JobSecret secret_;
  std::mutex mutex_;  // guards idle_
  std::vector<net::Fd> idle_;
};

}  // namespace

std::unique_ptr<KeyValueStore> connect_tcp_store(const std::string& address, milliseconds timeout,
                                                 std::optional<JobSecret> secret) {
  if (!secret) secret = JobSecret::from_environment();
  std::vector<net::Address> found = net::resolve(address, /*passive=*/false, "store address");
  // The server may simply not listen yet: refused connections are retried until the timeout.
  net::Fd fd = net::connect_with_retry(found, timeout, kConnectRetry, "tcp store " + address);
  return std::make_unique<TcpStoreClient>(address, std::move(found), std::move(fd), timeout,
                                          secret.value_or(JobSecret::none()));
}

}  // namespace hetmesh
