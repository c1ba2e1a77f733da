// The cuda plugin, wherever it is built. It must load on every machine: without an NVIDIA driver
// or GPU (CI) it reports zero devices with the reason in last_error and answers every slot with a
// clean error; with GPUs it describes them. hetmesh-cts covers the devices themselves.
#include "test_support.hpp"

#include <hetmesh/core/device.hpp>
#include <hetmesh/core/plugin.hpp>

#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace hetmesh {
namespace {

std::shared_ptr<Plugin> load_cuda() {
  std::string refusal;
  auto plugin = load_plugin_file(test::plugin_path("cuda"), "", &refusal);
  EXPECT_NE(plugin, nullptr) << "the cuda plugin was refused: " << refusal;
  return plugin;
}

// Whether this machine has an NVIDIA driver library at all.
bool driver_library_present() {
  return dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL) != nullptr;
}

TEST(CudaPlugin, LoadsAndNamesItself) {
  auto cuda = load_cuda();
  ASSERT_NE(cuda, nullptr);
  EXPECT_EQ(cuda->name(), "cuda");
  EXPECT_NE(cuda->version().find("+cuda"), std::string::npos) << cuda->version();
  EXPECT_EQ(cuda->api().struct_size, sizeof(hm_device_plugin_api));
  EXPECT_GE(cuda->device_count(), 0);
  // Every optional slot but get_extension is implemented.
  const hm_device_plugin_api& api = cuda->api();
  EXPECT_TRUE(api.shutdown && api.host_register && api.host_unregister && api.stream_add_callback &&
              api.event_elapsed_ms && api.stream_write_value32 && api.stream_wait_value32 &&
              api.ipc_export && api.ipc_open && api.ipc_close && api.dmabuf_export &&
              api.dmabuf_release);
}

TEST(CudaPlugin, WithoutADriverReportsZeroDevicesAndWhy) {
  if (driver_library_present()) GTEST_SKIP() << "this machine has an NVIDIA driver";
  auto cuda = load_cuda();
  ASSERT_NE(cuda, nullptr);
  const hm_device_plugin_api& api = cuda->api();
  EXPECT_EQ(cuda->device_count(), 0);
  int32_t count = -1;
  ASSERT_EQ(api.device_count(&count), HM_OK);
  EXPECT_EQ(count, 0);
  EXPECT_NE(std::string(api.last_error()).find("no NVIDIA driver: libcuda.so.1 not found"),
            std::string::npos)
      << "last_error: " << api.last_error();

  hm_device_properties props{};
  props.struct_size = sizeof props;
  EXPECT_EQ(api.device_properties(0, &props), HM_ERR_INVALID_ARGUMENT);
  EXPECT_STRNE(api.last_error(), "");
  void* ptr = nullptr;
  EXPECT_EQ(api.mem_alloc(0, 64, HM_MEM_DEVICE, &ptr), HM_ERR_INVALID_ARGUMENT);
  hm_stream stream = nullptr;
  EXPECT_EQ(api.stream_create(0, 0, &stream), HM_ERR_INVALID_ARGUMENT);
  hm_event event = nullptr;
  EXPECT_EQ(api.event_create(0, 0, &event), HM_ERR_INVALID_ARGUMENT);
  uint8_t a = 0, b = 0;
  EXPECT_EQ(api.memcpy_async(nullptr, &a, &b, 1), HM_ERR_INVALID_HANDLE);
  EXPECT_EQ(api.stream_synchronize(nullptr, 0), HM_ERR_INVALID_HANDLE);
  EXPECT_EQ(api.event_query(nullptr), HM_ERR_INVALID_HANDLE);
  EXPECT_EQ(api.mem_free(nullptr), HM_OK);
  EXPECT_EQ(api.mem_free(&a), HM_ERR_INVALID_ARGUMENT);

  std::vector<uint8_t> heap(4096);
  hm_pointer_info info{};
  info.struct_size = sizeof info;
  ASSERT_EQ(api.pointer_query(heap.data() + 7, &info), HM_OK);
  EXPECT_EQ(info.kind, HM_MEM_UNKNOWN);
  EXPECT_EQ(info.device, -1);
  info.struct_size = sizeof(size_t);
  EXPECT_EQ(api.pointer_query(heap.data(), &info), HM_ERR_INVALID_ARGUMENT);

  EXPECT_EQ(api.host_register(heap.data(), heap.size()), HM_ERR_NOT_SUPPORTED);
  hm_ipc_handle handle{};
  EXPECT_EQ(api.ipc_export(heap.data(), &handle), HM_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(api.ipc_open(0, &handle, &ptr), HM_ERR_INVALID_ARGUMENT);
}

TEST(CudaPlugin, RegistryListsItWithoutDevices) {
  if (driver_library_present()) GTEST_SKIP() << "this machine has an NVIDIA driver";
  PluginLoadOptions options;
  options.explicit_paths = {test::plugin_path("cuda")};
  options.search = false;
  PluginRegistry registry = PluginRegistry::load(options);
  ASSERT_EQ(registry.plugins().size(), 1u)
      << (registry.refused().empty() ? "" : registry.refused()[0].reason);
  EXPECT_EQ(registry.plugins()[0]->name(), "cuda");
  EXPECT_TRUE(registry.devices().empty());
  EXPECT_THROW(registry.device("cuda:0"), Error);
}

TEST(CudaPlugin, DescribesEachGpu) {
  auto cuda = load_cuda();
  ASSERT_NE(cuda, nullptr);
  if (cuda->device_count() == 0) GTEST_SKIP() << "no CUDA device here";
  for (int32_t i = 0; i < cuda->device_count(); ++i) {
    Device device(cuda, i);
    const hm_device_properties& p = device.properties();
    EXPECT_STREQ(p.vendor, "NVIDIA");
    EXPECT_EQ(p.dlpack_device_type, HM_DLPACK_CUDA);
    EXPECT_GT(p.total_memory, 0u);
    EXPECT_EQ(p.memory_alignment, 256u);
    EXPECT_TRUE(device.has(HM_CAP_DEVICE_MEMORY | HM_CAP_PINNED_HOST_MEMORY | HM_CAP_HOST_CALLBACK |
                           HM_CAP_EVENT_TIMING));
    EXPECT_FALSE(device.has(HM_CAP_HOST_ADDRESSABLE_DEVICE_MEMORY));
    EXPECT_NE(p.pci_bus_id[0], '\0');
  }
}

}  // namespace
}  // namespace hetmesh
