// The tcp transport: works between any two hosts and for any memory. A write is a framed header
// plus payload on the connection's socket; the receiver checks the header against its region table
// before a byte lands, then copies into the region (through a bounce buffer for device memory the
// host cannot address) and raises the notification.
#include "common/transports.hpp"

#include "common/descriptor.hpp"
#include "common/event_queue.hpp"
#include "common/region_cast.hpp"
#include "common/socket_link.hpp"
#include "common/staging.hpp"

#include <hetmesh/core/log.hpp>
#include <hetmesh/core/thread.hpp>

#include <algorithm>
#include <atomic>
#include <map>

namespace hetmesh::detail {
namespace {

constexpr uint32_t kFrameMagic = 0x50544d48;  // "HMTP"
constexpr uint8_t kFrameVersion = 1;
enum FrameType : uint8_t { kWrite = 1, kWriteNotify = 2, kControl = 3 };

struct FrameHeader {
  uint32_t magic;
  uint8_t version;
  uint8_t type;
  uint16_t reserved;
  uint32_t region;
  uint32_t value;
  uint64_t offset;
  uint64_t length;
};
static_assert(sizeof(FrameHeader) == 32);

class TcpRegion;

// State shared by the transport and its connections' receiver threads.
struct TcpShared {
  std::string id;
  std::chrono::milliseconds io_timeout{10000};  // TransportOptions::io_timeout
  EventQueue events;
  std::mutex regions_mutex;
  std::map<uint32_t, std::weak_ptr<TcpRegion>> regions;
  uint32_t next_region = 1;
};

class TcpRegion final : public Region {
 public:
  TcpRegion(std::shared_ptr<TcpShared> shared, uint32_t id, const Device& device, void* base,
            uint64_t size)
      : Region(device, base, size,
               host_addressable(device, base) ? RegistrationPath::host : RegistrationPath::staging),
        shared_(std::move(shared)),
        id_(id),
        access_(device, base, size) {}
  ~TcpRegion() override {
    std::lock_guard lock(shared_->regions_mutex);
    shared_->regions.erase(id_);
  }
  RegionDescriptor describe() const override {
    return to_bytes(region_descriptor("tcp", shared_->id, id_, size()));
  }
  HostAccess& access() { return access_; }

 private:
  std::shared_ptr<TcpShared> shared_;
  uint32_t id_;
  HostAccess access_;
};

class TcpRemoteRegion final : public RemoteRegion {
 public:
  TcpRemoteRegion(uint32_t region_id, uint64_t size) : RemoteRegion(size), id(region_id) {}
  uint32_t id;
};

class TcpConnection : public Connection {
 public:
  TcpConnection(ConnectionId id, std::shared_ptr<TcpShared> shared, std::string peer_id, Fd socket)
      : Connection(id),
        shared_(std::move(shared)),
        peer_id_(std::move(peer_id)),
        socket_(std::move(socket)) {
    receiver_ = start_thread("hm-tcp-recv", [this] { receive(); });
  }

  ~TcpConnection() override {
    closing_ = true;
    socket_.shutdown();
    receiver_.join();
  }

  bool alive() const override { return alive_; }

  std::shared_ptr<RemoteRegion> import_region(const RegionDescriptor& descriptor) override {
    RegionDescriptorFields d = read_region_descriptor(descriptor, "tcp", peer_id_);
    return std::make_shared<TcpRemoteRegion>(d.region, d.size);
  }

  using Connection::write;  // the overload without `more`
  void write(const Region& src, uint64_t src_offset, const RemoteRegion& dst, uint64_t dst_offset,
             uint64_t length, std::optional<uint32_t> notify, uint64_t cookie,
             bool /*more: each notification goes at once*/) override {
    auto* source = region_cast<TcpRegion>(const_cast<Region&>(src));
    auto* target = region_cast<const TcpRemoteRegion>(dst);
    if (source == nullptr || target == nullptr)
      throw Error(HM_ERR_INVALID_ARGUMENT, "write: regions were not made by this tcp transport");
    check_write_range("source", src_offset, length, src.size());
    check_write_range("destination", dst_offset, length, dst.size());
    if (!alive_) throw Error(kStatusPeerLost, fmt::format("write: peer {} is lost", peer_id_));
    FrameHeader header{kFrameMagic, kFrameVersion, notify ? kWriteNotify : kWrite,
                       0,           target->id,    notify.value_or(0),
                       dst_offset,  length};
    TransportEvent done{TransportEvent::Type::write_done, id()};
    done.cookie = cookie;
    try {
      std::lock_guard lock(send_mutex_);
      if (source->access().direct()) {
        const auto* payload = static_cast<const uint8_t*>(src.base()) + src_offset;
        uint64_t first = std::min<uint64_t>(length, kProgressBytes);
        send_two(socket_.get(), &header, sizeof header, payload, first, "write", deadline());
        send_progressing(payload + first, length - first, "write payload");
      } else {
        send_all(socket_.get(), &header, sizeof header, "write header", deadline());
        source->access().read(src_offset, length, [&](const uint8_t* chunk, uint64_t n) {
          send_progressing(chunk, n, "write payload");
        });
      }
    } catch (const Error& e) {
      done.status = e.status();
      done.message = e.what();
      lose(e.what());
    }
    shared_->events.push(std::move(done));
  }

  bool try_send_control(std::span<const uint8_t> message) override {
    std::unique_lock lock(send_mutex_, std::try_to_lock);
    if (!lock.owns_lock()) return false;  // a write is in progress: the peer is being fed
    send_control_locked(message);
    return true;
  }

  void send_control(std::span<const uint8_t> message) override {
    std::lock_guard lock(send_mutex_);
    send_control_locked(message);
  }

 private:
  // Caller holds send_mutex_.
  void send_control_locked(std::span<const uint8_t> message) {
    if (message.size() > kMaxControlBytes)
      throw Error(HM_ERR_INVALID_ARGUMENT, fmt::format("control message of {} bytes exceeds {}",
                                                       message.size(), kMaxControlBytes));
    if (!alive_)
      throw Error(kStatusPeerLost, fmt::format("send_control: peer {} is lost", peer_id_));
    FrameHeader header{kFrameMagic, kFrameVersion, kControl, 0, 0, 0, 0, message.size()};
    try {
      send_two(socket_.get(), &header, sizeof header, message.data(), message.size(), "control",
               deadline());
    } catch (const Error& e) {
      lose(e.what());
      throw;
    }
  }

  // A send fails when the peer takes no kProgressBytes within io_timeout (it stopped reading),
  // however long the whole write is: a large write to a slow but live peer is not cut off.
  static constexpr uint64_t kProgressBytes = 1 << 20;
  net::Deadline deadline() const { return net::Clock::now() + shared_->io_timeout; }
  void send_progressing(const uint8_t* data, uint64_t size, const char* what) {
    for (uint64_t done = 0; done < size; done += kProgressBytes)
      send_all(socket_.get(), data + done, std::min(kProgressBytes, size - done), what, deadline());
  }

  // Reports the peer lost once, with the first reason.
  void lose(const std::string& reason) {
    if (alive_.exchange(false)) {
      TransportEvent lost{TransportEvent::Type::peer_lost, id()};
      lost.status = kStatusPeerLost;
      lost.message = fmt::format("tcp peer {}: {}", peer_id_, reason);
      shared_->events.push(std::move(lost));
      socket_.shutdown();
    }
  }

  void receive() {
    try {
      for (;;) {
        FrameHeader h;
        recv_all(socket_.get(), &h, sizeof h, "frame header");
        if (h.magic != kFrameMagic || h.version != kFrameVersion)
          throw Error(kStatusProtocolError,
                      fmt::format("bad frame (magic {:08x}, version {})", h.magic, h.version));
        if (h.type == kControl) {
          if (h.length > kMaxControlBytes)
            throw Error(kStatusProtocolError, fmt::format("control message of {} bytes exceeds {}",
                                                          h.length, kMaxControlBytes));
          TransportEvent control{TransportEvent::Type::control, id()};
          control.payload.resize(h.length);
          recv_all(socket_.get(), control.payload.data(), h.length, "control payload");
          shared_->events.push(std::move(control));
        } else if (h.type == kWrite || h.type == kWriteNotify) {
          receive_write(h);
        } else {
          throw Error(kStatusProtocolError, fmt::format("unknown frame type {}", h.type));
        }
      }
    } catch (const Error& e) {
      if (!closing_) lose(e.what());
    }
  }

  void receive_write(const FrameHeader& h) {
    std::shared_ptr<TcpRegion> region;
    {
      std::lock_guard lock(shared_->regions_mutex);
      auto it = shared_->regions.find(h.region);
      if (it != shared_->regions.end()) region = it->second.lock();
    }
    if (!region)
      throw Error(kStatusProtocolError,
                  fmt::format("write to region {}, which is not registered here", h.region));
    if (h.offset > region->size() || h.length > region->size() - h.offset)
      throw Error(kStatusProtocolError,
                  fmt::format("write to region {} at [{}, +{}) is outside its {} bytes; refused",
                              h.region, h.offset, h.length, region->size()));
    region->access().write(h.offset, h.length, [&](uint8_t* chunk, uint64_t n) {
      recv_all(socket_.get(), chunk, n, "write payload");
    });
    if (h.type == kWriteNotify) {
      TransportEvent note{TransportEvent::Type::notification, id()};
      note.value = h.value;
      shared_->events.push(std::move(note));
    }
  }

  std::shared_ptr<TcpShared> shared_;
  std::string peer_id_;
  Fd socket_;
  std::mutex send_mutex_;
  std::atomic<bool> alive_{true};
  std::atomic<bool> closing_{false};
  std::thread receiver_;
};

class TcpTransport : public Transport {
 public:
  explicit TcpTransport(const TransportOptions& options)
      : shared_(std::make_shared<TcpShared>()),
        listener_(
            SocketAddress{fmt::format("tcp://{}:{}", options.listen_host, options.listen_port)},
            (shared_->id = new_endpoint_id()), link_secret(options)) {
    shared_->io_timeout = options.io_timeout;
  }

  TransportKind kind() const override { return TransportKind::tcp; }

  EndpointDescriptor endpoint() const override {
    return to_bytes(
        {{"transport", "tcp"}, {"endpoint", shared_->id}, {"address", listener_.address().text}});
  }

  std::shared_ptr<Region> register_memory(const Device& device, void* ptr, uint64_t size) override {
    check_registration(device, ptr, size);
    std::lock_guard lock(shared_->regions_mutex);
    uint32_t id = shared_->next_region++;
    auto region = std::make_shared<TcpRegion>(shared_, id, device, ptr, size);
    shared_->regions[id] = region;
    log(LogLevel::debug, "tcp: registered {} bytes of {} as region {} ({})", size,
        device.selector(), id, to_string(region->path()));
    return region;
  }

  std::shared_ptr<Connection> connect(const EndpointDescriptor& peer,
                                      std::chrono::milliseconds timeout) override {
    auto d = parse_descriptor(peer, "tcp", "endpoint descriptor");
    auto peer_id = field<std::string>(d, "endpoint", "endpoint descriptor");
    auto address = field<std::string>(d, "address", "endpoint descriptor");
    Fd socket = connect_symmetric(listener_, shared_->id, peer_id, SocketAddress{address}, timeout);
    return std::make_shared<TcpConnection>(next_connection_++, shared_, peer_id, std::move(socket));
  }

  size_t poll(std::vector<TransportEvent>& out, std::chrono::nanoseconds timeout) override {
    return shared_->events.poll(out, timeout);
  }

 private:
  std::shared_ptr<TcpShared> shared_;
  Listener listener_;
  std::atomic<ConnectionId> next_connection_{1};
};

}  // namespace

std::unique_ptr<Transport> make_tcp_transport(const TransportOptions& options) {
  return std::make_unique<TcpTransport>(options);
}

}  // namespace hetmesh::detail
