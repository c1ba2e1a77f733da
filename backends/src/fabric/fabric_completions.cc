#include "fabric/fabric_completions.hpp"

#include "fabric/fabric_library.hpp"
#include "fabric/fabric_link.hpp"

#include <hetmesh/core/log.hpp>
#include <hetmesh/core/spin.hpp>

#include <rdma/fi_errno.h>

#include <algorithm>
#include <cstring>
#include <thread>

namespace hetmesh::detail {
namespace {

using Clock = FabricShared::Clock;
using std::chrono::milliseconds;
using std::chrono::nanoseconds;

// The longest a poller sleeps in the provider at a time.
constexpr milliseconds kLongestRead{2};
// Caps a wait so that now() + wait cannot overflow.
constexpr nanoseconds kLongestWait = std::chrono::hours(24 * 365);

// A poller's claim on the queue, given up however poll() ends: a claim left behind would keep the
// progress thread aside for good.
class PollerClaim {
 public:
  explicit PollerClaim(FabricShared& shared) : shared_(shared) { shared_.pollers.fetch_add(1); }
  ~PollerClaim() { shared_.pollers.fetch_sub(1); }
  PollerClaim(const PollerClaim&) = delete;
  PollerClaim& operator=(const PollerClaim&) = delete;

 private:
  FabricShared& shared_;
};

}  // namespace

size_t FabricCompletions::poll(std::vector<TransportEvent>& out, nanoseconds timeout) {
  if (size_t n = shared_.events.poll(out, nanoseconds(0)); n > 0) return n;
  // fi_cq_sread waits in whole milliseconds: shorter waits are the event queue's.
  if (timeout < milliseconds(1) || !shared_.endpoint.waitable())
    return shared_.events.poll(out, timeout);
  const auto deadline = Clock::now() + std::min(timeout, kLongestWait);
  {
    PollerClaim claim(shared_);
    if (take_over(deadline)) return read_until(out, deadline);
  }
  // Another poller reads: wait for what it reaps.
  return shared_.events.poll(out, std::max(nanoseconds(0), deadline - Clock::now()));
}

// Takes the reader's role for a poller that announced itself (PollerClaim): from the progress
// thread, which leaves it at the end of its turn (at once if it sleeps in the provider: it is
// woken) and does not take it again while a poller is announced. Not from another poller
// (false): its events are this caller's to wait for. (A poller that comes while another is
// taking the role waits for the other to leave, as the role is not yet marked.) False also at the
// deadline.
bool FabricCompletions::take_over(Clock::time_point deadline) {
  shared_.kick();
  if (shared_.poller_reads.load()) return false;
  if (!shared_.reader.try_lock_until(deadline)) return false;
  shared_.poller_reads.store(true);
  return true;
}

// Reads the queue until an event is there or the deadline, then gives the role back.
size_t FabricCompletions::read_until(std::vector<TransportEvent>& out, Clock::time_point deadline) {
  struct GiveBack {
    FabricShared& shared;
    ~GiveBack() {
      shared.poller_reads.store(false);
      shared.reader.unlock();
    }
  } give_back{shared_};
  // First spin while completions are near (common/spin_window.hpp), where spinning is allowed,
  // then sleep in the provider. A read that leaves posts waiting (the provider refused them for
  // now) does not sleep: the next read may let them go.
  const auto spin_until =
      shared_.may_spin ? std::min(shared_.spin.spin_until(Clock::now()), deadline) : Clock::now();
  SpinYield yield;
  bool waiting = false;
  for (int i = 0;; ++i) {
    // Another caller waiting on the event queue may take what this one reaped: go on then.
    if (!shared_.events.empty())
      if (size_t n = shared_.events.poll(out, nanoseconds(0)); n > 0) return n;
    const auto now = Clock::now();
    if (now >= deadline) return 0;
    if (now < spin_until) {
      waiting = read(0);
      if ((i & 15) == 15) yield(now);
      cpu_relax();
    } else if (waiting) {
      waiting = read(0);
      std::this_thread::yield();
    } else {
      // Rounded up: a wait cut short would return before the deadline.
      const auto left = std::chrono::ceil<milliseconds>(deadline - now);
      waiting = read(static_cast<int>(std::min(left, kLongestRead).count()));
    }
  }
}

// One read of the queue by the poller, sleeping up to `wait_ms` for a completion (0: not at all),
// and what it read handled, here in the caller's thread (a staged region's copy to its device
// included). Returns whether posts still wait for the provider.
bool FabricCompletions::read(int wait_ms) {
  fi_cq_data_entry entries[kBatch];
  ssize_t got = -FI_EAGAIN;
  bool looked = true;
  if (wait_ms > 0) {
    // Sleeping is announced before the last look at the events, so that an event raised by
    // another thread (a control message, a lost peer: FabricShared::raise) is seen here or wakes
    // the read.
    shared_.poller_sleeping.store(true);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    looked = shared_.events.empty();
    if (looked) got = fi_cq_sread(shared_.endpoint.cq(), entries, kBatch, nullptr, wait_ms);
    shared_.poller_sleeping.store(false);
  } else {
    got = fi_cq_read(shared_.endpoint.cq(), entries, kBatch);
  }
  bool waiting;
  {
    std::lock_guard lock(shared_.progress_mutex);
    reap_locked(got, entries);
    shared_.post_waiting_locked();
    waiting = !shared_.waiting.empty() || !shared_.unposted_receives.empty();
  }
  if (looked) shared_.turns.fetch_add(1, std::memory_order_release);
  return waiting;
}

bool FabricCompletions::reap_locked(ssize_t n, fi_cq_data_entry* entries) {
  if (n > 0 || n == -FI_EAVAIL) shared_.spin.completed(FabricShared::Clock::now());
  if (n == -FI_EAVAIL) {
    fi_cq_err_entry error{};
    if (fi_cq_readerr(shared_.endpoint.cq(), &error, 0) == 1) failed_locked(error);
    return true;
  }
  if (n <= 0) return false;
  for (ssize_t i = 0; i < n; ++i) {
    // A peer's write that carried data: no operation of ours (its context is not ours to read).
    if (entries[i].flags & FI_REMOTE_WRITE) {
      if (entries[i].flags & FI_REMOTE_CQ_DATA) data_locked(entries[i].data);
      continue;
    }
    auto* op = static_cast<FabricOp*>(entries[i].op_context);
    if (op->kind == FabricOp::kReceive) {
      message_locked(op->slot, entries[i].len);
      shared_.repost_locked(op->slot);
    } else {
      finish_locked(op, nullptr);
    }
  }
  return true;
}

void FabricCompletions::finish_locked(FabricOp* op, const std::string* error) {
  std::shared_ptr<FabricLink> link = std::move(op->link);
  shared_.in_flight.erase(op);
  link->completed_locked(*op, error);
  delete op;
}

void FabricCompletions::failed_locked(const fi_cq_err_entry& error) {
  // A peer's write that failed here: no operation of ours (its context is not ours to read).
  if (error.flags & FI_REMOTE_WRITE) return;
  char text[256] = "";
  fi_cq_strerror(shared_.endpoint.cq(), error.prov_errno, error.err_data, text, sizeof text);
  auto* op = static_cast<FabricOp*>(error.op_context);
  if (op == nullptr) return;
  if (op->kind == FabricOp::kReceive) {
    // A message that did not fit a receive buffer, from a stranger or a broken peer.
    warn_once(
        fmt::format("a message could not be received: {} ({})", fabric_strerror(error.err), text));
    shared_.repost_locked(op->slot);
    return;
  }
  const std::string message =
      fmt::format("{} failed: {} ({})", op->kind == FabricOp::kWrite ? "an RMA write" : "a message",
                  fabric_strerror(error.err), text);
  finish_locked(op, &message);
}

// A message in receive buffer `slot`: it must come from a connection of ours, with its token.
void FabricCompletions::message_locked(uint32_t slot, uint64_t bytes) {
  const uint8_t* data = shared_.receives.at(slot);
  if (bytes < sizeof(MessageHeader) || bytes > kMessageBytes)
    return warn_once(fmt::format("a message of {} bytes is not one of ours; dropped", bytes));
  MessageHeader h;
  std::memcpy(&h, data, sizeof h);
  std::shared_ptr<FabricLink> link;
  if (auto it = shared_.links.find(h.link); it != shared_.links.end()) link = it->second.lock();
  if (h.magic != kMessageMagic || h.version != kMessageVersion || !link ||
      link->token() != h.token || h.reserved != 0 || h.reserved2 != 0 || (h.flags & ~kNotify) != 0)
    return warn_once(
        fmt::format("a message (magic {:08x}, version {}) for no connection of this endpoint "
                    "(link {}); dropped",
                    h.magic, h.version, h.link));
  link->received_locked(h, bytes - sizeof h);
}

// A notification carried as a write's data (notify_data): for a link of ours, with its mark.
void FabricCompletions::data_locked(uint64_t data) {
  std::shared_ptr<FabricLink> link;
  const auto wire_id = static_cast<uint32_t>(data >> 32);
  if (auto it = shared_.links.find(wire_id); it != shared_.links.end()) link = it->second.lock();
  if (!link || (data & kDataNotify) == 0)
    return warn_once(fmt::format(
        "a write with data {:016x} for no connection of this endpoint; its notification dropped",
        data));
  link->received_data_locked(data);
}

// Strangers' messages are logged at most once a second.
void FabricCompletions::warn_once(const std::string& what) {
  auto now = FabricShared::Clock::now();
  if (now - last_warning_ < std::chrono::seconds(1)) return;
  last_warning_ = now;
  log(LogLevel::warn, "fabric: {}", what);
}

}  // namespace hetmesh::detail
