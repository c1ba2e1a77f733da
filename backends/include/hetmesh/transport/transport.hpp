// Transports: one interface, four implementations (ipc, tcp, verbs, fabric).
//
// A Transport is this process's endpoint of one kind. It registers memory (returning a Region a
// peer can target), connects to peers symmetrically from their endpoint descriptors (both sides
// call connect() with the other's descriptor), and delivers events: local writes completed,
// notifications of a peer's writes into our regions, small control messages, and lost peers.
//
// Data moves by one-sided writes: write() copies [src_offset, +length) of a local region into a
// peer's region at dst_offset and, optionally, delivers a 32-bit notification that the peer sees
// only after the data is visible there (RDMA WRITE_WITH_IMM semantics). Device memory that the
// transport cannot reach directly is staged through host buffers, on either side.
//
// Ordering: the writes of one connection land at the peer in the order they were issued, so a
// notification implies that every earlier write on that connection is visible too. Notifications
// arrive in issue order. Control messages are ordered among themselves only. Over rails
// (TransportOptions::rails) a notification still implies every earlier write is visible, but the
// writes themselves may land in any order (a stripe on one rail can overtake bytes on another):
// a write must not overlap an earlier one not yet known to have landed (its write_done is not
// enough over tcp, which completes once sent; the peer's answer to its notification is).
//
// Errors: setup calls throw hetmesh::Error. A dead or misbehaving peer becomes a peer_lost event
// (and failed writes) within the transport's timeouts, never a hang or an abort. What a peer sent
// before it went (its last control messages and notifications) is delivered before its
// peer_lost, however the loss was found (by a read, or by a send of ours that failed).
#pragma once

#include <hetmesh/core/device.hpp>
#include <hetmesh/core/job_secret.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

// Exported from the library, which hides every other symbol (core/README.md, "Exports").
#pragma GCC visibility push(default)

namespace hetmesh {

enum class TransportKind { ipc, tcp, verbs, fabric };
const char* to_string(TransportKind kind);
// "ipc", "tcp", "verbs", "fabric"; throws Error(INVALID_ARGUMENT) naming the choices otherwise.
TransportKind parse_transport_kind(const std::string& name);

// How a registered region's bytes are reached by the transport; logged and shown by `hetmesh info`.
enum class RegistrationPath {
  host,        // host memory the transport reads and writes directly
  ipc_handle,  // device memory shared through the plugin's IPC handles
  dmabuf,      // RDMA: the plugin exported a dma-buf, registered with ibv_reg_dmabuf_mr
  peermem,     // RDMA: ibv_reg_mr on device memory through nvidia_peermem
  staging      // device memory copied through host bounce buffers
};
const char* to_string(RegistrationPath path);

struct TransportOptions {
  TransportKind kind = TransportKind::tcp;
  // Address to listen on (tcp, and the verbs out-of-band channel). Port 0 picks a free one.
  std::string listen_host = "127.0.0.1";
  uint16_t listen_port = 0;
  std::chrono::milliseconds connect_timeout{10000};
  // The job's secret, which every connection proves both ways before it carries a byte (the
  // link handshake). Unset: the one the launcher handed this process (HETMESH_JOB_SECRET_FILE),
  // else none, which only a listener on loopback or a unix socket accepts.
  std::optional<JobSecret> secret;
  // tcp: a write or control message whose bytes stop moving for this long (a peer that stopped
  // reading: SIGSTOP, a wedged host; each MiB must go within it) fails, and the peer is reported
  // lost. No send waits without a bound.
  std::chrono::milliseconds io_timeout{10000};
  // verbs: RDMA device ("" = the first active one; the AFD engines also take "auto", the NIC
  // nearest their device), GID index (-1 = the first IPv4-mapped one),
  // the CPU the completion poller is pinned to (-1 = not pinned), and busy polling (verbs and
  // fabric: a caller of poll() spins on the completion queues for its whole timeout; for fabric,
  // a timeout of 1 ms or more, where the provider's queue can be waited on).
  std::string rdma_device;
  int gid_index = -1;
  int poller_cpu = -1;
  bool busy_poll = false;
  // Rails: several NICs of this host, each carrying its own connection to the peer's NIC of the
  // same index: RDMA devices for verbs (in place of rdma_device), local addresses for tcp (in
  // place of listen_host), for fabric either (an address in place of listen_host, any other name
  // in place of fabric_domain). A write of at least 512 KiB is striped over every rail that is up
  // and notifies after every stripe has landed; a smaller one takes the lead rail (the first,
  // until it fails), which also carries every notification and control message (the ordering is
  // weaker: see above; a notification's value is below 2^31). A rail that fails is taken out and
  // its writes go again on the lead; a failed lead hands its notifications and control messages
  // to the next rail up, none lost or doubled; both ends connect a failed rail again after a
  // cooldown; only a connection with no rail left is lost. Empty, or one name: no rails. Both ends
  // name as many. Not for ipc.
  std::vector<std::string> rails;
  // fabric: the libfabric provider ("tcp", "shm", "verbs;ofi_rxm", "efa", ...; "auto" = the
  // first but shm that offers reliable datagrams with messages and RMA writes; shm does not
  // survive a killed peer). Both ends name the same.
  std::string fabric_provider = "auto";
  // fabric: the provider's domain, where it has several (an RDMA device for verbs;ofi_rxm, an EFA
  // device for efa); "" = the first, on listen_host's interface where the provider has addresses.
  std::string fabric_domain;
  // ipc: the staging ring each side creates for the writes no single copy can make (between two
  // plugins' device memories, or memory without IPC): a write goes in slot-sized chunks, the
  // writer filling one slot while the reader empties another. 2..64 slots of 4 KiB..64 MiB. Big
  // slots won on an H200 (docs/benchmarks.md): each chunk costs two stream syncs and a wake-up
  // on top of its copies, more than the overlap of smaller chunks saves.
  uint32_t staging_slots = 4;
  uint64_t staging_slot_bytes = 2 << 20;
};

// Serialised, transport-specific descriptions exchanged through rendezvous.
using EndpointDescriptor = std::vector<uint8_t>;
using RegionDescriptor = std::vector<uint8_t>;

class Region {
 public:
  virtual ~Region() = default;
  const Device& device() const { return device_; }
  void* base() const { return base_; }
  uint64_t size() const { return size_; }
  RegistrationPath path() const { return path_; }
  // Why this path, in words: for verbs, each path tried before it and why it was passed over
  // ("dma-buf unsupported (...); peermem: ... absent; staging through ..."). May be empty.
  const std::string& path_reason() const { return path_reason_; }
  // What a peer passes to Connection::import_region.
  virtual RegionDescriptor describe() const = 0;

 protected:
  Region(Device device, void* base, uint64_t size, RegistrationPath path,
         std::string path_reason = {})
      : device_(std::move(device)),
        base_(base),
        size_(size),
        path_(path),
        path_reason_(std::move(path_reason)) {}

 private:
  Device device_;
  void* base_;
  uint64_t size_;
  RegistrationPath path_;
  std::string path_reason_;
};

// A peer's region, imported on one connection.
class RemoteRegion {
 public:
  virtual ~RemoteRegion() = default;
  uint64_t size() const { return size_; }

 protected:
  explicit RemoteRegion(uint64_t size) : size_(size) {}

 private:
  uint64_t size_;
};

using ConnectionId = uint32_t;

struct TransportEvent {
  enum class Type {
    write_done,    // a local write finished (status OK) or failed; its cookie says which
    notification,  // a peer's write with a notification landed in one of our regions
    control,       // a control message from the peer
    peer_lost      // the peer died, closed, timed out or broke the protocol; message says which
  };
  Type type;
  ConnectionId connection = 0;
  uint64_t cookie = 0;           // write_done
  hm_status status = HM_OK;      // write_done
  uint32_t value = 0;            // notification
  std::string message;           // failures and peer_lost
  std::vector<uint8_t> payload;  // control
};

class Connection {
 public:
  virtual ~Connection() = default;
  ConnectionId id() const { return id_; }
  // False once the peer is lost; writes then throw.
  virtual bool alive() const = 0;
  // Validates and imports a peer's region descriptor. Throws Error on a malformed descriptor or
  // one that belongs to another endpoint.
  virtual std::shared_ptr<RemoteRegion> import_region(const RegionDescriptor& descriptor) = 0;
  // Starts a one-sided write; a write_done event with `cookie` reports its end. Throws Error
  // (INVALID_ARGUMENT) for a range outside either region, or if the peer is lost.
  // `more` (libfabric's FI_MORE): the caller issues another write on this connection right away.
  // The transport may hold this write back (ipc its notification, whose write_done may come
  // first; verbs the whole write, write_done included) until a later write without `more` (from
  // any thread, even one refused) or a control message sent, which delivers every one held, in
  // order; a caller that sets it must follow with one, and not wait for this write before. A
  // hint: a transport may deliver at once.
  virtual void write(const Region& src, uint64_t src_offset, const RemoteRegion& dst,
                     uint64_t dst_offset, uint64_t length, std::optional<uint32_t> notify,
                     uint64_t cookie, bool more) = 0;
  void write(const Region& src, uint64_t src_offset, const RemoteRegion& dst, uint64_t dst_offset,
             uint64_t length, std::optional<uint32_t> notify, uint64_t cookie) {
    write(src, src_offset, dst, dst_offset, length, notify, cookie, false);
  }
  // A small message (at most kMaxControlBytes), delivered in order with other control messages.
  virtual void send_control(std::span<const uint8_t> message) = 0;
  // send_control, unless that would first wait for the connection (another send in progress):
  // then it sends nothing and returns false. For heartbeats, which must never hold up the thread
  // that polls. Throws as send_control does.
  virtual bool try_send_control(std::span<const uint8_t> message) {
    send_control(message);
    return true;
  }
  static constexpr size_t kMaxControlBytes = 64 * 1024;

 protected:
  explicit Connection(ConnectionId id) : id_(id) {}

 private:
  ConnectionId id_;
};

class Transport {
 public:
  // Throws Error if the kind is unusable here (e.g. verbs without an RDMA device), with the reason.
  static std::unique_ptr<Transport> create(const TransportOptions& options);
  virtual ~Transport() = default;

  virtual TransportKind kind() const = 0;
  virtual EndpointDescriptor endpoint() const = 0;
  // Registers [ptr, ptr+size) of memory of `device` (device, pinned or plain host memory). Done at
  // setup; the hot path never registers.
  virtual std::shared_ptr<Region> register_memory(const Device& device, void* ptr,
                                                  uint64_t size) = 0;
  // Connects to the peer described by `peer`; both sides call it. Throws Error(TIMEOUT) if the
  // peer does not show up in time.
  virtual std::shared_ptr<Connection> connect(const EndpointDescriptor& peer,
                                              std::chrono::milliseconds timeout) = 0;
  // Appends pending events to `out`, waiting up to `timeout` for the first. Returns how many.
  virtual size_t poll(std::vector<TransportEvent>& out, std::chrono::nanoseconds timeout) = 0;
};

}  // namespace hetmesh

#pragma GCC visibility pop
