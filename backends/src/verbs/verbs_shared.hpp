// State of one verbs transport shared by its regions, its connections (links) and its threads:
// the device context, the event queue, the registered regions (which staged writes land in), the
// links the completion poller serves and the queue of the delivery thread.
#pragma once

#include "common/descriptor.hpp"
#include "common/event_queue.hpp"
#include "common/socket_link.hpp"
#include "common/spin_window.hpp"
#include "verbs/verbs_device.hpp"
#include "verbs/verbs_memory.hpp"

#include <hetmesh/core/log.hpp>

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace hetmesh::detail {

class VerbsLink;
class VerbsRegion;

// A receive-side event that must keep its order: a notification, or a staged copy (and maybe a
// notification after it).
struct VerbsDelivery {
  std::shared_ptr<VerbsLink> link;
  std::shared_ptr<VerbsRegion> region;  // staged copy when set
  uint64_t offset = 0;
  uint64_t length = 0;
  bool notify = false;
  uint32_t value = 0;
};

struct VerbsShared {
  VerbsShared(std::shared_ptr<VerbsContext> verbs, const TransportOptions& transport_options)
      : id(new_endpoint_id()),
        context(verbs),
        options(transport_options),
        cache(verbs),
        spin(transport_options.busy_poll) {}
  ~VerbsShared() {
    if (channel != nullptr && ibv_destroy_comp_channel(channel) != 0)
      log(LogLevel::warn, "verbs: ibv_destroy_comp_channel failed: {}", std::strerror(errno));
  }
  VerbsShared(const VerbsShared&) = delete;
  VerbsShared& operator=(const VerbsShared&) = delete;

  void wake_poller() const {
    uint64_t one = 1;
    // Fails only when the counter is saturated, and then the poller is awake anyway.
    [[maybe_unused]] ssize_t n = write(wake.get(), &one, sizeof one);
  }
  void add_link(std::shared_ptr<VerbsLink> link) {
    {
      std::lock_guard lock(links_mutex);
      links.push_back(std::move(link));
      ++links_version;
    }
    wake_poller();
  }
  void remove_link(const VerbsLink* link) {
    {
      std::lock_guard lock(links_mutex);
      std::erase_if(links, [&](const auto& l) { return l.get() == link; });
      ++links_version;
    }
    wake_poller();
  }
  // Raises a notification at once when nothing is queued ahead of it, else queues it (and any
  // staged copy) for the delivery thread (verbs_progress.cc).
  void deliver(VerbsDelivery delivery);

  // Polls every link's completion queues once, handling what it finds; progress_mutex held.
  // Returns how many completions it handled (verbs_progress.cc).
  int progress_locked(ibv_wc* wcs);

  std::string id;
  std::shared_ptr<VerbsContext> context;
  TransportOptions options;
  EventQueue events;
  RegistrationCache cache;
  ibv_comp_channel* channel = nullptr;
  Fd wake;  // eventfd that wakes a blocked poller

  std::mutex regions_mutex;
  std::map<uint32_t, std::weak_ptr<VerbsRegion>> regions;
  uint32_t next_region = 1;

  std::mutex links_mutex;
  std::vector<std::shared_ptr<VerbsLink>> links;  // what the poller serves
  std::atomic<uint64_t> links_version{0};

  // The completion queues are polled by a caller of poll() that spins for its event (so that a
  // completion reaches it without a thread's wake-up), or by the poller thread while no caller
  // does: one at a time, so each link's completions are handled in order.
  std::mutex progress_mutex;
  std::vector<std::shared_ptr<VerbsLink>> progress_links;  // links, as of progress_version
  uint64_t progress_version = ~uint64_t{0};
  SpinWindow spin;  // how long whoever polls them spins after the last completion
  // Callers spinning on the queues: the poller stays parked meanwhile (so one thread spins, not
  // two), looking again every SpinWindow::kMaxSpin in case the callers left for good. A caller
  // that stops spinning to block wakes it at once (unpark_poller).
  std::atomic<int> callers_polling{0};
  std::mutex park_mutex;
  std::condition_variable parked;
  void unpark_poller() {
    std::lock_guard lock(park_mutex);
    parked.notify_one();
  }

  std::mutex delivery_mutex;
  std::condition_variable delivery_ready;
  std::deque<VerbsDelivery> deliveries;
  size_t delivery_pending = 0;  // queued plus the one being executed
  bool delivery_stopping = false;
};

class VerbsRegion final : public Region {
 public:
  VerbsRegion(std::shared_ptr<VerbsShared> shared, uint32_t id, const Device& device, void* base,
              uint64_t size, std::shared_ptr<Registration> registration)
      : Region(device, base, size, registration->path(), registration->reason()),
        shared_(std::move(shared)),
        id_(id),
        registration_(std::move(registration)) {}
  ~VerbsRegion() override {
    std::lock_guard lock(shared_->regions_mutex);
    shared_->regions.erase(id_);
  }
  RegionDescriptor describe() const override {
    nlohmann::json d = region_descriptor("verbs", shared_->id, id_, size());
    d["addr"] = registration_->remote_address();
    d["rkey"] = registration_->rkey();
    d["path"] = to_string(path());
    d["staged"] = registration_->staged();
    return to_bytes(d);
  }
  uint32_t id() const { return id_; }
  const VerbsShared* owner() const { return shared_.get(); }
  Registration& registration() const { return *registration_; }

 private:
  std::shared_ptr<VerbsShared> shared_;
  uint32_t id_;
  std::shared_ptr<Registration> registration_;
};

// A peer's region, as its descriptor said: where to write and with which key.
class VerbsRemoteRegion final : public RemoteRegion {
 public:
  VerbsRemoteRegion(std::string owner, uint32_t region_id, uint64_t size, uint64_t address,
                    uint32_t remote_key, bool is_staged)
      : RemoteRegion(size),
        endpoint(std::move(owner)),
        id(region_id),
        addr(address),
        rkey(remote_key),
        staged(is_staged) {}
  std::string endpoint;
  uint32_t id;
  uint64_t addr;
  uint32_t rkey;
  bool staged;
};

}  // namespace hetmesh::detail
