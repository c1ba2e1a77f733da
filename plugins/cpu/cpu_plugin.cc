// The cpu device plugin: host memory as a device. Device memory is host-addressable memfd pages,
// so IPC works between processes through procfs; streams run on host threads.
#include <hetmesh/device_plugin.h>
#include <hetmesh/plugin_kit/host_memory_slots.hpp>
#include <hetmesh/plugin_kit/host_streams.hpp>
#include <hetmesh/plugin_kit/options.hpp>
#include <hetmesh/plugin_kit/table.hpp>

#include <cstring>
#include <memory>

namespace {

using hm::kit::fail;
using hm::kit::guarded;

constexpr uint32_t kIpcMagic = 0x48434355;  // "UCCH": handles from this plugin

std::unique_ptr<hm::kit::HostMemory> g_memory;

hm::kit::HostMemory& memory() {
  if (!g_memory) fail(HM_ERR_UNINITIALIZED, "initialize() has not succeeded");
  return *g_memory;
}

uint64_t physical_memory() {
  return static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) * hm::kit::page_size();
}

hm_capabilities capabilities() {
  hm_capabilities caps = HM_CAP_DEVICE_MEMORY | HM_CAP_PINNED_HOST_MEMORY | HM_CAP_HOST_REGISTER |
                         HM_CAP_IPC | HM_CAP_HOST_ADDRESSABLE_DEVICE_MEMORY | HM_CAP_PEER_COPY |
                         hm::kit::kHostStreamCapabilities;
  if (hm::kit::udmabuf_available()) caps |= HM_CAP_DMABUF_EXPORT;
  return caps;
}

hm_status initialize(const hm_host_api* host) {
  return guarded("initialize", [&] {
    hm::kit::require_struct(host, HM_HOST_API_SIZE_V1, "host");
    if (g_memory) fail(HM_ERR_INVALID_ARGUMENT, "initialize() called twice");
    hm::kit::reject_unknown(hm::kit::parse_options(host->options), "none");
    g_memory = std::make_unique<hm::kit::HostMemory>(
        kIpcMagic, /*hidden_device_memory=*/false, std::vector<uint64_t>{physical_memory()}, host);
  });
}

hm_status shutdown() {
  return guarded("shutdown", [&] { g_memory.reset(); });
}

hm_status device_count(int32_t* count) {
  return guarded("device_count", [&] {
    if (count == nullptr) fail(HM_ERR_INVALID_ARGUMENT, "count is NULL");
    *count = memory().device_count();
  });
}

hm_status device_properties(int32_t device, hm_device_properties* props) {
  return guarded("device_properties", [&] {
    hm::kit::require_struct(props, HM_DEVICE_PROPERTIES_SIZE_V1, "props");
    hm::kit::check_device(device);
    std::snprintf(props->name, sizeof props->name, "host memory");
    std::snprintf(props->vendor, sizeof props->vendor, "hetmesh");
    props->dlpack_device_type = HM_DLPACK_CPU;
    props->pci_bus_id[0] = '\0';
    props->numa_node = -1;
    props->total_memory = memory().capacity(device);
    props->capabilities = capabilities();
    props->memory_alignment = hm::kit::page_size();
  });
}

// Checks that a range that starts in our memory stays inside its allocation.
void check_range(const void* ptr, uint64_t size, const char* what) {
  if (ptr == nullptr) fail(HM_ERR_INVALID_ARGUMENT, "%s is NULL", what);
  memory().view_if_ours(ptr, size);
}

hm_status memcpy_async(hm_stream stream, void* dst, const void* src, uint64_t size) {
  return guarded("memcpy_async", [&] {
    auto* s = hm::kit::host_stream(stream);
    if (size == 0) return;
    check_range(dst, size, "dst");
    check_range(src, size, "src");
    s->worker.submit([=] { std::memmove(dst, src, size); });
  });
}

hm_status memset_async(hm_stream stream, void* dst, int32_t value, uint64_t size) {
  return guarded("memset_async", [&] {
    auto* s = hm::kit::host_stream(stream);
    if (size == 0) return;
    check_range(dst, size, "dst");
    s->worker.submit([=] { std::memset(dst, value, size); });
  });
}

int32_t hook_device_count() {
  return g_memory ? g_memory->device_count() : 0;
}
void* hook_host_view(const void* ptr, uint64_t size) {
  return memory().view(ptr, size);
}

hm_device_plugin_api make_table() {
  hm_device_plugin_api t = hm::kit::plugin_table("cpu", HETMESH_VERSION);
  t.initialize = initialize;
  t.device_count = device_count;
  t.device_properties = device_properties;
  t.memcpy_async = memcpy_async;
  t.memset_async = memset_async;
  t.shutdown = shutdown;
  hm::kit::install_host_memory(&t, memory, /*host_register=*/true);
  hm::kit::install_host_streams(&t, {hook_device_count, hook_host_view});
  return t;
}

}  // namespace

extern "C" const hm_device_plugin_api* hm_device_plugin_v1(void) {
  static const hm_device_plugin_api table = make_table();
  return &table;
}
