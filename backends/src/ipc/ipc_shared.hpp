// State of one ipc transport shared by its connections and their threads: the event queue, the
// registered regions (which incoming ring chunks land in) and the connections' links (which the
// polling thread reads).
#pragma once

#include "common/event_queue.hpp"
#include "common/staging.hpp"

#include <hetmesh/transport/transport.hpp>

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace hetmesh::detail {

class IpcLink;
class IpcRegion;

// How a region can be shared: the IPC handle of its allocation and where it starts in it.
struct IpcExport {
  std::string plugin;
  std::string handle;
  uint64_t offset;
};

struct IpcShared {
  std::string id;
  std::string host;
  EventQueue events;

  std::mutex regions_mutex;
  std::map<uint32_t, std::weak_ptr<IpcRegion>> regions;
  uint32_t next_region = 1;

  // The links of live connections, which poll() reads.
  std::mutex links_mutex;
  std::vector<std::shared_ptr<IpcLink>> links;

  std::shared_ptr<IpcRegion> find_region(uint32_t id);
  // A device of `plugin` this process already uses (from a registered region), so zero-copy
  // writes run on the device that holds the sources; nullopt if none.
  std::optional<Device> registered_device_of(const std::string& plugin);
  // The devices of the regions registered so far that the host cannot address (their copies run
  // on the device's copy engine), one per plugin.
  std::vector<Device> copy_engine_devices();
  void add_link(std::shared_ptr<IpcLink> link);
  void remove_link(const IpcLink* link);
};

class IpcRegion final : public Region, public std::enable_shared_from_this<IpcRegion> {
 public:
  IpcRegion(std::shared_ptr<IpcShared> shared, uint32_t id, const Device& device, void* base,
            uint64_t size, std::optional<IpcExport> exported);
  ~IpcRegion() override;
  RegionDescriptor describe() const override { return descriptor_; }
  // The ring path's way in and out; HostAccess serialises its own users.
  HostAccess& access() const { return access_; }
  // Whether the copy engine of `engine`'s plugin may read this region, which is host memory
  // (access().direct()): registered with that plugin on first use and while the region lives,
  // where the plugin registers host memory; as it is where it does not (its engine reads plain
  // host memory, HM-R25). False if the registration was refused (logged once).
  bool reachable_by(const Device& engine) const;

 private:
  std::shared_ptr<IpcShared> shared_;
  uint32_t id_;
  RegionDescriptor descriptor_;
  mutable HostAccess access_;
  mutable HostRegistrations registered_;
};

}  // namespace hetmesh::detail
