// What the fabric transport's front, its links and its progress thread share: the endpoint, the
// regions, the message buffers, the operations in flight and the events for the poller.
//
// One lock, `progress_mutex`, serialises the fabric calls that post and reap operations (a poster
// posts at once when it can, the progress thread reaps and posts what had to wait) and guards
// every link's operation state. Only the reads of the completion queue run outside it (the
// provider is FI_THREAD_SAFE), so that its reader sleeps in the provider when nothing moves; what
// they return is handled under it.
#pragma once

#include "common/event_queue.hpp"
#include "common/spin_window.hpp"
#include "common/staging.hpp"
#include "fabric/fabric_endpoint.hpp"
#include "fabric/fabric_wire.hpp"

#include <hetmesh/transport/transport.hpp>

#include <rdma/fabric.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <vector>

namespace hetmesh::detail {

class FabricLink;

// Page-aligned anonymous host memory, unmapped on destruction.
class HostPages {
 public:
  explicit HostPages(uint64_t size, const char* what);
  ~HostPages();
  HostPages(const HostPages&) = delete;
  HostPages& operator=(const HostPages&) = delete;
  uint8_t* data() const { return data_; }

 private:
  uint8_t* data_;
  uint64_t size_;
};

// A libfabric operation's context: libfabric hands back the address of `context`, which comes
// first (FI_CONTEXT2 mode).
struct FabricOp {
  fi_context2 context{};
  enum Kind : uint8_t { kWrite, kSend, kReceive } kind = kWrite;
  uint32_t slot = 0;  // kSend, kReceive: the message buffer
  uint64_t seq = 0;   // kWrite, kSend: the user write it belongs to
  std::shared_ptr<FabricLink> link;
  // kWrite: the source region, registered (and its mirror mapped) until the provider is done.
  std::shared_ptr<class FabricRegion> region;
};

// Registered message buffers of kMessageBytes each: the receives posted, or the sends' pool.
class MessageSlots {
 public:
  MessageSlots(FabricEndpoint& endpoint, uint32_t count, const char* what);
  uint8_t* at(uint32_t slot) const { return pages_.data() + uint64_t{slot} * kMessageBytes; }
  void* desc() const { return mr_->desc(); }
  uint32_t count() const { return count_; }
  // Send pool: a free slot, waiting up to `timeout`; throws Error(TIMEOUT) naming `peer`.
  uint32_t take(std::chrono::milliseconds timeout, const std::string& peer);
  void give(uint32_t slot);

 private:
  uint32_t count_;
  HostPages pages_;
  std::unique_ptr<FabricMr> mr_;
  std::mutex mutex_;
  std::condition_variable freed_;
  std::vector<uint32_t> free_;
};

class FabricRegion final : public Region, public std::enable_shared_from_this<FabricRegion> {
 public:
  FabricRegion(std::shared_ptr<struct FabricShared> shared, uint32_t id, const Device& device,
               void* base, uint64_t size);
  ~FabricRegion() override;
  RegionDescriptor describe() const override;

  uint32_t id() const { return id_; }
  const FabricShared* owner() const { return shared_.get(); }
  bool staged() const { return mirror_ != nullptr; }
  // The host bytes the NIC reads and writes: the region itself, or its mirror when staged.
  uint8_t* host() const { return host_; }
  void* desc() const { return mr_->desc(); }
  HostAccess& access() { return access_; }

 private:
  std::shared_ptr<FabricShared> shared_;
  uint32_t id_;
  std::unique_ptr<HostPages> mirror_;  // before access_: its copies drain before the mirror goes
  HostAccess access_;
  uint8_t* host_;
  std::unique_ptr<FabricMr> mr_;
};

class FabricRemoteRegion final : public RemoteRegion {
 public:
  FabricRemoteRegion(std::string exporter, uint32_t region_id, uint64_t size, uint64_t remote_key,
                     uint64_t remote_base, bool behind_mirror)
      : RemoteRegion(size),
        endpoint(std::move(exporter)),
        region(region_id),
        key(remote_key),
        base(remote_base),
        staged(behind_mirror) {}
  std::string endpoint;  // the peer endpoint that exported it: writes go only to that peer
  uint32_t region;
  uint64_t key;
  uint64_t base;  // the remote address of offset 0 (0 where the provider takes offsets)
  bool staged;    // device memory behind a host mirror: each write is followed by a notice
};

struct FabricShared {
  using Clock = std::chrono::steady_clock;

  // Message buffers each way: sends in flight at once, receives posted.
  static constexpr uint32_t kSlots = 256;

  explicit FabricShared(const TransportOptions& options);
  // The endpoint goes before the buffers its posted receives point into.
  ~FabricShared() { endpoint.close_endpoint(); }
  FabricShared(const FabricShared&) = delete;
  FabricShared& operator=(const FabricShared&) = delete;

  std::string id;
  std::chrono::milliseconds io_timeout;
  FabricEndpoint endpoint;
  EventQueue events;

  std::mutex regions_mutex;
  std::map<uint32_t, std::weak_ptr<FabricRegion>> regions;
  uint32_t next_region = 1;
  std::shared_ptr<FabricRegion> region(uint32_t id);

  std::mutex progress_mutex;  // see the file's comment; guards what follows
  std::map<uint32_t, std::weak_ptr<FabricLink>> links;
  std::set<std::shared_ptr<FabricLink>> waiting;  // links with operations not yet posted
  std::set<FabricOp*> in_flight;  // posted, not completed: freed here if never completed
  MessageSlots sends, receives;
  std::vector<FabricOp> receive_ops;
  std::vector<uint32_t> unposted_receives;

  // The completion queue's reads, by either reader (a link that lost its socket lets two more
  // finish, so that what the peer sent before it went is delivered first), and whether the
  // progress thread sleeps in fi_cq_sread.
  std::atomic<uint64_t> turns{0};
  std::atomic<bool> sleeping{false};
  // Who reads the completion queue (fabric_completions.hpp): the holder of `reader`, the progress
  // thread unless a poller took it (`poller_reads`); `pollers` want it (the progress thread steps
  // aside), and whether the poller holding it sleeps in fi_cq_sread.
  std::timed_mutex reader;
  std::atomic<bool> poller_reads{false};
  std::atomic<int> pollers{0};
  std::atomic<bool> poller_sleeping{false};
  // How long a poller that reads the queue spins before it sleeps, and whether it may: with
  // busy_poll, or on a machine with the cores for it (SpinPolicy's rule: on two CPUs a spinning
  // poller halved a stream's bandwidth at 64 KiB over tcp, its CPU the kernel's sockets needed).
  SpinWindow spin;
  const bool may_spin;
  // Wakes whichever thread sleeps in fi_cq_sread: an operation was posted that needs progress.
  void kick();
  // Queues an event for the poller, waking it if it sleeps in fi_cq_sread (the event comes from
  // elsewhere than the completion queue: a control message, a lost peer).
  void raise(TransportEvent event);
  // Posts what is waiting on every link. Caller holds progress_mutex.
  void post_waiting_locked();
  // Posts a receive buffer (again). Caller holds progress_mutex. Returns the provider's error
  // (0, or -FI_EAGAIN: kept for a retry).
  int post_receive_locked(uint32_t slot);
  // post_receive_locked for a buffer that came back; a failure is logged, not thrown (the
  // progress thread's). Caller holds progress_mutex.
  void repost_locked(uint32_t slot);
};

}  // namespace hetmesh::detail
