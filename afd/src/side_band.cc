// Side-band messages: their frames, the outbox and inbox, and the order kept with the data
// (side_band.hpp).
#include "side_band.hpp"

#include "caller_buffers.hpp"
#include "peer.hpp"

#include <hetmesh/core/error.hpp>

#include <fmt/format.h>

#include <cstring>

namespace hetmesh::afd {

namespace {
// Control words are short ASCII ("hb", "leave", "quit"); a message's frame starts with a byte no
// word does.
constexpr uint8_t kMessageTag = 0x01;
// An engine's own frame: a registration of the caller's memory the peer is to write into (the
// number the headers name it by, then its transport descriptor).
constexpr uint8_t kRegionTag = 0x02;
// An F's landing of an A's rows in its receive buffers (micro-batch, layout, then per tensor the
// registration and the offset).
constexpr uint8_t kLandingTag = 0x03;
constexpr size_t kLandingBytes = 1 + 8 + kMaxA2fTensors * 12;

// `count` has reached `wanted`, counting modulo 2^32.
bool reached(uint32_t count, uint32_t wanted) {
  return static_cast<int32_t>(count - wanted) >= 0;
}
}  // namespace

std::vector<uint8_t> message_frame(std::span<const uint8_t> body) {
  std::vector<uint8_t> frame;
  frame.reserve(body.size() + 1);
  frame.push_back(kMessageTag);
  frame.insert(frame.end(), body.begin(), body.end());
  return frame;
}

std::optional<std::span<const uint8_t>> message_body(std::span<const uint8_t> frame) {
  if (frame.empty() || frame[0] != kMessageTag) return std::nullopt;
  return frame.subspan(1);
}

std::vector<uint8_t> region_frame(uint32_t id, const RegionDescriptor& descriptor) {
  std::vector<uint8_t> frame(5 + descriptor.size());
  frame[0] = kRegionTag;
  std::memcpy(frame.data() + 1, &id, sizeof id);
  std::copy(descriptor.begin(), descriptor.end(), frame.begin() + 5);
  return frame;
}

std::optional<RegionFrame> region_of(std::span<const uint8_t> frame) {
  if (frame.size() < 5 || frame[0] != kRegionTag) return std::nullopt;
  RegionFrame region;
  std::memcpy(&region.id, frame.data() + 1, 4);
  region.descriptor.assign(frame.begin() + 5, frame.end());
  return region;
}

std::vector<uint8_t> landing_frame(const LandingFrame& landing) {
  std::vector<uint8_t> frame(kLandingBytes);
  uint8_t* at = frame.data();
  *at++ = kLandingTag;
  auto put = [&at](const auto& value) {
    std::memcpy(at, &value, sizeof value);
    at += sizeof value;
  };
  put(landing.micro_batch);
  put(landing.landing);
  for (int t = 0; t < kMaxA2fTensors; ++t) {
    put(landing.region[static_cast<size_t>(t)]);
    put(landing.offset[static_cast<size_t>(t)]);
  }
  return frame;
}

std::optional<LandingFrame> landing_of(std::span<const uint8_t> frame) {
  if (frame.size() != kLandingBytes || frame[0] != kLandingTag) return std::nullopt;
  LandingFrame landing;
  const uint8_t* at = frame.data() + 1;
  auto get = [&at](auto& value) {
    std::memcpy(&value, at, sizeof value);
    at += sizeof value;
  };
  get(landing.micro_batch);
  get(landing.landing);
  for (int t = 0; t < kMaxA2fTensors; ++t) {
    get(landing.region[static_cast<size_t>(t)]);
    get(landing.offset[static_cast<size_t>(t)]);
  }
  return landing;
}

void PeerRegions::check_id(int peer, uint32_t id) const {
  if (id == 0 || id > CallerBuffers::kMaxRegistrations)
    throw Error(kStatusProtocolError,
                fmt::format("{} announced buffer {} (1..{})", peer_name(peer_role_, peer), id,
                            CallerBuffers::kMaxRegistrations));
}

void PeerRegions::add_locked(int peer, uint32_t id, std::shared_ptr<RemoteRegion> region) {
  check_id(peer, id);
  if (!regions_[static_cast<size_t>(peer)].emplace(id, std::move(region)).second)
    throw Error(kStatusProtocolError,
                fmt::format("{} announced its buffer {} twice", peer_name(peer_role_, peer), id));
}

std::vector<uint32_t> receive_region(PeerRegions& regions, SideBand& side_band, std::mutex& mutex,
                                     int peer, const Link& link, const RegionFrame& frame) {
  regions.check_id(peer, frame.id);
  std::shared_ptr<RemoteRegion> imported = link.connection->import_region(frame.descriptor);
  std::lock_guard lock(mutex);
  regions.add_locked(peer, frame.id, std::move(imported));
  return side_band.counted_locked(peer);
}

std::shared_ptr<RemoteRegion> PeerRegions::find_locked(int peer, uint32_t id) const {
  const auto& regions = regions_[static_cast<size_t>(peer)];
  auto it = regions.find(id);
  return it == regions.end() ? nullptr : it->second;
}

SideBand::SideBand(Role self, int self_rank, Role peer_role, int peers)
    : self_(self),
      self_rank_(self_rank),
      peer_role_(peer_role),
      outbox_(static_cast<size_t>(peers)),
      sent_(static_cast<size_t>(peers), 0),
      received_(static_cast<size_t>(peers), 0),
      held_(static_cast<size_t>(peers)),
      unread_(static_cast<size_t>(peers), 0) {}

void SideBand::queue_locked(int peer, std::span<const uint8_t> body) {
  if (body.size() > kMaxMessageBytes)
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("{}: send_message of {} bytes to {}: the most a message holds is {}",
                            peer_name(self_, self_rank_), body.size(), peer_name(peer_role_, peer),
                            kMaxMessageBytes));
  std::vector<std::vector<uint8_t>> frames;
  frames.push_back(message_frame(body));
  queue_frames_locked(peer, std::move(frames));
}

void SideBand::queue_frames_locked(int peer, std::vector<std::vector<uint8_t>> frames) {
  auto& queue = outbox_[static_cast<size_t>(peer)];
  if (queue.size() + frames.size() > kMaxQueued)
    throw Error(
        HM_ERR_INVALID_ARGUMENT,
        fmt::format("{}: {} messages to {} wait for their sender already (the pushes "
                    "queued before them are not ready yet)",
                    peer_name(self_, self_rank_), queue.size(), peer_name(peer_role_, peer)));
  for (std::vector<uint8_t>& frame : frames)
    queue.push_back(std::move(frame));
}

std::vector<uint8_t> SideBand::take_frame_locked(int peer) {
  auto& queue = outbox_[static_cast<size_t>(peer)];
  if (queue.empty()) return {};  // dropped: the peer was replaced meanwhile
  std::vector<uint8_t> frame = std::move(queue.front());
  queue.pop_front();
  ++sent_[static_cast<size_t>(peer)];
  return frame;
}

bool SideBand::admit_locked(int peer, uint32_t slot, uint32_t messages_before) {
  auto& held = held_[static_cast<size_t>(peer)];
  if (held.empty() && reached(received_[static_cast<size_t>(peer)], messages_before)) return true;
  held.push_back({slot, messages_before});
  return false;
}

std::vector<uint32_t> SideBand::arrived_locked(int peer, std::span<const uint8_t> body) {
  size_t& unread = unread_[static_cast<size_t>(peer)];
  if (unread == kMaxUnread)
    throw Error(kStatusProtocolError,
                fmt::format("{} sent {}: {} of its messages wait for receive_message already, "
                            "the most an engine keeps of one peer",
                            peer_name(peer_role_, peer), peer_name(self_, self_rank_), kMaxUnread));
  ++unread;
  inbox_.push_back(Message{peer_role_, peer, {body.begin(), body.end()}});
  return counted_locked(peer);
}

std::vector<uint32_t> SideBand::counted_locked(int peer) {
  const auto p = static_cast<size_t>(peer);
  ++received_[p];
  std::vector<uint32_t> released;
  while (!held_[p].empty() && reached(received_[p], held_[p].front().messages_before)) {
    released.push_back(held_[p].front().slot);
    held_[p].pop_front();
  }
  return released;
}

std::optional<Message> SideBand::receive_locked() {
  if (inbox_.empty()) return std::nullopt;
  Message message = std::move(inbox_.front());
  inbox_.pop_front();
  --unread_[static_cast<size_t>(message.rank)];
  return message;
}

void SideBand::restart_locked(int peer) {
  const auto p = static_cast<size_t>(peer);
  outbox_[p].clear();
  held_[p].clear();
  sent_[p] = received_[p] = 0;
}

}  // namespace hetmesh::afd
