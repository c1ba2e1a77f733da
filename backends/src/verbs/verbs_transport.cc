// The verbs transport (rdma-core ibverbs): the front the user holds. It opens the RDMA device,
// registers memory (verbs_memory.hpp: host, dma-buf, peermem or staging), connects peers over an
// out-of-band socket (one VerbsLink, an RC queue pair, each), and hands out the events its
// progress threads (verbs_progress.hpp) raise.
//
// Threads: a completion poller per transport (pinnable, busy or adaptive), a delivery thread for
// staged copies, and per connection a thread reading control frames from the socket.
#include "common/transports.hpp"

#include "common/descriptor.hpp"
#include "common/socket_link.hpp"
#include "verbs/verbs_device.hpp"
#include "verbs/verbs_link.hpp"
#include "verbs/verbs_memory.hpp"
#include "verbs/verbs_progress.hpp"
#include "verbs/verbs_shared.hpp"

#include <hetmesh/core/log.hpp>
#include <hetmesh/core/spin.hpp>

#include <fcntl.h>
#include <sys/eventfd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <optional>
#include <vector>

namespace hetmesh::detail {
namespace {

using Clock = std::chrono::steady_clock;

class VerbsConnection : public Connection {
 public:
  explicit VerbsConnection(std::shared_ptr<VerbsLink> link)
      : Connection(link->id()), link_(std::move(link)) {}
  ~VerbsConnection() override { link_->close(); }
  bool alive() const override { return link_->alive(); }
  std::shared_ptr<RemoteRegion> import_region(const RegionDescriptor& descriptor) override {
    return link_->import_region(descriptor);
  }
  using Connection::write;  // the overload without `more`
  void write(const Region& src, uint64_t src_offset, const RemoteRegion& dst, uint64_t dst_offset,
             uint64_t length, std::optional<uint32_t> notify, uint64_t cookie, bool more) override {
    link_->write(src, src_offset, dst, dst_offset, length, notify, cookie, more);
  }
  void send_control(std::span<const uint8_t> message) override { link_->send_control(message); }

 private:
  std::shared_ptr<VerbsLink> link_;
};

class VerbsTransport : public Transport {
 public:
  explicit VerbsTransport(const TransportOptions& options)
      : shared_(std::make_shared<VerbsShared>(VerbsContext::open(options), options)),
        listener_(
            SocketAddress{fmt::format("tcp://{}:{}", options.listen_host, options.listen_port)},
            shared_->id, link_secret(options)) {
    shared_->channel = ibv_create_comp_channel(shared_->context->context());
    if (shared_->channel == nullptr)
      throw Error(HM_ERR_BACKEND,
                  fmt::format("verbs: ibv_create_comp_channel failed: {}", std::strerror(errno)));
    for (int fd : {shared_->channel->fd, shared_->context->context()->async_fd})
      fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    shared_->wake = Fd(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
    if (!shared_->wake)
      throw Error(HM_ERR_BACKEND, fmt::format("verbs: eventfd: {}", describe_errno(errno)));
    poller_.emplace(shared_);
    delivery_.emplace(shared_);
  }

  ~VerbsTransport() override {
    poller_->stop();
    delivery_->stop();
    std::vector<std::shared_ptr<VerbsLink>> links;
    {
      std::lock_guard lock(shared_->links_mutex);
      links.swap(shared_->links);
    }
    // Connections the user still holds can no longer complete anything: fail them, so the peers
    // see EOF and nothing waits forever.
    for (auto& link : links)
      link->fail("the local verbs transport was destroyed");
    std::lock_guard lock(shared_->delivery_mutex);
    shared_->deliveries.clear();
  }

  TransportKind kind() const override { return TransportKind::verbs; }

  EndpointDescriptor endpoint() const override {
    const VerbsContext& verbs = *shared_->context;
    return to_bytes({{"transport", "verbs"},
                     {"endpoint", shared_->id},
                     {"address", listener_.address().text},
                     {"device", verbs.name()},
                     {"port", verbs.port()},
                     {"link_layer", verbs.ethernet() ? "Ethernet" : "InfiniBand"},
                     {"lid", verbs.lid()},
                     {"gid", gid_text(verbs.gid())}});
  }

  std::shared_ptr<Region> register_memory(const Device& device, void* ptr, uint64_t size) override {
    check_registration(device, ptr, size);
    auto registration = shared_->cache.get(device, ptr, size);
    std::lock_guard lock(shared_->regions_mutex);
    uint32_t id = shared_->next_region++;
    auto region = std::make_shared<VerbsRegion>(shared_, id, device, ptr, size, registration);
    shared_->regions[id] = region;
    log(LogLevel::info, "verbs: registered {} bytes of {} at {} as region {}: path {} ({})", size,
        device.selector(), ptr, id, to_string(region->path()), registration->reason());
    return region;
  }

  std::shared_ptr<Connection> connect(const EndpointDescriptor& peer,
                                      std::chrono::milliseconds timeout) override {
    auto deadline = Clock::now() + timeout;
    auto d = parse_descriptor(peer, "verbs", "endpoint descriptor");
    auto peer_id = field<std::string>(d, "endpoint", "endpoint descriptor");
    auto address = field<std::string>(d, "address", "endpoint descriptor");
    Fd socket = connect_symmetric(listener_, shared_->id, peer_id, SocketAddress{address}, timeout);
    auto link =
        std::make_shared<VerbsLink>(next_connection_++, shared_, peer_id, std::move(socket));
    link->setup(deadline);
    shared_->add_link(link);
    link->start();
    return std::make_shared<VerbsConnection>(std::move(link));
  }

  // Waits for events. While the SpinWindow says completions are near (always when busy-polling),
  // the caller spins polling the completion queues itself, whenever the poller thread is not at
  // them, so that a completion reaches it without the poller's wake-up and its own; the poller
  // stays parked meanwhile. A caller that gives up spinning wakes the poller before it blocks.
  size_t poll(std::vector<TransportEvent>& out, std::chrono::nanoseconds timeout) override {
    const auto start = Clock::now();
    if (timeout.count() > 0 && shared_->events.empty()) {
      const auto spin_until = shared_->spin.spin_until(start);  // time_point::max() when busy
      const auto until = timeout >= spin_until - start ? spin_until : start + timeout;
      if (until > start) {
        ibv_wc wcs[2 * kPollBatch];
        SpinYield yield;
        shared_->callers_polling.fetch_add(1, std::memory_order_relaxed);
        for (int i = 0; shared_->events.empty(); ++i) {
          if (std::unique_lock lock(shared_->progress_mutex, std::try_to_lock); lock)
            shared_->progress_locked(wcs);
          if ((i & 15) == 15) {
            auto now = Clock::now();
            if (now >= until) break;
            yield(now);
          }
          cpu_relax();
        }
        bool last = shared_->callers_polling.fetch_sub(1, std::memory_order_relaxed) == 1;
        if (last && shared_->events.empty()) shared_->unpark_poller();
      }
    }
    const auto left = std::max(std::chrono::nanoseconds(0), timeout - (Clock::now() - start));
    return shared_->events.poll(out, shared_->events.empty() ? left : std::chrono::nanoseconds(0));
  }

 private:
  std::shared_ptr<VerbsShared> shared_;
  Listener listener_;
  std::atomic<ConnectionId> next_connection_{1};
  // Started last (they need the completion channel and the eventfd), stopped first.
  std::optional<CompletionPoller> poller_;
  std::optional<DeliveryThread> delivery_;
};

}  // namespace

std::unique_ptr<Transport> make_verbs_transport(const TransportOptions& options) {
  return std::make_unique<VerbsTransport>(options);
}

}  // namespace hetmesh::detail
