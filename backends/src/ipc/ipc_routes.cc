#include "ipc/ipc_routes.hpp"

#include "common/descriptor.hpp"
#include "common/staging.hpp"

#include <hetmesh/core/hex.hpp>
#include <hetmesh/core/log.hpp>
#include <hetmesh/core/plugin.hpp>

#include <fmt/format.h>

namespace hetmesh::detail {

// Zero-copy needs the peer's memory mapped here, and either host code able to reach both sides
// or one copy engine that reaches both: the mapping's plugin's (for its own device memory, on
// the source's device or with peer copy, or for host memory), or, into a host-addressable
// mapping, the source device's. Anything else is staged through the ring.
IpcRoute IpcRoutes::route_for(const IpcRegion& src, const IpcRemoteRegion& dst, IpcLane** lane) {
  if (dst.lane == nullptr) return IpcRoute::ring;
  const bool host_source = src.access().direct();
  if (dst.host_addressable && host_source) return IpcRoute::host_copy;
  const Device& engine = dst.lane->device;
  if (src.device().plugin_ptr() == engine.plugin_ptr()) {
    if (src.device().index() != engine.index() && !engine.has(HM_CAP_PEER_COPY))
      return IpcRoute::ring;
    *lane = dst.lane;
    return IpcRoute::device_copy;
  }
  if (host_source && src.reachable_by(engine)) {  // host memory into the peer's device memory
    *lane = dst.lane;
    return IpcRoute::device_copy;
  }
  if (dst.host_addressable) {  // device memory into the peer's host memory
    *lane = writer_lane(dst, src.device());
    if (*lane != nullptr) return IpcRoute::device_copy;
  }
  return IpcRoute::ring;
}

void IpcRoutes::map_peer_memory(IpcRemoteRegion& remote, const nlohmann::json& d) {
  auto plugin = field<std::string>(d, "plugin", kRegionDescriptor);
  hm_ipc_handle handle{};
  from_hex(field<std::string>(d, "handle", kRegionDescriptor), handle.bytes,
           "region descriptor's 'handle'");
  auto offset = field<uint64_t>(d, "offset", kRegionDescriptor);
  IpcLane* lane = nullptr;
  std::optional<IpcMapping> mapping;
  PointerInfo info;
  try {
    lane = lane_for(plugin);
    if (lane == nullptr) {
      log(LogLevel::info,
          "ipc: no {} device in this process; region {} of peer {} goes through the ring", plugin,
          remote.id, peer_id_);
      return;
    }
    mapping.emplace(lane->device, handle);
    info = lane->device.query(mapping->data());
  } catch (const Error& e) {
    log(LogLevel::info, "ipc: cannot map region {} of peer {} ({}); it goes through the ring",
        remote.id, peer_id_, e.what());
    return;
  }
  // Without the mapping's extent the descriptor's offset and size cannot be checked.
  bool mapped = info.kind == HM_MEM_IPC_MAPPED || info.kind == HM_MEM_IPC_MAPPED_HOST;
  if (!mapped || info.base != mapping->data()) {
    log(LogLevel::warn,
        "ipc: {}: pointer_query does not describe the IPC mapping {} of region {} of peer {}; "
        "the region goes through the ring",
        lane->device.selector(), mapping->data(), remote.id, peer_id_);
    return;
  }
  if (offset > info.size || remote.size() > info.size - offset)
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("region descriptor of region {}: [{}, +{}) overruns the exported "
                            "allocation of {} bytes",
                            remote.id, offset, remote.size(), info.size));
  remote.mapped = static_cast<uint8_t*>(mapping->data()) + offset;
  remote.host_addressable = host_addressable(lane->device, mapping->data());
  if (remote.host_addressable) {
    remote.registered.emplace(mapping->data(), info.size,
                              fmt::format("ipc: region {} of peer {}", remote.id, peer_id_));
    // Registered now with the copy engines that will write into it (IpcConnection says why).
    for (const Device& device : shared_->copy_engine_devices())
      remote.registered->ensure(device);
  }
  remote.mapping.emplace(std::move(*mapping));
  remote.lane = lane;
}

// The lane for `plugin`, created on first use: on the device of a region this process
// registered with that plugin, else on the plugin's device 0. nullptr if this process has no
// such plugin (the ring then carries the writes).
IpcLane* IpcRoutes::lane_for(const std::string& plugin) {
  std::optional<Device> device = shared_->registered_device_of(plugin);
  if (!device) {
    auto loaded = PluginRegistry::load().find(plugin);
    if (!loaded || loaded->device_count() == 0) return nullptr;
    device.emplace(loaded, 0);
  }
  return lane_on(*device);
}

// The lane on `device`, created on first use: one stream per device, so copies by one engine
// land in the order they were issued.
IpcLane* IpcRoutes::lane_on(const Device& device) {
  std::lock_guard lock(lanes_mutex_);
  auto& lane = lanes_[device.selector()];
  if (!lane) lane = std::make_unique<IpcLane>(device);
  return lane.get();
}

// The lane of `device`'s copy engine for writes into `dst`, a host-addressable mapping
// registered with that plugin; nullptr if the plugin refused (the ring then carries them).
IpcLane* IpcRoutes::writer_lane(const IpcRemoteRegion& dst, const Device& device) {
  if (!dst.registered || !dst.registered->ensure(device)) return nullptr;
  return lane_on(device);
}

}  // namespace hetmesh::detail
