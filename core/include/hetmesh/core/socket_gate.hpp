// The door of every hetmesh listener (the TCP store, the transports' links): a gate accepts
// connections and runs each one's opening (a short exchange of fixed-size frames that proves the
// job's secret), all at once in one thread, each to its own deadline. Only a connection whose
// opening succeeds is handed to the owner. So a silent, slow or half-sent connection delays
// nobody and costs a descriptor for a bounded time; the number of openings under way is capped
// (past it the oldest is dropped, so a flood cannot keep a real peer out); a process out of
// descriptors sheds the connection at the head of the queue (with a spare
// descriptor kept for that) and pauses accepting for a moment, instead of spinning on EMFILE; and
// refusals are logged with the peer's address, at most one line a second.
#pragma once

#include <hetmesh/core/socket.hpp>

#include <poll.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

// Exported from the library, which hides every other symbol (core/README.md, "Exports").
#pragma GCC visibility push(default)

namespace hetmesh::net {

// One connection's opening, driven by the gate's thread.
class Opening {
 public:
  struct Step {
    std::vector<uint8_t> send;  // sent at once: a new connection has room for a few dozen bytes,
                                // so a peer that left none is dropped
    size_t await = 0;           // then the size of the frame to wait for; 0 ends the opening
    bool admitted = false;      // with await 0: hand the connection over, else close it
    std::string refusal;        // with await 0 and not admitted: why, for the log
  };
  virtual ~Opening();  // out of line: one vtable for every library that derives from it
  // The first step, when the connection has been accepted.
  virtual Step start() = 0;
  // The next step, given the frame that the last step awaited.
  virtual Step next(std::span<const uint8_t> frame) = 0;
};

struct GateLimits {
  size_t openings = 512;                     // under way at once; past it the oldest is dropped
  std::chrono::milliseconds deadline{5000};  // for each step of an opening
};

class Gate {
 public:
  // Makes the opening of a new connection `fd`; `from` names the peer for the log (its address,
  // or "local process PID (user UID)" on a unix socket).
  using MakeOpening = std::function<std::unique_ptr<Opening>(int fd, const std::string& from)>;
  // Takes an admitted connection, in the gate's thread.
  using Admit = std::function<void(Fd fd, Opening& opening, const std::string& from)>;

  // Serves `listener` (a listening socket from listen_on) until destroyed. `name` starts every
  // log line ("tcp store 127.0.0.1:5000"). Throws Error(HM_ERR_BACKEND) if it cannot start.
  Gate(Fd listener, std::string name, MakeOpening make, Admit admit, GateLimits limits = {});
  ~Gate();
  Gate(const Gate&) = delete;
  Gate& operator=(const Gate&) = delete;

  const Fd& listener() const { return listener_; }

 private:
  struct Connection;
  void serve();
  // One round of serve(): waits for the listener, an opening's bytes or the nearest deadline, and
  // acts on them. False when the gate ends.
  bool serve_round(std::vector<pollfd>& polled);
  void accept_waiting();
  // Reads what the connection sent; false when its opening is over.
  bool advance(Connection& c);
  // Sends the step's bytes and follows it; false when the opening is over.
  bool follow(Connection& c, Opening::Step step);
  // Says (at most once a second, with a count of those held back) that `from` was refused.
  void refuse(const std::string& from, const std::string& why) noexcept;

  Fd listener_;
  Fd wake_;   // eventfd: stops the thread
  Fd spare_;  // given up to accept (and drop) a connection when no descriptor is left
  std::string name_;
  MakeOpening make_;
  Admit admit_;
  GateLimits limits_;
  // Only the gate's thread touches these.
  std::vector<std::unique_ptr<Connection>> openings_;
  std::chrono::steady_clock::time_point paused_until_{};
  std::chrono::steady_clock::time_point last_warning_{};
  int warnings_held_ = 0;
  std::thread thread_;
};

}  // namespace hetmesh::net

#pragma GCC visibility pop
