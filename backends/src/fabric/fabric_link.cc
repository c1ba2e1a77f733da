#include "fabric/fabric_link.hpp"

#include "common/descriptor.hpp"
#include "common/region_cast.hpp"
#include "common/transports.hpp"
#include "fabric/fabric_library.hpp"

#include <hetmesh/core/job_secret.hpp>
#include <hetmesh/core/log.hpp>
#include <hetmesh/core/thread.hpp>

#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#include <algorithm>
#include <cstring>
#include <thread>

namespace hetmesh::detail {
namespace {

uint64_t random_token() {
  uint64_t token = 0;
  random_bytes({reinterpret_cast<uint8_t*>(&token), sizeof token});
  return token;
}

}  // namespace

FabricLink::FabricLink(ConnectionId id, std::shared_ptr<FabricShared> shared, std::string peer_id,
                       Fd socket)
    : id_(id),
      shared_(std::move(shared)),
      peer_id_(std::move(peer_id)),
      socket_(std::move(socket)),
      token_(random_token()) {}

FabricLink::~FabricLink() {
  if (receiver_.joinable()) {
    closing_ = true;
    socket_.shutdown();
    receiver_.join();
  }
}

void FabricLink::setup(Clock::time_point deadline) {
  FabricHello mine{};
  mine.magic = kHelloMagic;
  mine.version = kHelloVersion;
  std::vector<uint8_t> address = shared_->endpoint.address();
  mine.address_length = static_cast<uint16_t>(address.size());
  std::memcpy(mine.address, address.data(), address.size());
  mine.token = token_;
  mine.flags = shared_->endpoint.notify_by_data() ? uint32_t{kTakesNotifyData} : 0;
  {
    // Known before the peer can send: it may write as soon as it has our hello.
    std::lock_guard lock(shared_->progress_mutex);
    do
      random_bytes({reinterpret_cast<uint8_t*>(&wire_id_), sizeof wire_id_});
    while (wire_id_ == 0 || shared_->links.count(wire_id_) > 0);
    shared_->links[wire_id_] = weak_from_this();
  }
  mine.link = wire_id_;
  send_all(socket_.get(), &mine, sizeof mine, "the fabric hello", deadline);
  FabricHello theirs;
  recv_all(socket_.get(), &theirs, sizeof theirs, "the fabric hello", deadline);
  if (theirs.magic != kHelloMagic || theirs.version != kHelloVersion ||
      (theirs.flags & ~uint32_t{kTakesNotifyData}) != 0 || theirs.address_length == 0 ||
      theirs.address_length > kMaxFabricAddress)
    throw Error(kStatusProtocolError,
                fmt::format("fabric peer {}: bad hello (magic {:08x}, version {}, address of {} "
                            "bytes)",
                            peer_id_, theirs.magic, theirs.version, theirs.address_length));
  peer_link_ = theirs.link;
  peer_token_ = theirs.token;
  peer_takes_data_ = (theirs.flags & kTakesNotifyData) != 0;
  std::lock_guard lock(shared_->progress_mutex);
  peer_ = shared_->endpoint.insert(theirs.address, theirs.address_length);
}

void FabricLink::start() {
  receiver_ = start_thread("hm-fabric-ctl", [this] { receive(); });
}

void FabricLink::close() {
  closing_ = true;
  socket_.shutdown();
  if (receiver_.joinable()) receiver_.join();
  std::lock_guard lock(shared_->progress_mutex);
  shared_->links.erase(wire_id_);
  shared_->waiting.erase(shared_from_this());
  if (!failed_) {
    fail_locked("the connection was closed");
  }
}

std::shared_ptr<RemoteRegion> FabricLink::import_region(const RegionDescriptor& descriptor) {
  RegionDescriptorFields d = read_region_descriptor(descriptor, "fabric", peer_id_);
  return std::make_shared<FabricRemoteRegion>(
      d.endpoint, d.region, d.size, field<uint64_t>(d.document, "key", kRegionDescriptor),
      field<uint64_t>(d.document, "base", kRegionDescriptor),
      field<bool>(d.document, "staged", kRegionDescriptor));
}

uint32_t FabricLink::take_send_slot() {
  try {
    return shared_->sends.take(shared_->io_timeout, peer_id_);
  } catch (const Error&) {
    // The buffers may be held by this very peer, stopped: then its stall is the error (the
    // progress thread, late under load, may not have seen it yet). Else another peer holds them.
    std::lock_guard lock(shared_->progress_mutex);
    check_stall_locked(Clock::now());
    if (failed_) throw Error(kStatusPeerLost, fmt::format("write: peer {} is lost", peer_id_));
    throw;
  }
}

FabricOp* FabricLink::new_op(FabricOp::Kind kind, uint64_t seq, uint32_t slot) {
  auto* op = new FabricOp;
  op->kind = kind;
  op->seq = seq;
  op->slot = slot;
  op->link = shared_from_this();
  return op;
}

void FabricLink::write(const Region& src, uint64_t src_offset, const RemoteRegion& dst,
                       uint64_t dst_offset, uint64_t length, std::optional<uint32_t> notify,
                       uint64_t cookie) {
  auto* source = region_cast<FabricRegion>(const_cast<Region&>(src));
  auto* target = region_cast<const FabricRemoteRegion>(dst);
  if (source == nullptr || target == nullptr || source->owner() != shared_.get())
    throw Error(HM_ERR_INVALID_ARGUMENT, "write: regions were not made by this fabric transport");
  if (target->endpoint != peer_id_)
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("write: the destination was imported from endpoint {}, not from this "
                            "connection's peer {}",
                            target->endpoint, peer_id_));
  check_write_range("source", src_offset, length, src.size());
  check_write_range("destination", dst_offset, length, dst.size());
  if (!alive_) throw Error(kStatusPeerLost, fmt::format("write: peer {} is lost", peer_id_));

  // Device memory the NIC cannot read is copied to the region's mirror first.
  const uint8_t* local = source->host() + src_offset;
  if (source->staged() && length > 0)
    source->access().copy_out(src_offset, length, source->host() + src_offset);
  // A notification rides on the last RMA write where the peer takes it so (a staged region's
  // write needs its notice anyway, to copy the bytes in; an empty write has no RMA to carry it),
  // until the link's first notice: the peer's provider reports a write's data when it lands but
  // may hold a message back (no receive posted for it yet: comp_order is not promised), so a
  // notification by data could overtake an earlier notice, and the notification of a later
  // write come before a staged write's bytes reach the device. After one notice, every
  // notification of the link goes as a notice (messages keep their order).
  const bool data_ok = notify && !target->staged && length > 0 && *notify < kDataNotify &&
                       peer_takes_data_ && shared_->endpoint.notify_by_data();
  std::optional<uint32_t> slot;
  std::unique_lock lock(shared_->progress_mutex, std::defer_lock);
  bool by_data;
  for (;;) {
    by_data = data_ok && !notice_sent_.load();
    if (!by_data && (notify || target->staged) && !slot) slot = take_send_slot();
    lock.lock();
    if (!by_data || !notice_sent_.load()) break;
    lock.unlock();  // a notice was queued meanwhile: this one follows it as a notice
  }
  if (failed_) {
    if (slot) shared_->sends.give(*slot);
    throw Error(kStatusPeerLost, fmt::format("write: peer {} is lost", peer_id_));
  }
  if (slot) {
    notice_sent_.store(true);
    auto* header = reinterpret_cast<MessageHeader*>(shared_->sends.at(*slot));
    *header = MessageHeader{kMessageMagic,
                            kMessageVersion,
                            kNotice,
                            static_cast<uint8_t>(notify ? kNotify : 0),
                            0,
                            peer_link_,
                            target->region,
                            peer_token_,
                            dst_offset,
                            length,
                            notify.value_or(0),
                            0};
  }
  const uint64_t seq = next_seq_++;
  Pending pending{seq, cookie, 0};
  const uint64_t most = shared_->endpoint.max_message();
  for (uint64_t done = 0; done < length; done += most, ++pending.ops) {
    const uint64_t n = std::min(most, length - done);
    FabricOp* op = new_op(FabricOp::kWrite, seq);
    op->region = source->shared_from_this();
    queue_.push_back(
        Post{op, local + done, source->desc(), n, target->base + dst_offset + done, target->key});
  }
  if (by_data) queue_.back().data = notify_data(peer_link_, *notify);
  if (slot) {
    queue_.push_back(
        Post{new_op(FabricOp::kSend, seq, *slot), nullptr, nullptr, sizeof(MessageHeader)});
    ++pending.ops;
  }
  if (pending_.empty()) progress_at_ = Clock::now();
  pending_.push_back(pending);
  retire_locked();  // an empty write without a notification is done at once
  if (!post_locked()) shared_->waiting.insert(shared_from_this());
  shared_->kick();
}

bool FabricLink::post_locked() {
  FabricEndpoint& endpoint = shared_->endpoint;
  while (!queue_.empty() && !failed_) {
    Post& post = queue_.front();
    const bool rma = post.op->kind == FabricOp::kWrite;
    // Unordered provider: wait for the writes in flight to be delivered, unless this is another
    // piece of the same user write (its pieces do not overlap). Their completion posts it
    // (completed_locked), so the progress thread has nothing to retry meanwhile.
    if (!endpoint.ordered() && writes_in_flight_ > 0 && !(rma && post.op->seq == writing_))
      return true;
    ssize_t ret;
    if (rma) {
      iovec iov{const_cast<uint8_t*>(post.local), post.bytes};
      fi_rma_iov remote{post.remote, post.bytes, post.key};
      fi_msg_rma msg{};
      msg.msg_iov = &iov;
      msg.desc = &post.desc;
      msg.iov_count = 1;
      msg.addr = peer_;
      msg.rma_iov = &remote;
      msg.rma_iov_count = 1;
      msg.context = &post.op->context;
      msg.data = post.data.value_or(0);
      // Unordered, what follows waits for these writes' completions, which must then mean the
      // bytes are in the peer's memory.
      const uint64_t flags = FI_COMPLETION | (endpoint.ordered() ? 0 : FI_DELIVERY_COMPLETE) |
                             (post.data ? FI_REMOTE_CQ_DATA : 0);
      ret = fi_writemsg(endpoint.ep(), &msg, flags);
    } else {
      ret = fi_send(endpoint.ep(), shared_->sends.at(post.op->slot), post.bytes,
                    shared_->sends.desc(), peer_, &post.op->context);
    }
    if (ret == -FI_EAGAIN) return false;
    if (ret != 0) {
      fail_locked(fmt::format("posting {} failed: {}", rma ? "an RMA write" : "a message",
                              fabric_strerror(static_cast<int>(-ret))));
      return true;
    }
    shared_->in_flight.insert(post.op);
    if (rma) {
      ++writes_in_flight_;
      writing_ = post.op->seq;
    }
    queue_.pop_front();
  }
  return true;
}

void FabricLink::completed_locked(FabricOp& op, const std::string* error) {
  if (op.kind == FabricOp::kSend) shared_->sends.give(op.slot);
  if (op.kind == FabricOp::kWrite) --writes_in_flight_;
  if (error != nullptr) return fail_locked(*error);
  if (failed_) return;
  progress_at_ = Clock::now();
  for (Pending& p : pending_)
    if (p.seq == op.seq) {
      --p.ops;
      break;
    }
  retire_locked();
  if (!queue_.empty() && !post_locked()) shared_->waiting.insert(shared_from_this());
}

void FabricLink::retire_locked() {
  while (!pending_.empty() && pending_.front().ops == 0) {
    TransportEvent done{TransportEvent::Type::write_done, id_};
    done.cookie = pending_.front().cookie;
    shared_->raise(std::move(done));
    pending_.pop_front();
  }
}

void FabricLink::received_locked(const MessageHeader& h, uint64_t bytes) {
  if (failed_) return;
  try {
    std::shared_ptr<FabricRegion> region = shared_->region(h.region);
    if (!region)
      throw Error(kStatusProtocolError,
                  fmt::format("write to region {}, which is not registered here", h.region));
    if (h.offset > region->size() || h.length > region->size() - h.offset)
      throw Error(kStatusProtocolError,
                  fmt::format("write to region {} at [{}, +{}) is outside its {} bytes; refused",
                              h.region, h.offset, h.length, region->size()));
    if (h.type != kNotice || bytes != 0)
      throw Error(
          kStatusProtocolError,
          fmt::format("a message of type {} with {} bytes after its header", h.type, bytes));
    if (region->staged()) region->access().copy_in(h.offset, region->host() + h.offset, h.length);
  } catch (const Error& e) {
    return fail_locked(e.what());
  }
  if (h.flags & kNotify) {
    TransportEvent note{TransportEvent::Type::notification, id_};
    note.value = h.value;
    shared_->raise(std::move(note));
  }
}

void FabricLink::received_data_locked(uint64_t data) {
  if (failed_) return;
  TransportEvent note{TransportEvent::Type::notification, id_};
  note.value = static_cast<uint32_t>(data & (kDataNotify - 1));
  shared_->raise(std::move(note));
}

void FabricLink::check_stall_locked(Clock::time_point now) {
  if (failed_ || pending_.empty() || now - progress_at_ < shared_->io_timeout) return;
  fail_locked(fmt::format("no write completed for {} ms with {} pending: the peer stopped taking "
                          "them (stopped or wedged)",
                          shared_->io_timeout.count(), pending_.size()),
              HM_ERR_TIMEOUT);
}

void FabricLink::fail_locked(const std::string& reason, hm_status status) {
  if (failed_) return;
  failed_ = true;
  alive_ = false;
  const std::string message = fmt::format("fabric peer {}: {}", peer_id_, reason);
  for (Post& post : queue_) {
    if (post.op->kind == FabricOp::kSend) shared_->sends.give(post.op->slot);
    delete post.op;
  }
  queue_.clear();
  for (const Pending& p : pending_) {
    TransportEvent done{TransportEvent::Type::write_done, id_};
    done.cookie = p.cookie;
    done.status = status;
    done.message = message;
    shared_->raise(std::move(done));
  }
  pending_.clear();
  if (!closing_) {
    TransportEvent lost{TransportEvent::Type::peer_lost, id_};
    lost.status = kStatusPeerLost;
    lost.message = message;
    shared_->raise(std::move(lost));
  }
  socket_.shutdown();
}

bool FabricLink::send_control(std::span<const uint8_t> message, bool wait) {
  if (message.size() > Connection::kMaxControlBytes)
    throw Error(HM_ERR_INVALID_ARGUMENT, fmt::format("control message of {} bytes exceeds {}",
                                                     message.size(), Connection::kMaxControlBytes));
  std::unique_lock lock(send_mutex_, std::defer_lock);
  if (wait)
    lock.lock();
  else if (!lock.try_lock())
    return false;
  if (!alive_) throw Error(kStatusPeerLost, fmt::format("send_control: peer {} is lost", peer_id_));
  ControlFrame frame{kControlMagic, static_cast<uint32_t>(message.size())};
  try {
    send_two(socket_.get(), &frame, sizeof frame, message.data(), message.size(), "control",
             net::Clock::now() + shared_->io_timeout);
  } catch (const Error& e) {
    lock.unlock();
    lose(e.what());
    throw;
  }
  return true;
}

void FabricLink::receive() {
  try {
    for (;;) {
      ControlFrame frame;
      recv_all(socket_.get(), &frame, sizeof frame, "control frame");
      if (frame.magic != kControlMagic || frame.length > Connection::kMaxControlBytes)
        throw Error(kStatusProtocolError, fmt::format("bad control frame (magic {:08x}, {} bytes)",
                                                      frame.magic, frame.length));
      TransportEvent control{TransportEvent::Type::control, id_};
      control.payload.resize(frame.length);
      recv_all(socket_.get(), control.payload.data(), frame.length, "control payload");
      shared_->raise(std::move(control));
    }
  } catch (const Error& e) {
    if (!closing_) lose(e.what());
  }
}

void FabricLink::lose(const std::string& reason) {
  // What the peer sent on the fabric before its socket ended is delivered before its loss: the
  // completion queue's reader (the progress thread, or a caller of poll()) finishes two more
  // reads (a bounded wait: one comes at least every few ms).
  const uint64_t turn = shared_->turns.load();
  const auto until = Clock::now() + std::chrono::milliseconds(200);
  while (shared_->turns.load() < turn + 2 && Clock::now() < until) {
    shared_->kick();
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  std::lock_guard lock(shared_->progress_mutex);
  fail_locked(reason);
}

}  // namespace hetmesh::detail
