#include <hetmesh/core/device.hpp>
#include <hetmesh/core/log.hpp>

#include <fmt/format.h>

#include <cstring>
#include <exception>
#include <iterator>

#include <unistd.h>

namespace hetmesh {
namespace {

uint64_t to_ns(Timeout timeout) {
  return timeout == kForever || timeout.count() < 0 ? HM_TIMEOUT_INFINITE
                                                    : static_cast<uint64_t>(timeout.count());
}

// Calls an optional slot, turning a NULL slot into HM_ERR_NOT_SUPPORTED.
template <typename Fn, typename... Args>
void call(const Device& device, Fn* slot, const char* name, Args... args) {
  if (slot == nullptr)
    throw Error(HM_ERR_NOT_SUPPORTED,
                fmt::format("{}: {} is not provided by this plugin", device.plugin().name(), name));
  device.plugin().check(slot(args...), name);
}

// Status of a slot whose NOT_READY / TIMEOUT answer is an outcome, not a failure.
template <typename Fn, typename... Args>
hm_status query(const Device& device, Fn* slot, const char* name, Args... args) {
  hm_status status = slot(args...);
  if (status != HM_OK && status != HM_ERR_NOT_READY) device.plugin().raise(status, name);
  return status;
}

// "8.0 MiB (8388608 bytes)": the size an allocation's failure names.
std::string describe_size(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) return fmt::format("{} bytes", bytes);
  double scaled = static_cast<double>(bytes) / 1024;
  size_t unit = 0;
  for (; scaled >= 1024 && unit + 1 < std::size(kUnits); ++unit)
    scaled /= 1024;
  return fmt::format("{:.1f} {} ({} bytes)", scaled, kUnits[unit], bytes);
}

const char* memory_name(MemoryKind kind) {
  return kind == MemoryKind::pinned_host ? "pinned host memory" : "device memory";
}

// Destructors log instead of throwing.
template <typename Fn, typename... Args>
void release_quietly(const Device& device, Fn* slot, const char* name, Args... args) {
  if (slot == nullptr) return;
  hm_status status = slot(args...);
  if (status != HM_OK)
    log(LogLevel::error, "{}: {} failed during cleanup ({}): {}", device.selector(), name,
        status_name(status), device.api().last_error());
}

}  // namespace

std::string capability_names(hm_capabilities caps) {
  static constexpr std::pair<hm_capabilities, const char*> kNames[] = {
      {HM_CAP_DEVICE_MEMORY, "device_memory"},
      {HM_CAP_PINNED_HOST_MEMORY, "pinned_host_memory"},
      {HM_CAP_HOST_REGISTER, "host_register"},
      {HM_CAP_IPC, "ipc"},
      {HM_CAP_DMABUF_EXPORT, "dmabuf_export"},
      {HM_CAP_STREAM_MEMOPS, "stream_memops"},
      {HM_CAP_HOST_CALLBACK, "host_callback"},
      {HM_CAP_EVENT_TIMING, "event_timing"},
      {HM_CAP_HOST_ADDRESSABLE_DEVICE_MEMORY, "host_addressable_device_memory"},
      {HM_CAP_PEER_COPY, "peer_copy"}};
  std::string names;
  for (auto [bit, name] : kNames) {
    if ((caps & bit) == 0) continue;
    if (!names.empty()) names += '|';
    names += name;
    caps &= ~bit;
  }
  if (caps != 0) names += fmt::format("{}unknown:0x{:x}", names.empty() ? "" : "|", caps);
  return names.empty() ? "none" : names;
}

Device::Device(std::shared_ptr<Plugin> plugin, int32_t index)
    : plugin_(std::move(plugin)), index_(index) {
  if (index_ < 0 || index_ >= plugin_->device_count())
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("{}: device {} does not exist ({} devices)", plugin_->name(), index_,
                            plugin_->device_count()));
  properties_.struct_size = sizeof properties_;
  plugin_->check(api().device_properties(index_, &properties_), "device_properties");
  properties_.name[sizeof properties_.name - 1] = '\0';
  properties_.vendor[sizeof properties_.vendor - 1] = '\0';
  properties_.pci_bus_id[sizeof properties_.pci_bus_id - 1] = '\0';
}

std::string Device::selector() const {
  return fmt::format("{}:{}", plugin_->name(), index_);
}

Buffer Device::allocate(uint64_t size, MemoryKind kind) const {
  void* ptr = nullptr;
  const hm_status status = api().mem_alloc(index_, size, static_cast<int32_t>(kind), &ptr);
  if (status != HM_OK) {
    try {
      plugin_->raise(status, "mem_alloc");
    } catch (const Error& e) {  // the plugin's words, after what was being allocated
      throw Error(status, fmt::format("{}: cannot allocate {} of {}: {}", selector(),
                                      describe_size(size), memory_name(kind), e.what()));
    }
  }
  return Buffer(*this, ptr, size, kind);
}

Stream Device::create_stream(uint32_t flags) const {
  hm_stream stream = nullptr;
  plugin_->check(api().stream_create(index_, flags, &stream), "stream_create");
  return Stream(*this, stream);
}

Stream Device::adopt_stream(hm_stream stream) const {
  if (stream == nullptr) throw Error(HM_ERR_INVALID_ARGUMENT, "adopt_stream: the stream is NULL");
  return Stream(*this, stream);
}

Event Device::create_event(uint32_t flags) const {
  hm_event event = nullptr;
  plugin_->check(api().event_create(index_, flags, &event), "event_create");
  return Event(*this, event);
}

PointerInfo Device::query(const void* ptr) const {
  hm_pointer_info info{};
  info.struct_size = sizeof info;
  plugin_->check(api().pointer_query(ptr, &info), "pointer_query");
  return PointerInfo{static_cast<hm_memory_kind>(info.kind), info.device, info.base, info.size};
}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    reset();
    device_ = std::move(other.device_);
    handle_ = other.release();
    size_ = other.size_;
    kind_ = other.kind_;
  }
  return *this;
}

void Buffer::reset() {
  if (void* ptr = release()) release_quietly(*device_, device_->api().mem_free, "mem_free", ptr);
}

Stream& Stream::operator=(Stream&& other) noexcept {
  if (this != &other) {
    reset();
    device_ = std::move(other.device_);
    handle_ = other.release();
  }
  return *this;
}

void Stream::reset() {
  if (hm_stream s = release())
    release_quietly(*device_, device_->api().stream_destroy, "stream_destroy", s);
}

void Stream::copy(void* dst, const void* src, uint64_t size) const {
  call(device(), device().api().memcpy_async, "memcpy_async", handle_, dst, src, size);
}

void Stream::fill(void* dst, uint8_t value, uint64_t size) const {
  call(device(), device().api().memset_async, "memset_async", handle_, dst,
       static_cast<int32_t>(value), size);
}

void Stream::synchronize(Timeout timeout) const {
  call(device(), device().api().stream_synchronize, "stream_synchronize", handle_, to_ns(timeout));
}

bool Stream::ready() const {
  return query(device(), device().api().stream_query, "stream_query", handle_) == HM_OK;
}

void Stream::wait(const Event& event) const {
  call(device(), device().api().stream_wait_event, "stream_wait_event", handle_, event.native());
}

void Stream::write_value32(void* address, uint32_t value) const {
  call(device(), device().api().stream_write_value32, "stream_write_value32", handle_, address,
       value, 0u);
}

void Stream::wait_value32(const void* address, uint32_t value, hm_wait_condition condition) const {
  call(device(), device().api().stream_wait_value32, "stream_wait_value32", handle_, address, value,
       static_cast<int32_t>(condition), 0u);
}

void Stream::add_callback(hm_host_fn fn, void* user_data) const {
  call(device(), device().api().stream_add_callback, "stream_add_callback", handle_, fn, user_data);
}

Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    reset();
    device_ = std::move(other.device_);
    handle_ = other.release();
  }
  return *this;
}

void Event::reset() {
  if (hm_event e = release())
    release_quietly(*device_, device_->api().event_destroy, "event_destroy", e);
}

void Event::record(const Stream& stream) const {
  call(device(), device().api().event_record, "event_record", handle_, stream.native());
}

bool Event::ready() const {
  return query(device(), device().api().event_query, "event_query", handle_) == HM_OK;
}

void Event::synchronize(Timeout timeout) const {
  call(device(), device().api().event_synchronize, "event_synchronize", handle_, to_ns(timeout));
}

float Event::elapsed_ms_since(const Event& start) const {
  float ms = 0;
  call(device(), device().api().event_elapsed_ms, "event_elapsed_ms", start.native(), handle_, &ms);
  return ms;
}

IpcMapping::IpcMapping(const Device& device, const hm_ipc_handle& handle) {
  void* ptr = nullptr;
  call(device, device.api().ipc_open, "ipc_open", device.index(), &handle, &ptr);
  device_ = device;
  handle_ = ptr;
}

void IpcMapping::reset() {
  if (void* ptr = release()) release_quietly(*device_, device_->api().ipc_close, "ipc_close", ptr);
}

HostBuffer::HostBuffer(const Device& device, uint64_t bytes) : size_(bytes) {
  if (device.has(HM_CAP_PINNED_HOST_MEMORY)) {
    pinned_ = device.allocate(bytes, MemoryKind::pinned_host);
    data_ = static_cast<uint8_t*>(pinned_.data());
  } else {
    try {
      plain_.resize(bytes);
    } catch (const std::exception&) {  // bad_alloc, or length_error past what a vector can hold
      throw Error(HM_ERR_OUT_OF_MEMORY,
                  fmt::format("{}: cannot allocate {} of host memory (plain: the device has no "
                              "pinned host memory): out of memory",
                              device.selector(), describe_size(bytes)));
    }
    data_ = plain_.data();
  }
  std::memset(data_, 0, bytes);
}

HostRegistration::HostRegistration(const Device& device, void* ptr, uint64_t size) {
  call(device, device.api().host_register, "host_register", ptr, size);
  device_ = device;
  handle_ = ptr;
}

void HostRegistration::reset() {
  if (void* ptr = release())
    release_quietly(*device_, device_->api().host_unregister, "host_unregister", ptr);
}

hm_ipc_handle ipc_export(const Device& device, void* ptr) {
  hm_ipc_handle handle{};
  call(device, device.api().ipc_export, "ipc_export", ptr, &handle);
  return handle;
}

DmaBuf::DmaBuf(const Device& device, const void* ptr, uint64_t size) {
  dmabuf_.struct_size = sizeof dmabuf_;
  dmabuf_.fd = -1;
  call(device, device.api().dmabuf_export, "dmabuf_export", ptr, size, &dmabuf_);
  device_ = device;
}

DmaBuf::DmaBuf(DmaBuf&& other) noexcept
    : device_(std::move(other.device_)), dmabuf_(other.dmabuf_) {
  other.device_.reset();
}

DmaBuf::~DmaBuf() {
  if (device_)
    release_quietly(*device_, device_->api().dmabuf_release, "dmabuf_release",
                    static_cast<const hm_dmabuf*>(&dmabuf_));
}

}  // namespace hetmesh
