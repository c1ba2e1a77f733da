// The gate of every listener (socket_gate.hpp): one thread polls the listening socket and every
// opening under way, with the nearest deadline as its timeout.
#include <hetmesh/core/log.hpp>
#include <hetmesh/core/socket_gate.hpp>
#include <hetmesh/core/thread.hpp>

#include <fmt/format.h>

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace hetmesh::net {
namespace {

using std::chrono::milliseconds;

// Connections accepted in one round, so the openings under way keep moving in a flood.
constexpr int kAcceptBurst = 64;
// How long accepting pauses after the process ran out of descriptors.
constexpr milliseconds kDescriptorPause{10};

Fd open_spare() {
  return Fd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
}

}  // namespace

Opening::~Opening() = default;

struct Gate::Connection {
  Fd fd;
  std::string from;
  std::unique_ptr<Opening> opening;
  Clock::time_point deadline;
  std::vector<uint8_t> frame;  // the awaited frame, `have` bytes of it in
  size_t have = 0;
};

Gate::Gate(Fd listener, std::string name, MakeOpening make, Admit admit, GateLimits limits)
    : listener_(std::move(listener)),
      name_(std::move(name)),
      make_(std::move(make)),
      admit_(std::move(admit)),
      limits_(limits) {
  wake_ = Fd(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake_)
    throw Error(HM_ERR_BACKEND, fmt::format("{}: eventfd: {}", name_, describe_errno(errno)));
  spare_ = open_spare();
  thread_ = start_thread("hm-gate", [this] { serve(); });
}

Gate::~Gate() {
  uint64_t one = 1;
  if (::write(wake_.get(), &one, sizeof one) < 0) listener_.shutdown();  // wakes poll too
  thread_.join();
}

void Gate::serve() {
  std::vector<pollfd> polled;
  for (;;) {
    try {
      if (!serve_round(polled)) return;
    } catch (const std::exception& e) {
      // Out of memory in the middle of a round (nothing else throws here): the openings under
      // way are dropped (their dialers see the close and may try again) and accepting pauses, so
      // the gate lives on and the process's other threads get the memory first.
      openings_.clear();
      paused_until_ = Clock::now() + kDescriptorPause;
      refuse("every connection opening", e.what());
    }
  }
}

bool Gate::serve_round(std::vector<pollfd>& polled) {
  auto now = Clock::now();
  const bool accepting = now >= paused_until_;
  auto wake = accepting ? Clock::time_point::max() : paused_until_;
  polled.clear();
  polled.push_back({wake_.get(), POLLIN, 0});
  polled.push_back({accepting ? listener_.get() : -1, POLLIN, 0});  // poll skips a negative fd
  for (const auto& c : openings_) {
    polled.push_back({c->fd.get(), POLLIN, 0});
    wake = std::min(wake, c->deadline);
  }
  int timeout = -1;
  if (wake != Clock::time_point::max())
    timeout = static_cast<int>(
        std::chrono::ceil<milliseconds>(std::max(wake - now, Clock::duration::zero())).count());
  int ready = ::poll(polled.data(), polled.size(), timeout);
  if (ready < 0 && errno != EINTR) {
    log(LogLevel::error, "{}: poll: {}; no more connections are accepted", name_, strerror(errno));
    return false;
  }
  if (ready > 0 && polled[0].revents != 0) return false;                     // stopping
  if (ready > 0 && (polled[1].revents & (POLLERR | POLLHUP))) return false;  // shut down
  if (ready > 0) {
    std::vector<std::unique_ptr<Connection>> going_on;
    going_on.reserve(openings_.size());
    for (size_t i = 0; i < openings_.size(); ++i)
      if (polled[i + 2].revents == 0 || advance(*openings_[i]))
        going_on.push_back(std::move(openings_[i]));
    openings_ = std::move(going_on);
    if (polled[1].revents != 0) accept_waiting();
  }
  now = Clock::now();
  std::erase_if(openings_, [&](const std::unique_ptr<Connection>& c) {
    if (now < c->deadline) return false;
    refuse(c->from,
           fmt::format("it did not finish its opening within {} ms", limits_.deadline.count()));
    return true;
  });
  return true;
}

void Gate::accept_waiting() {
  for (int i = 0; i < kAcceptBurst; ++i) {
    Address address;
    Fd fd = accept_connection(listener_, &address);
    if (!fd) {
      int error = errno;
      if (error == EMFILE || error == ENFILE) {
        // The waiting connection keeps the listener readable, and poll would spin: give up the
        // spare descriptor to take it off the queue and close it, then pause a moment.
        refuse("a connection",
               fmt::format("this process is out of file descriptors ({})", strerror(error)));
        spare_.reset();
        accept_connection(listener_).reset();
        spare_ = open_spare();
        paused_until_ = Clock::now() + kDescriptorPause;
      }
      return;  // EAGAIN: nobody else waits; anything else is the dialer's problem
    }
    std::string from = to_string(address);
    if (address.family() == AF_UNIX) {
      std::optional<ucred> peer = peer_credentials(fd.get());
      from = peer ? fmt::format("local process {} (user {})", peer->pid, peer->uid)
                  : std::string("a local process");
    }
    if (!openings_.empty() && openings_.size() >= limits_.openings) {
      // The oldest goes, not the newcomer: a flood of silent connections then cannot keep a
      // real peer out, whose opening takes a round trip where theirs take the whole deadline.
      refuse(openings_.front()->from,
             fmt::format("{} connections were opening, and it was the oldest", limits_.openings));
      openings_.erase(openings_.begin());
    }
    try {
      auto c = std::make_unique<Connection>();
      c->fd = std::move(fd);
      c->from = std::move(from);
      c->opening = make_(c->fd.get(), c->from);
      if (follow(*c, c->opening->start())) openings_.push_back(std::move(c));
    } catch (const std::exception& e) {  // one connection's trouble, never the gate's
      refuse("a connection", fmt::format("its opening failed: {}", e.what()));
    }
  }
}

bool Gate::advance(Connection& c) {
  ssize_t n = ::recv(c.fd.get(), c.frame.data() + c.have, c.frame.size() - c.have, MSG_DONTWAIT);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return true;
  if (n <= 0) {
    log(LogLevel::debug, "{}: {} went away during its opening", name_, c.from);
    return false;
  }
  c.have += static_cast<size_t>(n);
  if (c.have < c.frame.size()) return true;
  try {
    return follow(c, c.opening->next(c.frame));
  } catch (const std::exception& e) {  // one connection's trouble, never the gate's
    refuse(c.from, fmt::format("its opening failed: {}", e.what()));
    return false;
  }
}

bool Gate::follow(Connection& c, Opening::Step step) {
  const bool sent = step.send.empty() ||
                    ::send(c.fd.get(), step.send.data(), step.send.size(),
                           MSG_DONTWAIT | MSG_NOSIGNAL) == static_cast<ssize_t>(step.send.size());
  if (!step.refusal.empty()) {  // refused, whether or not the answer reached it (it may be gone)
    refuse(c.from, step.refusal);
    return false;
  }
  if (!sent) {
    log(LogLevel::debug, "{}: {} does not read its opening", name_, c.from);
    return false;
  }
  if (step.await > 0) {
    c.frame.assign(step.await, 0);
    c.have = 0;
    c.deadline = Clock::now() + limits_.deadline;
    return true;
  }
  if (step.admitted) admit_(std::move(c.fd), *c.opening, c.from);
  return false;
}

void Gate::refuse(const std::string& from, const std::string& why) noexcept {
  auto now = Clock::now();
  if (now - last_warning_ < std::chrono::seconds(1)) {
    ++warnings_held_;
    return;
  }
  try {
    log(LogLevel::warn, "{}: refused {}: {}{}", name_, from, why,
        warnings_held_ > 0 ? fmt::format(" ({} more refused in the second before)", warnings_held_)
                           : std::string());
  } catch (const std::exception&) {  // out of memory for the words: the refusal itself stands
  }
  warnings_held_ = 0;
  last_warning_ = now;
}

}  // namespace hetmesh::net
