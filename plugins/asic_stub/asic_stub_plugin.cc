// asic_stub: a simulated accelerator, and the plugin a vendor copies.
//
// - Device memory is not host-addressable: mem_alloc hands out a PROT_NONE view of a memfd, so
//   core code that dereferences device memory crashes as it would on a GPU. The copy engine works
//   through a second, writable view of the same pages.
// - Every stream is an engine thread. Copies cost latency + bytes / bandwidth, configured with the
//   plugin options copy_latency_us / copy_bandwidth_gbps (or HETMESH_ASIC_STUB_COPY_LATENCY_US /
//   HETMESH_ASIC_STUB_COPY_BANDWIDTH_GBPS); bandwidth 0 means unlimited. The bytes move when that
//   time is up, so code that reads before synchronizing, or frees memory a copy still uses, sees
//   it fail as the copy's time grows.
// - Devices: option `devices` (HETMESH_ASIC_STUB_DEVICES, default 2), each with `memory_mib`
//   (HETMESH_ASIC_STUB_MEMORY_MIB, default 1024) of memory.
// - IPC through memfd, dma-buf through /dev/udmabuf when the kernel has it, and the
//   "hm.asic_stub.launch" extension (hetmesh/plugins/asic_stub.h) standing in for kernels.
#include <hetmesh/device_plugin.h>
#include <hetmesh/plugins/asic_stub.h>
#include <hetmesh/plugin_kit/extension.hpp>
#include <hetmesh/plugin_kit/host_memory_slots.hpp>
#include <hetmesh/plugin_kit/host_streams.hpp>
#include <hetmesh/plugin_kit/options.hpp>
#include <hetmesh/plugin_kit/table.hpp>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace {

using hm::kit::fail;
using hm::kit::guarded;

constexpr uint32_t kIpcMagic = 0x42555453;  // "STUB"

struct CopyEngineModel {
  double latency_us = 2.0;
  double bandwidth_gbps = 32.0;  // GB/s; 0 = unlimited

  std::chrono::nanoseconds cost(uint64_t bytes) const {
    double ns = latency_us * 1e3;
    if (bandwidth_gbps > 0) ns += static_cast<double>(bytes) / bandwidth_gbps;
    return std::chrono::nanoseconds(static_cast<int64_t>(ns));
  }
};

struct Stub {
  CopyEngineModel model;
  hm::kit::HostMemory memory;
};
std::unique_ptr<Stub> g_stub;

Stub& stub() {
  if (!g_stub) fail(HM_ERR_UNINITIALIZED, "initialize() has not succeeded");
  return *g_stub;
}

hm::kit::HostMemory& host_memory() {
  return stub().memory;
}

// Holds the engine for the simulated transfer time of `bytes`.
void occupy_engine(uint64_t bytes) {
  auto until = std::chrono::steady_clock::now() + stub().model.cost(bytes);
  if (until - std::chrono::steady_clock::now() > std::chrono::microseconds(50))
    std::this_thread::sleep_until(until);
  while (std::chrono::steady_clock::now() < until) {
  }
}

// Engine-side address: our memory through its writable view, anything else is host memory.
uint8_t* engine_address(const void* ptr, uint64_t size, const char* what) {
  if (ptr == nullptr) fail(HM_ERR_INVALID_ARGUMENT, "%s is NULL", what);
  uint8_t* view = stub().memory.view_if_ours(ptr, size);
  return view != nullptr ? view : static_cast<uint8_t*>(const_cast<void*>(ptr));
}

hm_status initialize(const hm_host_api* host) {
  return guarded("initialize", [&] {
    hm::kit::require_struct(host, HM_HOST_API_SIZE_V1, "host");
    if (g_stub) fail(HM_ERR_INVALID_ARGUMENT, "initialize() called twice");
    auto options = hm::kit::parse_options(host->options);
    CopyEngineModel model;
    model.latency_us = hm::kit::take_number(options, "copy_latency_us",
                                            "HETMESH_ASIC_STUB_COPY_LATENCY_US", model.latency_us);
    model.bandwidth_gbps =
        hm::kit::take_number(options, "copy_bandwidth_gbps",
                             "HETMESH_ASIC_STUB_COPY_BANDWIDTH_GBPS", model.bandwidth_gbps);
    double devices = hm::kit::take_number(options, "devices", "HETMESH_ASIC_STUB_DEVICES", 2);
    double memory_mib =
        hm::kit::take_number(options, "memory_mib", "HETMESH_ASIC_STUB_MEMORY_MIB", 1024);
    hm::kit::reject_unknown(options, "copy_latency_us, copy_bandwidth_gbps, devices, memory_mib");
    if (devices > 64) fail(HM_ERR_INVALID_ARGUMENT, "devices=%g exceeds 64", devices);
    std::vector<uint64_t> capacity(static_cast<size_t>(devices),
                                   static_cast<uint64_t>(memory_mib * 1024 * 1024));
    g_stub.reset(new Stub{model, hm::kit::HostMemory(kIpcMagic, /*hidden_device_memory=*/true,
                                                     std::move(capacity), host)});
    if (host->log != nullptr) {
      char line[160];
      std::snprintf(line, sizeof line,
                    "asic_stub: %d devices, %g MiB each, copy engine %g us + %g GB/s",
                    static_cast<int>(devices), memory_mib, model.latency_us, model.bandwidth_gbps);
      host->log(host->log_context, HM_LOG_DEBUG, line);
    }
  });
}

hm_status shutdown() {
  return guarded("shutdown", [&] { g_stub.reset(); });
}

hm_status device_count(int32_t* count) {
  return guarded("device_count", [&] {
    if (count == nullptr) fail(HM_ERR_INVALID_ARGUMENT, "count is NULL");
    *count = stub().memory.device_count();
  });
}

hm_status device_properties(int32_t device, hm_device_properties* props) {
  return guarded("device_properties", [&] {
    hm::kit::require_struct(props, HM_DEVICE_PROPERTIES_SIZE_V1, "props");
    hm::kit::check_device(device);
    std::snprintf(props->name, sizeof props->name, "asic_stub simulated accelerator %d", device);
    std::snprintf(props->vendor, sizeof props->vendor, "hetmesh (simulated)");
    props->dlpack_device_type = HM_DLPACK_EXT_DEV;
    props->pci_bus_id[0] = '\0';
    props->numa_node = -1;
    props->total_memory = stub().memory.capacity(device);
    props->capabilities = HM_CAP_DEVICE_MEMORY | HM_CAP_PINNED_HOST_MEMORY | HM_CAP_IPC |
                          HM_CAP_PEER_COPY | hm::kit::kHostStreamCapabilities;
    if (hm::kit::udmabuf_available()) props->capabilities |= HM_CAP_DMABUF_EXPORT;
    props->memory_alignment = hm::kit::page_size();
  });
}

hm_status memcpy_async(hm_stream stream, void* dst, const void* src, uint64_t size) {
  return guarded("memcpy_async", [&] {
    auto* s = hm::kit::host_stream(stream);
    if (size == 0) return;
    uint8_t* to = engine_address(dst, size, "dst");
    const uint8_t* from = engine_address(src, size, "src");
    s->worker.submit([=] {
      occupy_engine(size);
      std::memmove(to, from, size);
    });
  });
}

hm_status memset_async(hm_stream stream, void* dst, int32_t value, uint64_t size) {
  return guarded("memset_async", [&] {
    auto* s = hm::kit::host_stream(stream);
    if (size == 0) return;
    uint8_t* to = engine_address(dst, size, "dst");
    s->worker.submit([=] {
      occupy_engine(size);
      std::memset(to, value, size);
    });
  });
}

// ---- the launch extension ----

hm_status launch(hm_stream stream, hm_asic_stub_kernel kernel, void* const* buffers,
                 const uint64_t* buffer_sizes, size_t buffer_count, const void* args,
                 size_t args_size) {
  return guarded("launch", [&] {
    auto* s = hm::kit::host_stream(stream);
    if (kernel == nullptr) fail(HM_ERR_INVALID_ARGUMENT, "kernel is NULL");
    if (buffer_count > 0 && (buffers == nullptr || buffer_sizes == nullptr))
      fail(HM_ERR_INVALID_ARGUMENT, "buffers or buffer_sizes is NULL");
    if (args_size > HM_ASIC_STUB_MAX_KERNEL_ARGS)
      fail(HM_ERR_INVALID_ARGUMENT, "args_size %zu exceeds %u", args_size,
           HM_ASIC_STUB_MAX_KERNEL_ARGS);
    if (args_size > 0 && args == nullptr) fail(HM_ERR_INVALID_ARGUMENT, "args is NULL");
    std::vector<void*> views(buffer_count);
    for (size_t i = 0; i < buffer_count; ++i)
      views[i] = stub().memory.view(buffers[i], buffer_sizes[i]);
    std::vector<uint8_t> arg_copy(static_cast<const uint8_t*>(args),
                                  static_cast<const uint8_t*>(args) + args_size);
    s->worker.submit([kernel, views = std::move(views), arg_copy = std::move(arg_copy)] {
      kernel(views.data(), views.size(), arg_copy.data());
    });
  });
}

constexpr hm_asic_stub_launch_ext kLaunchExtension = {
    {sizeof(hm_asic_stub_launch_ext), HM_ASIC_STUB_LAUNCH_VERSION}, launch};

hm_status get_extension(const char* name, uint32_t min_version, const void** table) {
  return hm::kit::get_single_extension(name, min_version, table, HM_ASIC_STUB_LAUNCH_EXTENSION,
                                       &kLaunchExtension);
}

int32_t hook_device_count() {
  return g_stub ? g_stub->memory.device_count() : 0;
}
void* hook_host_view(const void* ptr, uint64_t size) {
  return stub().memory.view(ptr, size);
}

hm_device_plugin_api make_table() {
  hm_device_plugin_api t = hm::kit::plugin_table("asic_stub", HETMESH_VERSION);
  t.initialize = initialize;
  t.device_count = device_count;
  t.device_properties = device_properties;
  t.memcpy_async = memcpy_async;
  t.memset_async = memset_async;
  t.shutdown = shutdown;
  t.get_extension = get_extension;
  // host_register stays NULL: the stub's engine can read any host memory, so there is nothing to
  // register, and HM_CAP_HOST_REGISTER is clear.
  hm::kit::install_host_memory(&t, host_memory, /*host_register=*/false);
  hm::kit::install_host_streams(&t, {hook_device_count, hook_host_view});
  return t;
}

}  // namespace

extern "C" const hm_device_plugin_api* hm_device_plugin_v1(void) {
  static const hm_device_plugin_api table = make_table();
  return &table;
}
