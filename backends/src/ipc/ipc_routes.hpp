// How a write of an ipc connection reaches the peer's memory (ipc_connection.cc describes the
// three routes): the peer's allocations mapped into this process for zero-copy writes, the copy
// engines ("lanes") that write into them, and the route each write takes.
#pragma once

#include "ipc/ipc_shared.hpp"

#include <hetmesh/core/device.hpp>
#include <hetmesh/transport/transport.hpp>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace hetmesh::detail {

// Writes queued on one connection before write() waits for the oldest to retire.
constexpr size_t kMaxInFlight = 256;

// The copy engine of one plugin on one connection. Zero-copy writes into that plugin's peer
// memory are enqueued on `stream`; events[i] marks the end of the write in queue slot i, so an
// event is never re-recorded before its write retired.
struct IpcLane {
  Device device;
  Stream stream;
  std::vector<Event> events;

  explicit IpcLane(const Device& d) : device(d), stream(d.create_stream()) {
    events.reserve(kMaxInFlight);
    for (size_t i = 0; i < kMaxInFlight; ++i)
      events.push_back(d.create_event(HM_EVENT_DISABLE_TIMING));
  }
};

class IpcRemoteRegion final : public RemoteRegion,
                              public std::enable_shared_from_this<IpcRemoteRegion> {
 public:
  IpcRemoteRegion(const void* connection, uint32_t region_id, uint64_t size)
      : RemoteRegion(size), owner(connection), id(region_id) {}
  const void* owner;  // the connection it was imported on
  uint32_t id;
  // Set when writes can go zero-copy: the lane whose device mapped the peer's allocation, where
  // byte 0 of the region lies in this process, and whether host code may write it there.
  IpcLane* lane = nullptr;
  std::optional<IpcMapping> mapping;
  uint8_t* mapped = nullptr;
  bool host_addressable = false;
  // A host-addressable mapping, registered with the plugins of the devices whose copy engines
  // write it. After `mapping`, so the registrations go before the mapping does.
  mutable std::optional<HostRegistrations> registered;
};

// How a write reaches the peer's memory, or that the queued operation is a control message.
enum class IpcRoute : uint8_t {
  host_copy,    // memcpy into the mapped peer memory, by write() or the completion thread
  device_copy,  // memcpy_async on a lane's stream into the mapped peer memory
  ring,         // through the shared ring, landed by the peer
  control       // a control message queued behind pending writes
};

// The lanes of one connection, created on first use, and the routes through them.
class IpcRoutes {
 public:
  IpcRoutes(std::shared_ptr<IpcShared> shared, std::string peer_id)
      : shared_(std::move(shared)), peer_id_(std::move(peer_id)) {}

  // Opens the peer's allocation named by region descriptor `d` for zero-copy writes into
  // `remote`. A handle this process cannot open (no such plugin here, or a plugin that refuses
  // it, as CUDA does within one process) leaves the region on the ring; a descriptor that claims
  // more than the allocation holds is refused.
  void map_peer_memory(IpcRemoteRegion& remote, const nlohmann::json& d);
  // The route of a write from `src` into `dst`, and for device_copy the lane that makes it.
  IpcRoute route_for(const IpcRegion& src, const IpcRemoteRegion& dst, IpcLane** lane);

 private:
  IpcLane* lane_for(const std::string& plugin);
  IpcLane* lane_on(const Device& device);
  IpcLane* writer_lane(const IpcRemoteRegion& dst, const Device& device);

  std::shared_ptr<IpcShared> shared_;
  std::string peer_id_;
  std::mutex lanes_mutex_;
  std::map<std::string, std::unique_ptr<IpcLane>> lanes_;
};

}  // namespace hetmesh::detail
