// C++ handles over one plugin device: RAII for memory, streams and events. Every failed call
// throws hetmesh::Error naming the plugin, the operation and the plugin's message; destructors
// never throw (they log).
#pragma once

#include <hetmesh/core/plugin.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

// Exported from the library, which hides every other symbol (core/README.md, "Exports").
#pragma GCC visibility push(default)

namespace hetmesh {

class Buffer;
class Stream;
class Event;

using Timeout = std::chrono::nanoseconds;
constexpr Timeout kForever = Timeout::max();

enum class MemoryKind : int32_t { device = HM_MEM_DEVICE, pinned_host = HM_MEM_PINNED_HOST };

struct PointerInfo {
  hm_memory_kind kind = HM_MEM_UNKNOWN;
  int32_t device = -1;
  void* base = nullptr;
  uint64_t size = 0;
};

// Names of capability bits, for reports: "device_memory|ipc|...".
std::string capability_names(hm_capabilities caps);

class Device {
 public:
  Device(std::shared_ptr<Plugin> plugin, int32_t index);

  const Plugin& plugin() const { return *plugin_; }
  const std::shared_ptr<Plugin>& plugin_ptr() const { return plugin_; }
  const hm_device_plugin_api& api() const { return plugin_->api(); }
  int32_t index() const { return index_; }
  std::string selector() const;  // "cpu:0"
  const hm_device_properties& properties() const { return properties_; }
  bool has(hm_capabilities caps) const { return (properties_.capabilities & caps) == caps; }

  // A failure names the device, the size and the kind before the plugin's own words:
  // "cpu:0: cannot allocate 8.0 MiB (8388608 bytes) of device memory: cpu: mem_alloc failed
  // (HM_ERR_OUT_OF_MEMORY): ...", with the plugin's status.
  Buffer allocate(uint64_t size, MemoryKind kind = MemoryKind::device) const;
  Stream create_stream(uint32_t flags = HM_STREAM_NON_BLOCKING) const;
  // Takes charge of a stream of this device that a plugin's extension made (e.g. cuda's
  // stream_borrow): stream_destroy when the Stream goes.
  Stream adopt_stream(hm_stream stream) const;
  Event create_event(uint32_t flags = HM_EVENT_DEFAULT) const;
  PointerInfo query(const void* ptr) const;

  bool operator==(const Device& other) const {
    return plugin_ == other.plugin_ && index_ == other.index_;
  }

 private:
  std::shared_ptr<Plugin> plugin_;
  int32_t index_;
  hm_device_properties properties_{};
};

// Base of the move-only handles: the device plus a raw plugin handle.
template <typename Handle>
class DeviceHandle {
 public:
  const Device& device() const { return *device_; }
  Handle native() const { return handle_; }
  explicit operator bool() const { return handle_ != Handle{}; }

 protected:
  DeviceHandle() = default;
  DeviceHandle(Device device, Handle handle) : device_(std::move(device)), handle_(handle) {}
  DeviceHandle(DeviceHandle&& other) noexcept
      : device_(std::move(other.device_)), handle_(std::exchange(other.handle_, Handle{})) {}
  Handle release() { return std::exchange(handle_, Handle{}); }

  std::optional<Device> device_;
  Handle handle_{};
};

// Memory from mem_alloc, freed on destruction.
class Buffer : public DeviceHandle<void*> {
 public:
  Buffer() = default;
  Buffer(Buffer&&) noexcept = default;
  Buffer& operator=(Buffer&& other) noexcept;
  ~Buffer() { reset(); }

  void* data() const { return handle_; }
  uint64_t size() const { return size_; }
  MemoryKind kind() const { return kind_; }
  void reset();

 private:
  friend class Device;
  Buffer(Device device, void* ptr, uint64_t size, MemoryKind kind)
      : DeviceHandle(std::move(device), ptr), size_(size), kind_(kind) {}
  uint64_t size_ = 0;
  MemoryKind kind_ = MemoryKind::device;
};

class Stream : public DeviceHandle<hm_stream> {
 public:
  Stream() = default;
  Stream(Stream&&) noexcept = default;
  Stream& operator=(Stream&& other) noexcept;
  ~Stream() { reset(); }

  void copy(void* dst, const void* src, uint64_t size) const;
  void fill(void* dst, uint8_t value, uint64_t size) const;
  // Throws Error(HM_ERR_TIMEOUT) when the work is not done in time.
  void synchronize(Timeout timeout = kForever) const;
  bool ready() const;
  void wait(const Event& event) const;
  void write_value32(void* address, uint32_t value) const;
  void wait_value32(const void* address, uint32_t value, hm_wait_condition condition) const;
  void add_callback(hm_host_fn fn, void* user_data) const;
  void reset();

 private:
  friend class Device;
  using DeviceHandle::DeviceHandle;
};

class Event : public DeviceHandle<hm_event> {
 public:
  Event() = default;
  Event(Event&&) noexcept = default;
  Event& operator=(Event&& other) noexcept;
  ~Event() { reset(); }

  void record(const Stream& stream) const;
  bool ready() const;
  void synchronize(Timeout timeout = kForever) const;
  // Milliseconds from `start` to this event; both must have completed.
  float elapsed_ms_since(const Event& start) const;
  void reset();

 private:
  friend class Device;
  using DeviceHandle::DeviceHandle;
};

// Zeroed host memory for a device's copies: the plugin's pinned memory where it has any
// (HM_CAP_PINNED_HOST_MEMORY; stream memory operations and full-speed copies need it), plain
// host memory otherwise (its copy engine still reaches that, HM-R25). Either that cannot be had is
// an Error naming the device, the size and the kind (HM_ERR_OUT_OF_MEMORY for plain memory).
class HostBuffer {
 public:
  HostBuffer(const Device& device, uint64_t bytes);
  uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  bool pinned() const { return static_cast<bool>(pinned_); }

 private:
  Buffer pinned_;
  std::vector<uint8_t> plain_;
  uint8_t* data_;
  uint64_t size_;
};

// A peer process's allocation opened with ipc_open, closed on destruction.
class IpcMapping : public DeviceHandle<void*> {
 public:
  IpcMapping() = default;
  IpcMapping(const Device& device, const hm_ipc_handle& handle);
  IpcMapping(IpcMapping&&) noexcept = default;
  ~IpcMapping() { reset(); }
  void* data() const { return handle_; }
  void reset();
};

hm_ipc_handle ipc_export(const Device& device, void* ptr);

// Host memory page-locked with a device's plugin (host_register, HM_CAP_HOST_REGISTER), so its
// copy engine reaches it at full speed; unregistered on destruction. The memory stays mapped
// until then.
class HostRegistration : public DeviceHandle<void*> {
 public:
  HostRegistration(const Device& device, void* ptr, uint64_t size);
  HostRegistration(HostRegistration&&) noexcept = default;
  ~HostRegistration() { reset(); }
  void* data() const { return handle_; }
  void reset();
};

// An exported dma-buf, released on destruction.
class DmaBuf {
 public:
  DmaBuf(const Device& device, const void* ptr, uint64_t size);
  DmaBuf(DmaBuf&& other) noexcept;
  DmaBuf(const DmaBuf&) = delete;
  ~DmaBuf();
  const hm_dmabuf& get() const { return dmabuf_; }

 private:
  std::optional<Device> device_;
  hm_dmabuf dmabuf_{};
};

}  // namespace hetmesh

#pragma GCC visibility pop
