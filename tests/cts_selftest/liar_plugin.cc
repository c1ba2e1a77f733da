// A plugin that lies, for testing the conformance kit itself: it claims HM_CAP_IPC but leaves the
// IPC slots NULL. Everything else is the cpu plugin's behaviour. hetmesh-cts must fail exactly the
// IPC tests on it, or accept them as expected failures when listed. Two worse vendor bugs on
// demand, for the kit's supervision: HM_TEST_LIAR_HANG=1 makes stream_add_callback never return,
// HM_TEST_LIAR_CRASH=1 makes event_elapsed_ms die of SIGSEGV, as a wild write would.
#include <hetmesh/device_plugin.h>
#include <hetmesh/plugin_kit/host_memory.hpp>
#include <hetmesh/plugin_kit/host_streams.hpp>
#include <hetmesh/plugin_kit/options.hpp>
#include <hetmesh/plugin_kit/table.hpp>

#include <csignal>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>

namespace {

using hm::kit::fail;
using hm::kit::guarded;

std::unique_ptr<hm::kit::HostMemory> g_memory;

hm::kit::HostMemory& memory() {
  if (!g_memory) fail(HM_ERR_UNINITIALIZED, "not initialized");
  return *g_memory;
}

hm_status initialize(const hm_host_api* host) {
  return guarded("initialize", [&] {
    hm::kit::reject_unknown(hm::kit::parse_options(host->options), "none");
    g_memory = std::make_unique<hm::kit::HostMemory>(
        0x5241494c, false, std::vector<uint64_t>{uint64_t{1} << 30}, host);
  });
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
    std::snprintf(props->name, sizeof props->name, "liar");
    std::snprintf(props->vendor, sizeof props->vendor, "hetmesh tests");
    props->dlpack_device_type = HM_DLPACK_CPU;
    props->pci_bus_id[0] = '\0';
    props->numa_node = -1;
    props->total_memory = memory().capacity(device);
    props->capabilities = HM_CAP_DEVICE_MEMORY | HM_CAP_PINNED_HOST_MEMORY |
                          HM_CAP_HOST_ADDRESSABLE_DEVICE_MEMORY | HM_CAP_IPC /* the lie */ |
                          hm::kit::kHostStreamCapabilities;
    props->memory_alignment = hm::kit::page_size();
  });
}

hm_status mem_alloc(int32_t device, uint64_t size, int32_t kind, void** ptr) {
  return guarded("mem_alloc", [&] {
    if (ptr == nullptr) fail(HM_ERR_INVALID_ARGUMENT, "ptr is NULL");
    *ptr = memory().alloc(device, size, kind);
  });
}

hm_status mem_free(void* ptr) {
  return guarded("mem_free", [&] { memory().free(ptr); });
}

hm_status pointer_query(const void* ptr, hm_pointer_info* info) {
  return guarded("pointer_query", [&] { memory().query(ptr, info); });
}

// A range that starts in our memory stays inside its allocation (as the cpu plugin checks).
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

hm_status hanging_add_callback(hm_stream, hm_host_fn, void*) {
  for (;;)
    std::this_thread::sleep_for(std::chrono::hours(1));
}

hm_status crashing_elapsed_ms(hm_event, hm_event, float*) {
  std::raise(SIGSEGV);
  return HM_ERR_INTERNAL;
}

int32_t hook_device_count() {
  return g_memory ? g_memory->device_count() : 0;
}
void* hook_host_view(const void* ptr, uint64_t size) {
  return memory().view(ptr, size);
}

hm_device_plugin_api make_table() {
  hm_device_plugin_api t = hm::kit::plugin_table("liar", "test");
  t.initialize = initialize;
  t.device_count = device_count;
  t.device_properties = device_properties;
  t.mem_alloc = mem_alloc;
  t.mem_free = mem_free;
  t.pointer_query = pointer_query;
  t.memcpy_async = memcpy_async;
  t.memset_async = memset_async;
  hm::kit::install_host_streams(&t, {hook_device_count, hook_host_view});
  if (std::getenv("HM_TEST_LIAR_HANG")) t.stream_add_callback = hanging_add_callback;
  if (std::getenv("HM_TEST_LIAR_CRASH")) t.event_elapsed_ms = crashing_elapsed_ms;
  return t;
}

}  // namespace

extern "C" const hm_device_plugin_api* hm_device_plugin_v1(void) {
  static const hm_device_plugin_api table = make_table();
  return &table;
}
