// A verbs connection's data path: writes become work requests, completions become write_done and
// notification events, and control messages travel as frames on the out-of-band socket.
#include "verbs/verbs_link.hpp"

#include "common/region_cast.hpp"
#include "common/transports.hpp"

#include <hetmesh/core/log.hpp>

#include <fmt/format.h>

#include <arpa/inet.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace hetmesh::detail {

std::shared_ptr<RemoteRegion> VerbsLink::import_region(const RegionDescriptor& descriptor) {
  RegionDescriptorFields d = read_region_descriptor(descriptor, "verbs", peer_id_);
  auto addr = field<uint64_t>(d.document, "addr", kRegionDescriptor);
  if (addr + d.size < addr)
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("region descriptor: [{:#x}, +{}) wraps around", addr, d.size));
  return std::make_shared<VerbsRemoteRegion>(std::move(d.endpoint), d.region, d.size, addr,
                                             field<uint32_t>(d.document, "rkey", kRegionDescriptor),
                                             field<bool>(d.document, "staged", kRegionDescriptor));
}

void VerbsLink::write(const Region& src, uint64_t src_offset, const RemoteRegion& dst,
                      uint64_t dst_offset, uint64_t length, std::optional<uint32_t> notify,
                      uint64_t cookie, bool more) {
  try {
    queue(src, src_offset, dst, dst_offset, length, notify, cookie);
  } catch (...) {
    if (!more) post_held();  // a refused write without `more` still ends the run before it
    throw;
  }
  if (!more) post_held();
}

void VerbsLink::queue(const Region& src, uint64_t src_offset, const RemoteRegion& dst,
                      uint64_t dst_offset, uint64_t length, std::optional<uint32_t> notify,
                      uint64_t cookie) {
  const auto* source = region_cast<const VerbsRegion>(src);
  const auto* target = region_cast<const VerbsRemoteRegion>(dst);
  if (source == nullptr || target == nullptr)
    throw Error(HM_ERR_INVALID_ARGUMENT, "write: regions were not made by the verbs transport");
  if (source->owner() != shared_.get())
    throw Error(HM_ERR_INVALID_ARGUMENT,
                "write: the source region was registered with another verbs transport");
  if (target->endpoint != peer_id_)
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("write: the destination region belongs to endpoint {}, this "
                            "connection's peer is {}",
                            target->endpoint, peer_id_));
  check_write_range("source", src_offset, length, src.size());
  check_write_range("destination", dst_offset, length, dst.size());
  if (!alive_) throw Error(kStatusPeerLost, fmt::format("write: peer {} is lost", peer_id_));

  Registration& registration = source->registration();
  registration.stage_out(src_offset, length);  // staged sources only
  uint64_t local = registration.remote_address() + src_offset;
  uint64_t remote = target->addr + dst_offset;
  uint64_t chunks = length == 0 ? 1 : (length + max_chunk_ - 1) / max_chunk_;
  if (target->staged && length == 0) chunks = 0;  // the SEND alone says it

  std::lock_guard lock(mutex_);
  if (failed_) throw Error(kStatusPeerLost, fmt::format("write: peer {} is lost", peer_id_));
  for (uint64_t i = 0; i < chunks; ++i) {
    uint64_t offset = i * max_chunk_;
    SendOp op{};
    op.cookie = cookie;
    op.last = i + 1 == chunks && !target->staged;
    op.opcode = op.last && notify ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE;
    op.imm = htonl(notify.value_or(0));
    op.local = local + offset;
    op.lkey = registration.lkey();
    op.length = static_cast<uint32_t>(std::min<uint64_t>(max_chunk_, length - offset));
    op.remote = remote + offset;
    op.rkey = target->rkey;
    op.cpu_readable = registration.cpu_readable();
    waiting_.push_back(op);
  }
  if (target->staged) {
    SendOp op{};
    op.cookie = cookie;
    op.last = true;
    op.opcode = IBV_WR_SEND;
    op.message = {kStagedMagic,
                  static_cast<uint8_t>(notify ? kStagedNotify : 0),
                  {},
                  target->id,
                  notify.value_or(0),
                  dst_offset,
                  length};
    waiting_.push_back(op);
  }
}

void VerbsLink::post_held() {
  std::lock_guard lock(mutex_);
  if (!failed_) post_locked();
}

void VerbsLink::send_control(std::span<const uint8_t> message) {
  if (message.size() > Connection::kMaxControlBytes)
    throw Error(HM_ERR_INVALID_ARGUMENT, fmt::format("control message of {} bytes exceeds {}",
                                                     message.size(), Connection::kMaxControlBytes));
  if (!alive_) throw Error(kStatusPeerLost, fmt::format("send_control: peer {} is lost", peer_id_));
  post_held();
  FrameHeader header{kFrameMagic, kFrameVersion, kControl, 0, message.size()};
  try {
    std::lock_guard lock(send_mutex_);
    send_two(socket_.get(), &header, sizeof header, message.data(), message.size(), "control");
  } catch (const Error& e) {
    fail(e.what());
    throw;
  }
}

int VerbsLink::poll(ibv_wc* wcs) {
  int total = 0;
  int n = ibv_poll_cq(send_cq_, kPollBatch, wcs);
  if (n > 0) {
    std::lock_guard lock(mutex_);
    for (int i = 0; i < n; ++i)
      on_send_locked(wcs[i]);
    if (!failed_) post_locked();
    total += n;
  } else if (n < 0) {
    fail("ibv_poll_cq on the send queue failed");
  }
  n = ibv_poll_cq(recv_cq_, kPollBatch, wcs);
  if (n > 0) {
    for (int i = 0; i < n; ++i)
      on_recv(wcs[i], wcs + kPollBatch);
    total += n;
  } else if (n < 0) {
    fail("ibv_poll_cq on the receive queue failed");
  }
  return total;
}

void VerbsLink::arm() {
  ibv_req_notify_cq(send_cq_, 0);
  ibv_req_notify_cq(recv_cq_, 0);
}

bool VerbsLink::finish_staged(const VerbsDelivery& d) {
  try {
    d.region->registration().stage_in(d.offset, d.length);
    return true;
  } catch (const Error& e) {
    fail(fmt::format("copying a staged write into region {} failed: {}", d.region->id(), e.what()));
    return false;
  }
}

bool VerbsLink::closed() {
  std::lock_guard lock(mutex_);
  return closed_;
}

void VerbsLink::done_locked(uint64_t cookie, hm_status status, const std::string& message) {
  TransportEvent done{TransportEvent::Type::write_done, id_};
  done.cookie = cookie;
  done.status = status;
  done.message = message;
  shared_->events.push(std::move(done));
}

void VerbsLink::post_locked() {
  size_t n = std::min<size_t>(send_depth_ - posted_.size(), waiting_.size());
  if (n == 0) return;
  for (size_t i = 0; i < n; ++i) {
    SendOp& op = waiting_[i];
    ibv_send_wr& wr = wrs_[i];
    ibv_sge& sge = sges_[i];
    wr = {};
    wr.wr_id = op.cookie;
    wr.next = i + 1 < n ? &wrs_[i + 1] : nullptr;
    wr.sg_list = &sge;
    wr.opcode = op.opcode;
    wr.send_flags = IBV_SEND_SIGNALED;
    if (op.opcode == IBV_WR_SEND) {
      wr.num_sge = 1;
      if (sizeof op.message <= max_inline_) {
        sge = {reinterpret_cast<uintptr_t>(&op.message), sizeof op.message, 0};
        wr.send_flags |= IBV_SEND_INLINE;
      } else {
        uint8_t* slot = send_slots_.data() + (next_send_slot_++ % send_depth_) * kSlotBytes;
        std::memcpy(slot, &op.message, sizeof op.message);
        sge = {reinterpret_cast<uintptr_t>(slot), sizeof op.message, send_slots_.lkey()};
      }
      continue;
    }
    wr.num_sge = op.length > 0 ? 1 : 0;
    sge = {op.local, op.length, op.lkey};
    if (op.cpu_readable && op.length > 0 && op.length <= max_inline_)
      wr.send_flags |= IBV_SEND_INLINE;
    wr.imm_data = op.imm;
    wr.wr.rdma.remote_addr = op.remote;
    wr.wr.rdma.rkey = op.rkey;
  }
  ibv_send_wr* bad = nullptr;
  int rc = ibv_post_send(qp_, wrs_.data(), &bad);
  size_t posted = rc == 0 ? n : static_cast<size_t>(bad - wrs_.data());
  for (size_t i = 0; i < posted; ++i) {
    posted_.push_back({waiting_.front().cookie, waiting_.front().last});
    waiting_.pop_front();
  }
  if (rc != 0) fail_locked(fmt::format("ibv_post_send failed: {}", std::strerror(rc)));
}

void VerbsLink::on_send_locked(const ibv_wc& wc) {
  if (closed_ || posted_.empty()) return;
  Pending p = posted_.front();
  posted_.pop_front();
  bool ok = wc.status == IBV_WC_SUCCESS;
  if (!ok)
    fail_locked(fmt::format("RDMA write to {} failed: {} (status {}, vendor error {:#x})", peer_id_,
                            ibv_wc_status_str(wc.status), static_cast<int>(wc.status),
                            wc.vendor_err));
  if (p.last)
    done_locked(p.cookie, ok ? HM_OK : kStatusPeerLost,
                ok ? std::string() : fmt::format("write failed: {}", first_error_));
}

void VerbsLink::on_recv(const ibv_wc& wc, ibv_wc* spare) {
  if (wc.status != IBV_WC_SUCCESS) {
    if (wc.status == IBV_WC_WR_FLUSH_ERR) {
      // The QP is in the error state already; the cause (a failed send, say) may still sit in
      // the send CQ, and makes the better message.
      std::lock_guard lock(mutex_);
      if (failed_) return;
      int n = ibv_poll_cq(send_cq_, kPollBatch, spare);
      for (int i = 0; i < n; ++i)
        on_send_locked(spare[i]);
      fail_locked("the queue pair entered the error state (receives flushed)");
      return;
    }
    fail(fmt::format("receive from {} failed: {} (status {}, vendor error {:#x})", peer_id_,
                     ibv_wc_status_str(wc.status), static_cast<int>(wc.status), wc.vendor_err));
    return;
  }
  auto slot = static_cast<uint32_t>(wc.wr_id);
  VerbsDelivery d;
  d.link = shared_from_this();
  if (wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
    d.notify = true;
    d.value = ntohl(wc.imm_data);
  } else if (wc.opcode == IBV_WC_RECV) {
    StagedMessage m{};
    if (wc.byte_len == sizeof m)
      std::memcpy(&m, recv_slots_.data() + size_t{slot} * kSlotBytes, sizeof m);
    if (m.magic != kStagedMagic) {
      fail(fmt::format("protocol error: a {}-byte SEND that is no staged-write message",
                       wc.byte_len));
      return;
    }
    {
      std::lock_guard lock(shared_->regions_mutex);
      auto it = shared_->regions.find(m.region);
      if (it != shared_->regions.end()) d.region = it->second.lock();
    }
    if (!d.region || !d.region->registration().staged() || m.offset > d.region->size() ||
        m.length > d.region->size() - m.offset) {
      fail(
          fmt::format("protocol error: staged write to region {} at [{}, +{}) does not fit a "
                      "staged region here; refused",
                      m.region, m.offset, m.length));
      return;
    }
    d.offset = m.offset;
    d.length = m.length;
    d.notify = (m.flags & kStagedNotify) != 0;
    d.value = m.value;
  } else {
    fail(fmt::format("protocol error: unexpected receive opcode {}", static_cast<int>(wc.opcode)));
    return;
  }
  if (int rc = post_recv(slot); rc != 0) {
    fail(fmt::format("ibv_post_recv failed: {}", std::strerror(rc)));
    return;
  }
  shared_->deliver(std::move(d));
}

void VerbsLink::receive() {
  try {
    for (;;) {
      FrameHeader h;
      recv_all(socket_.get(), &h, sizeof h, "frame header");
      if (h.magic != kFrameMagic || h.version != kFrameVersion)
        throw Error(kStatusProtocolError,
                    fmt::format("bad frame (magic {:08x}, version {})", h.magic, h.version));
      if (h.type != kControl)
        throw Error(kStatusProtocolError, fmt::format("unknown frame type {}", h.type));
      if (h.length > Connection::kMaxControlBytes)
        throw Error(kStatusProtocolError, fmt::format("control message of {} bytes exceeds {}",
                                                      h.length, Connection::kMaxControlBytes));
      TransportEvent control{TransportEvent::Type::control, id_};
      control.payload.resize(h.length);
      recv_all(socket_.get(), control.payload.data(), h.length, "control payload");
      shared_->events.push(std::move(control));
    }
  } catch (const Error& e) {
    if (!closing_) fail(e.what());
  }
}

}  // namespace hetmesh::detail
