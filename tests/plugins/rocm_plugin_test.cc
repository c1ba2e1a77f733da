// The rocm plugin, wherever it is built. It must load on every machine: without ROCm or an AMD GPU
// (CI: no /dev/kfd) it reports zero devices with the reason in last_error and answers every slot
// with a clean error; with GPUs it describes them. hetmesh-cts covers the devices themselves. The
// HM_WAIT_GEQ relay the plugin uses is the plugin kit's, tested in wait_relay_test.cc.
#include "test_support.hpp"

#include <hetmesh/core/device.hpp>
#include <hetmesh/core/plugin.hpp>
#include <hetmesh/core/subprocess.hpp>

#include <dlfcn.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <memory>
#include <string>
#include <vector>

namespace hetmesh {
namespace {

std::shared_ptr<Plugin> load_rocm() {
  std::string refusal;
  auto plugin = load_plugin_file(test::plugin_path("rocm"), "", &refusal);
  EXPECT_NE(plugin, nullptr) << "the rocm plugin was refused: " << refusal;
  return plugin;
}

bool amd_gpu_node_present() {
  return access("/dev/kfd", F_OK) == 0;
}

bool hip_runtime_present() {
  return dlopen("libamdhip64.so.5", RTLD_LAZY | RTLD_LOCAL) != nullptr ||
         dlopen("libamdhip64.so", RTLD_LAZY | RTLD_LOCAL) != nullptr;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(RocmPlugin, LoadsAndNegotiatesTheAbi) {
  auto rocm = load_rocm();
  ASSERT_NE(rocm, nullptr);
  EXPECT_EQ(rocm->name(), "rocm");
  EXPECT_TRUE(contains(rocm->version(), "+hip")) << rocm->version();
  EXPECT_EQ(rocm->api().struct_size, sizeof(hm_device_plugin_api));
  EXPECT_EQ(rocm->api().abi_major, static_cast<uint32_t>(HM_DEVICE_PLUGIN_ABI_MAJOR));
  EXPECT_EQ(rocm->negotiated_abi_minor(), static_cast<uint32_t>(HM_DEVICE_PLUGIN_ABI_MINOR));
  EXPECT_GE(rocm->device_count(), 0);
  // Every optional slot but get_extension is implemented.
  const hm_device_plugin_api& api = rocm->api();
  EXPECT_TRUE(api.shutdown && api.host_register && api.host_unregister && api.stream_add_callback &&
              api.event_elapsed_ms && api.stream_write_value32 && api.stream_wait_value32 &&
              api.ipc_export && api.ipc_open && api.ipc_close && api.dmabuf_export &&
              api.dmabuf_release);
  EXPECT_EQ(api.get_extension, nullptr);
}

TEST(RocmPlugin, WithoutAnAmdGpuReportsZeroDevicesAndWhy) {
  if (amd_gpu_node_present()) GTEST_SKIP() << "this machine has /dev/kfd (an AMD GPU driver)";
  auto rocm = load_rocm();
  ASSERT_NE(rocm, nullptr);
  const hm_device_plugin_api& api = rocm->api();
  EXPECT_EQ(rocm->device_count(), 0);
  int32_t count = -1;
  ASSERT_EQ(api.device_count(&count), HM_OK);
  EXPECT_EQ(count, 0);
  const std::string reason = api.last_error();
  EXPECT_TRUE(contains(reason, "no ROCm")) << "last_error: " << reason;
  if (hip_runtime_present()) {
    EXPECT_TRUE(contains(reason, "hipGetDeviceCount failed with hipErrorNoDevice"))
        << "last_error: " << reason;
    EXPECT_TRUE(contains(reason, "/dev/kfd does not exist")) << "last_error: " << reason;
  } else {
    EXPECT_TRUE(contains(reason, "libamdhip64 not found")) << "last_error: " << reason;
  }
}

// Every slot that takes a device index refuses one that does not exist, naming the slot.
TEST(RocmPlugin, SlotsRefuseADeviceThatDoesNotExist) {
  auto rocm = load_rocm();
  ASSERT_NE(rocm, nullptr);
  const hm_device_plugin_api& api = rocm->api();
  const int32_t count = rocm->device_count();
  for (int32_t device : {count, count + 1, -1, INT32_MAX, INT32_MIN}) {
    SCOPED_TRACE("device " + std::to_string(device));
    auto expect_refused = [&](hm_status status, const char* slot) {
      EXPECT_EQ(status, HM_ERR_INVALID_ARGUMENT) << slot;
      const std::string error = api.last_error();
      EXPECT_TRUE(contains(
          error, std::string(slot) + ": device " + std::to_string(device) + " does not exist"))
          << slot << ": " << error;
    };
    hm_device_properties props{};
    props.struct_size = sizeof props;
    expect_refused(api.device_properties(device, &props), "device_properties");
    void* ptr = nullptr;
    expect_refused(api.mem_alloc(device, 64, HM_MEM_DEVICE, &ptr), "mem_alloc");
    expect_refused(api.mem_alloc(device, 64, HM_MEM_PINNED_HOST, &ptr), "mem_alloc");
    EXPECT_EQ(ptr, nullptr);
    hm_stream stream = nullptr;
    expect_refused(api.stream_create(device, 0, &stream), "stream_create");
    EXPECT_EQ(stream, nullptr);
    hm_event event = nullptr;
    expect_refused(api.event_create(device, 0, &event), "event_create");
    EXPECT_EQ(event, nullptr);
    hm_ipc_handle handle{};
    expect_refused(api.ipc_open(device, &handle, &ptr), "ipc_open");
  }
}

// Slots that take a stream or event refuse NULL; memory slots answer about foreign memory.
TEST(RocmPlugin, SlotsRefuseMissingHandlesAndForeignMemory) {
  auto rocm = load_rocm();
  ASSERT_NE(rocm, nullptr);
  const hm_device_plugin_api& api = rocm->api();
  uint8_t a = 0, b = 0;
  uint32_t word = 0;
  float ms = 0;
  EXPECT_EQ(api.memcpy_async(nullptr, &a, &b, 1), HM_ERR_INVALID_HANDLE);
  EXPECT_TRUE(contains(api.last_error(), "memcpy_async: stream is NULL")) << api.last_error();
  EXPECT_EQ(api.memset_async(nullptr, &a, 0, 1), HM_ERR_INVALID_HANDLE);
  EXPECT_EQ(api.stream_destroy(nullptr), HM_ERR_INVALID_HANDLE);
  EXPECT_EQ(api.stream_synchronize(nullptr, 0), HM_ERR_INVALID_HANDLE);
  EXPECT_EQ(api.stream_query(nullptr), HM_ERR_INVALID_HANDLE);
  EXPECT_EQ(api.stream_add_callback(
                nullptr, [](void*) {}, nullptr),
            HM_ERR_INVALID_HANDLE);
  EXPECT_EQ(api.stream_write_value32(nullptr, &word, 1, 0), HM_ERR_INVALID_HANDLE);
  EXPECT_EQ(api.stream_wait_value32(nullptr, &word, 1, HM_WAIT_GEQ, 0), HM_ERR_INVALID_HANDLE);
  EXPECT_EQ(api.event_destroy(nullptr), HM_ERR_INVALID_HANDLE);
  EXPECT_EQ(api.event_record(nullptr, nullptr), HM_ERR_INVALID_HANDLE);
  EXPECT_EQ(api.event_query(nullptr), HM_ERR_INVALID_HANDLE);
  EXPECT_TRUE(contains(api.last_error(), "event_query: event is NULL")) << api.last_error();
  EXPECT_EQ(api.event_synchronize(nullptr, 0), HM_ERR_INVALID_HANDLE);
  EXPECT_EQ(api.stream_wait_event(nullptr, nullptr), HM_ERR_INVALID_HANDLE);
  EXPECT_EQ(api.event_elapsed_ms(nullptr, nullptr, &ms), HM_ERR_INVALID_HANDLE);

  EXPECT_EQ(api.mem_free(nullptr), HM_OK);
  EXPECT_EQ(api.mem_free(&a), HM_ERR_INVALID_ARGUMENT);
  std::vector<uint8_t> heap(8192);
  hm_pointer_info info{};
  info.struct_size = sizeof info;
  ASSERT_EQ(api.pointer_query(heap.data() + 7, &info), HM_OK);
  EXPECT_EQ(info.kind, HM_MEM_UNKNOWN);
  EXPECT_EQ(info.device, -1);
  EXPECT_EQ(info.base, nullptr);
  info.struct_size = sizeof(size_t);
  EXPECT_EQ(api.pointer_query(heap.data(), &info), HM_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(api.host_unregister(heap.data()), HM_ERR_INVALID_ARGUMENT);
  hm_ipc_handle handle{};
  EXPECT_EQ(api.ipc_export(heap.data(), &handle), HM_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(api.ipc_close(heap.data()), HM_ERR_INVALID_ARGUMENT);
  hm_dmabuf dmabuf{};
  dmabuf.struct_size = sizeof dmabuf;
  EXPECT_EQ(api.dmabuf_export(heap.data(), 4096, &dmabuf), HM_ERR_INVALID_ARGUMENT);
  dmabuf.fd = -1;
  EXPECT_EQ(api.dmabuf_release(&dmabuf), HM_ERR_INVALID_ARGUMENT);
  if (rocm->device_count() == 0) {
    EXPECT_EQ(api.host_register(heap.data(), heap.size()), HM_ERR_NOT_SUPPORTED);
    EXPECT_TRUE(contains(api.last_error(), "host_register: no device to register memory with"))
        << api.last_error();
  }
}

TEST(RocmPlugin, RegistryListsItWithoutDevices) {
  if (amd_gpu_node_present()) GTEST_SKIP() << "this machine has /dev/kfd (an AMD GPU driver)";
  PluginLoadOptions options;
  options.explicit_paths = {test::plugin_path("rocm")};
  options.search = false;
  PluginRegistry registry = PluginRegistry::load(options);
  ASSERT_EQ(registry.plugins().size(), 1u)
      << (registry.refused().empty() ? "" : registry.refused()[0].reason);
  EXPECT_EQ(registry.plugins()[0]->name(), "rocm");
  EXPECT_TRUE(registry.devices().empty());
  EXPECT_THROW(registry.device("rocm:0"), Error);
}

// Loading and initialize() in a throwaway process (hetmesh-plugin-probe, as isolated loading and
// hetmesh-cts do it) neither hang nor crash. The probe's stderr is shown on failure: under the
// sanitizers it holds their report.
TEST(RocmPlugin, InitializesInAnIsolatedProbe) {
  ProcessResult r = run_process({test::probe_path(), test::plugin_path("rocm")},
                                std::chrono::milliseconds(30000));
  EXPECT_FALSE(r.timed_out) << "the probe hung";
  EXPECT_EQ(r.signal, 0) << r.describe() << "\n" << r.err;
  EXPECT_EQ(r.exit_code, 0) << r.describe() << "; stdout: " << r.out << "\n" << r.err;
  EXPECT_EQ(r.out, "ok rocm\n") << r.err;
}

TEST(RocmPlugin, DescribesEachGpu) {
  auto rocm = load_rocm();
  ASSERT_NE(rocm, nullptr);
  int32_t count = 0;
  ASSERT_EQ(rocm->api().device_count(&count), HM_OK);
  if (count == 0) GTEST_SKIP() << "no AMD GPU here: " << rocm->api().last_error();
  for (int32_t i = 0; i < rocm->device_count(); ++i) {
    Device device(rocm, i);
    const hm_device_properties& p = device.properties();
    EXPECT_STREQ(p.vendor, "AMD");
    EXPECT_EQ(p.dlpack_device_type, HM_DLPACK_ROCM);
    EXPECT_GT(p.total_memory, 0u);
    EXPECT_EQ(p.memory_alignment, 256u);
    EXPECT_TRUE(device.has(HM_CAP_DEVICE_MEMORY | HM_CAP_PINNED_HOST_MEMORY | HM_CAP_HOST_CALLBACK |
                           HM_CAP_EVENT_TIMING | HM_CAP_IPC));
    EXPECT_FALSE(device.has(HM_CAP_HOST_ADDRESSABLE_DEVICE_MEMORY));
    EXPECT_NE(p.pci_bus_id[0], '\0');
  }
}

}  // namespace
}  // namespace hetmesh
