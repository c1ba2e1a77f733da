// The fabric transport (libfabric): the front the user holds. It opens the provider the options
// name (fabric_endpoint.hpp), registers memory (host memory as it is, device memory the NIC
// cannot reach through a host mirror), connects peers over an out-of-band socket that proves the
// job's secret (one FabricLink each), and hands out the events raised by whoever reads the
// completion queue (fabric_completions.hpp) and by the links' sockets.
//
// Threads: one progress thread per transport (reaps the completion queue, applies the peers'
// messages, posts what had to wait; spins after a completion where SpinPolicy lets it, then
// sleeps in fi_cq_sread; a caller waiting in poll() reads the queue itself meanwhile:
// fabric_completions.hpp), and per connection a thread reading control frames from the socket.
#include "common/transports.hpp"

#include "common/descriptor.hpp"
#include "common/socket_link.hpp"
#include "fabric/fabric_completions.hpp"
#include "fabric/fabric_library.hpp"
#include "fabric/fabric_link.hpp"
#include "fabric/fabric_shared.hpp"

#include <hetmesh/core/hex.hpp>
#include <hetmesh/core/log.hpp>
#include <hetmesh/core/spin.hpp>
#include <hetmesh/core/thread.hpp>

#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <sys/mman.h>

#include <atomic>
#include <thread>

namespace hetmesh::detail {

HostPages::HostPages(uint64_t size, const char* what) : size_(size) {
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED)
    throw Error(HM_ERR_OUT_OF_MEMORY,
                fmt::format("out of memory: {} ({} bytes): {}", what, size, describe_errno(errno)));
  data_ = static_cast<uint8_t*>(p);
}

HostPages::~HostPages() {
  munmap(data_, size_);
}

MessageSlots::MessageSlots(FabricEndpoint& endpoint, uint32_t count, const char* what)
    : count_(count),
      pages_(uint64_t{count} * kMessageBytes, what),
      mr_(endpoint.register_memory(pages_.data(), uint64_t{count} * kMessageBytes, false)) {
  for (uint32_t i = count; i-- > 0;)
    free_.push_back(i);
}

uint32_t MessageSlots::take(std::chrono::milliseconds timeout, const std::string& peer) {
  std::unique_lock lock(mutex_);
  if (!freed_.wait_for(lock, timeout, [&] { return !free_.empty(); }))
    throw Error(HM_ERR_TIMEOUT,
                fmt::format("write to fabric peer {}: all {} message buffers stayed in flight for "
                            "{} ms (the peers stopped taking messages)",
                            peer, count_, timeout.count()));
  uint32_t slot = free_.back();
  free_.pop_back();
  return slot;
}

void MessageSlots::give(uint32_t slot) {
  {
    std::lock_guard lock(mutex_);
    free_.push_back(slot);
  }
  freed_.notify_one();
}

FabricRegion::FabricRegion(std::shared_ptr<FabricShared> shared, uint32_t id, const Device& device,
                           void* base, uint64_t size)
    : Region(device, base, size,
             host_addressable(device, base) ? RegistrationPath::host : RegistrationPath::staging,
             fmt::format("libfabric {}", shared->endpoint.provider())),
      shared_(std::move(shared)),
      id_(id),
      access_(device, base, size) {
  if (path() == RegistrationPath::staging)
    mirror_ = std::make_unique<HostPages>(size, "a fabric region's host mirror");
  host_ = mirror_ ? mirror_->data() : static_cast<uint8_t*>(base);
  mr_ = shared_->endpoint.register_memory(host_, size, true);
}

FabricRegion::~FabricRegion() {
  std::lock_guard lock(shared_->regions_mutex);
  shared_->regions.erase(id_);
}

RegionDescriptor FabricRegion::describe() const {
  nlohmann::json d = region_descriptor("fabric", shared_->id, id_, size());
  d["key"] = mr_->key();
  d["base"] = shared_->endpoint.remote_base(host_);
  d["staged"] = staged();
  return to_bytes(d);
}

FabricShared::FabricShared(const TransportOptions& options)
    : id(new_endpoint_id()),
      io_timeout(options.io_timeout),
      endpoint(options.fabric_provider, options.listen_host, options.fabric_domain),
      sends(endpoint, kSlots, "the fabric transport's send buffers"),
      receives(endpoint, kSlots, "the fabric transport's receive buffers"),
      receive_ops(kSlots),
      spin(options.busy_poll),
      may_spin(options.busy_poll || SpinPolicy::usable_cpus() >= SpinPolicy::kMinCpus) {
  std::lock_guard lock(progress_mutex);
  for (uint32_t slot = 0; slot < kSlots; ++slot) {
    receive_ops[slot].kind = FabricOp::kReceive;
    receive_ops[slot].slot = slot;
    if (int ret = post_receive_locked(slot); ret != 0) {
      endpoint.close_endpoint();  // before the buffers go: no destructor runs for this object
      throw_fabric("fi_recv", ret, endpoint.provider());
    }
  }
}

std::shared_ptr<FabricRegion> FabricShared::region(uint32_t region_id) {
  std::lock_guard lock(regions_mutex);
  auto it = regions.find(region_id);
  return it == regions.end() ? nullptr : it->second.lock();
}

void FabricShared::repost_locked(uint32_t slot) {
  // A receive buffer the provider will not take back is left out (one fewer), said once.
  if (int ret = post_receive_locked(slot); ret != 0)
    log(LogLevel::error, "fabric: a receive buffer could not be posted again ({}): {} left",
        fabric_strerror(-ret), receives.count() - 1);
}

void FabricShared::kick() {
  if (sleeping.load() || poller_sleeping.load()) fi_cq_signal(endpoint.cq());
}

void FabricShared::raise(TransportEvent event) {
  events.push(std::move(event));
  // Against the poller's announcement that it sleeps, then its last look at the events.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (poller_sleeping.load()) fi_cq_signal(endpoint.cq());
}

int FabricShared::post_receive_locked(uint32_t slot) {
  ssize_t ret = fi_recv(endpoint.ep(), receives.at(slot), kMessageBytes, receives.desc(),
                        FI_ADDR_UNSPEC, &receive_ops[slot].context);
  if (ret == -FI_EAGAIN) {
    unposted_receives.push_back(slot);
    return 0;
  }
  return static_cast<int>(ret);
}

void FabricShared::post_waiting_locked() {
  std::vector<uint32_t> again;
  again.swap(unposted_receives);
  for (uint32_t slot : again)
    repost_locked(slot);
  for (auto it = waiting.begin(); it != waiting.end();)
    it = (*it)->post_locked() ? waiting.erase(it) : std::next(it);
}

namespace {

using Clock = std::chrono::steady_clock;

// The progress thread: reads the completion queue unless a poller does (fabric_completions.hpp),
// posts what had to wait, and fails links whose writes stopped completing.
class FabricProgress {
 public:
  FabricProgress(std::shared_ptr<FabricShared> shared, FabricCompletions& completions)
      : shared_(std::move(shared)), completions_(completions) {
    thread_ = start_thread("hm-fabric", [this] { run(); });
  }
  ~FabricProgress() {
    stop_ = true;
    fi_cq_signal(shared_->endpoint.cq());
    thread_.join();
  }

 private:
  static constexpr int kBatch = FabricCompletions::kBatch;
  // While a poller reads the queue, the progress thread looks in this often. A poller that leaves
  // is not waited for (its caller usually polls again at once), so the queue may go unread this
  // long after a poll() returns: a write's completion then waits for the caller's next poll, or
  // for this, bounded.
  static constexpr std::chrono::milliseconds kAside{1};

  void run() {
    fi_cq_data_entry entries[kBatch];
    SpinPolicy policy;  // spins only where the machine has cores to spare
    auto idle_since = Clock::now();
    auto next_check = idle_since;
    bool slept = false;
    while (!stop_) {
      std::unique_lock reader(shared_->reader, std::defer_lock);
      const bool aside = shared_->pollers.load() > 0 || !reader.try_lock();
      bool busy = false, waiting;
      {
        std::lock_guard lock(shared_->progress_mutex);
        if (!aside) {  // else the poller reaps and posts
          busy = completions_.reap_locked(read(entries), entries);
          shared_->post_waiting_locked();
        }
        waiting = !shared_->waiting.empty() || !shared_->unposted_receives.empty();
        if (auto now = Clock::now(); now >= next_check) {
          // A peer whose writes stopped completing (stopped, wedged) fails after io_timeout.
          for (auto& [id, weak] : shared_->links)
            if (auto link = weak.lock()) link->check_stall_locked(now);
          next_check = now + std::chrono::milliseconds(100);
        }
      }
      if (aside) {
        std::this_thread::sleep_for(kAside);
        continue;
      }
      shared_->turns.fetch_add(1, std::memory_order_release);
      const auto now = Clock::now();
      if (busy) {
        policy.record(now - idle_since, !slept);
        idle_since = now;
        slept = false;
        continue;
      }
      if (waiting) {  // the provider refused a post for now: retry after a yield
        reader.unlock();
        std::this_thread::yield();
        continue;
      }
      if (!slept && policy.should_spin() && now - idle_since < SpinPolicy::kSpin) {
        reader.unlock();
        cpu_relax();
        continue;
      }
      slept = true;
      if (!shared_->endpoint.waitable()) {
        reader.unlock();
        std::this_thread::sleep_for(std::chrono::microseconds(50));
        continue;
      }
      // Announced before the last look for a poller, which kicks a sleeper after announcing
      // itself: one of the two sees the other.
      shared_->sleeping.store(true);
      ssize_t n = shared_->pollers.load() > 0
                      ? 0
                      : fi_cq_sread(shared_->endpoint.cq(), entries, kBatch, nullptr, 2);
      shared_->sleeping.store(false);
      if (n > 0 || n == -FI_EAVAIL) {
        std::lock_guard lock(shared_->progress_mutex);
        completions_.reap_locked(n, entries);
        policy.record(Clock::now() - idle_since, false);
        idle_since = Clock::now();
        slept = false;
      }
    }
  }

  ssize_t read(fi_cq_data_entry* entries) {
    return fi_cq_read(shared_->endpoint.cq(), entries, kBatch);
  }

  std::shared_ptr<FabricShared> shared_;
  FabricCompletions& completions_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

class FabricConnection : public Connection {
 public:
  explicit FabricConnection(std::shared_ptr<FabricLink> link)
      : Connection(link->id()), link_(std::move(link)) {}
  ~FabricConnection() override { link_->close(); }
  bool alive() const override { return link_->alive(); }
  std::shared_ptr<RemoteRegion> import_region(const RegionDescriptor& descriptor) override {
    return link_->import_region(descriptor);
  }
  using Connection::write;  // the overload without `more`
  void write(const Region& src, uint64_t src_offset, const RemoteRegion& dst, uint64_t dst_offset,
             uint64_t length, std::optional<uint32_t> notify, uint64_t cookie,
             bool /*more: each notification goes at once*/) override {
    link_->write(src, src_offset, dst, dst_offset, length, notify, cookie);
  }
  void send_control(std::span<const uint8_t> message) override {
    link_->send_control(message, true);
  }
  bool try_send_control(std::span<const uint8_t> message) override {
    return link_->send_control(message, false);
  }

 private:
  std::shared_ptr<FabricLink> link_;
};

class FabricTransport : public Transport {
 public:
  explicit FabricTransport(const TransportOptions& options)
      : shared_(std::make_shared<FabricShared>(options)),
        completions_(*shared_),
        listener_(
            SocketAddress{fmt::format("tcp://{}:{}", options.listen_host, options.listen_port)},
            shared_->id, link_secret(options)) {
    progress_.emplace(shared_, completions_);
  }

  ~FabricTransport() override {
    progress_.reset();
    // Nothing completes any more: fail what is in flight (the peers see the socket end), close
    // the endpoint so that the provider lets go of the operations, and free them. The domain and
    // the registrations stay until the last region goes.
    std::lock_guard lock(shared_->progress_mutex);
    for (auto& [id, weak] : shared_->links)
      if (auto link = weak.lock()) link->fail_locked("the local fabric transport was destroyed");
    shared_->links.clear();
    shared_->waiting.clear();
    shared_->endpoint.close_endpoint();
    for (FabricOp* op : shared_->in_flight)
      delete op;
    shared_->in_flight.clear();
  }

  TransportKind kind() const override { return TransportKind::fabric; }

  EndpointDescriptor endpoint() const override {
    return to_bytes({{"transport", "fabric"},
                     {"endpoint", shared_->id},
                     {"address", listener_.address().text},
                     {"provider", shared_->endpoint.provider()},
                     {"fabric_address", to_hex(shared_->endpoint.address())}});
  }

  std::shared_ptr<Region> register_memory(const Device& device, void* ptr, uint64_t size) override {
    check_registration(device, ptr, size);
    std::lock_guard lock(shared_->regions_mutex);
    uint32_t id = shared_->next_region++;
    auto region = std::make_shared<FabricRegion>(shared_, id, device, ptr, size);
    shared_->regions[id] = region;
    log(LogLevel::debug, "fabric: registered {} bytes of {} as region {} ({})", size,
        device.selector(), id, to_string(region->path()));
    return region;
  }

  std::shared_ptr<Connection> connect(const EndpointDescriptor& peer,
                                      std::chrono::milliseconds timeout) override {
    const auto deadline = Clock::now() + timeout;
    auto d = parse_descriptor(peer, "fabric", "endpoint descriptor");
    auto peer_id = field<std::string>(d, "endpoint", "endpoint descriptor");
    auto address = field<std::string>(d, "address", "endpoint descriptor");
    auto provider = field<std::string>(d, "provider", "endpoint descriptor");
    if (provider != shared_->endpoint.provider())
      throw Error(HM_ERR_INVALID_ARGUMENT,
                  fmt::format("fabric: peer {} uses provider '{}', this endpoint '{}': both ends "
                              "of a job must name the same provider",
                              peer_id, provider, shared_->endpoint.provider()));
    Fd socket = connect_symmetric(listener_, shared_->id, peer_id, SocketAddress{address}, timeout);
    auto link =
        std::make_shared<FabricLink>(next_connection_++, shared_, peer_id, std::move(socket));
    link->setup(deadline);
    link->start();
    return std::make_shared<FabricConnection>(std::move(link));
  }

  size_t poll(std::vector<TransportEvent>& out, std::chrono::nanoseconds timeout) override {
    return completions_.poll(out, timeout);
  }

 private:
  std::shared_ptr<FabricShared> shared_;
  FabricCompletions completions_;
  Listener listener_;
  std::atomic<ConnectionId> next_connection_{1};
  std::optional<FabricProgress> progress_;  // started last, stopped first
};

}  // namespace

std::unique_ptr<Transport> make_fabric_transport(const TransportOptions& options) {
  return std::make_unique<FabricTransport>(options);
}

}  // namespace hetmesh::detail
