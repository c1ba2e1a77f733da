// The level_zero plugin, wherever it is built. It must load on every machine: without the Level
// Zero loader or a GPU driver (CI) it reports zero devices with the reason in last_error. Through
// the host stand-in driver (plugins/level_zero/tools), hetmesh-cts-level_zero-host covers the
// devices; here: that HM_CAP_STREAM_MEMOPS follows the driver's experimental memory-sync calls and
// HM_CAP_DMABUF_EXPORT its external memory export, and that the plugin itself refuses a copy past
// its allocation.
// Level Zero initialises once per process, so each driver setup runs in a child process (this
// executable again, with the environment the case needs).
#include "test_support.hpp"

#include <hetmesh/core/device.hpp>
#include <hetmesh/core/plugin.hpp>
#include <hetmesh/core/subprocess.hpp>

#include <dlfcn.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

namespace hetmesh {
namespace {

constexpr const char* kChildEnv = "HETMESH_LEVEL_ZERO_TEST_CHILD";

std::shared_ptr<Plugin> load_level_zero() {
  std::string refusal;
  auto plugin = load_plugin_file(test::plugin_path("level_zero"), "", &refusal);
  EXPECT_NE(plugin, nullptr) << "the level_zero plugin was refused: " << refusal;
  return plugin;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

bool loader_present() {
  return dlopen("libze_loader.so.1", RTLD_LAZY | RTLD_LOCAL) != nullptr;
}

// An Intel GPU driver the loader would find (compute-runtime's), or a driver named by hand.
bool driver_present() {
  return std::getenv("ZE_ENABLE_ALT_DRIVERS") != nullptr ||
         dlopen("libze_intel_gpu.so.1", RTLD_LAZY | RTLD_LOCAL) != nullptr;
}

TEST(LevelZeroPlugin, LoadsAndNegotiatesTheAbi) {
  auto plugin = load_level_zero();
  ASSERT_NE(plugin, nullptr);
  EXPECT_EQ(plugin->name(), "level_zero");
  EXPECT_TRUE(contains(plugin->version(), "+ze1.")) << plugin->version();
  const hm_device_plugin_api& api = plugin->api();
  EXPECT_EQ(api.struct_size, sizeof(hm_device_plugin_api));
  EXPECT_TRUE(api.shutdown && api.stream_add_callback && api.event_elapsed_ms &&
              api.stream_write_value32 && api.stream_wait_value32 && api.ipc_export &&
              api.ipc_open && api.ipc_close);
  EXPECT_TRUE(api.dmabuf_export && api.dmabuf_release);
  EXPECT_EQ(api.get_extension, nullptr);  // no vendor extensions yet
}

TEST(LevelZeroPlugin, WithoutADriverReportsZeroDevicesAndWhy) {
  if (driver_present()) GTEST_SKIP() << "a Level Zero driver is installed or named here";
  auto plugin = load_level_zero();
  ASSERT_NE(plugin, nullptr);
  int32_t count = -1;
  ASSERT_EQ(plugin->api().device_count(&count), HM_OK);
  EXPECT_EQ(count, 0);
  const std::string reason = plugin->api().last_error();
  if (loader_present())
    EXPECT_TRUE(contains(reason,
                         "no Level Zero driver: zeInit returned "
                         "ZE_RESULT_ERROR_UNINITIALIZED (no GPU driver installed"))
        << "last_error: " << reason;
  else
    EXPECT_TRUE(contains(reason, "no Level Zero: libze_loader.so.1 not found ("))
        << "last_error: " << reason;
  // No device: every device slot refuses cleanly.
  void* ptr = nullptr;
  EXPECT_EQ(plugin->api().mem_alloc(0, 4096, HM_MEM_DEVICE, &ptr), HM_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(plugin->api().host_register(&count, sizeof count), HM_ERR_NOT_SUPPORTED);
}

// The child's side: one line describing the devices, and what a stream write answers.
TEST(LevelZeroPlugin, ChildReport) {
  if (std::getenv(kChildEnv) == nullptr) GTEST_SKIP() << "run by the stand-in cases";
  auto plugin = load_level_zero();
  ASSERT_NE(plugin, nullptr);
  const hm_device_plugin_api& api = plugin->api();
  int32_t count = 0;
  ASSERT_EQ(api.device_count(&count), HM_OK);
  std::string line = "devices=" + std::to_string(count);
  if (count > 0) {
    Device device(plugin, 0);
    line += std::string(" memops=") + (device.has(HM_CAP_STREAM_MEMOPS) ? "1" : "0");
    line += std::string(" dmabuf=") + (device.has(HM_CAP_DMABUF_EXPORT) ? "1" : "0");
    hm_stream stream = nullptr;
    void* word = nullptr;
    ASSERT_EQ(api.stream_create(0, 0, &stream), HM_OK);
    ASSERT_EQ(api.mem_alloc(0, 4096, HM_MEM_PINNED_HOST, &word), HM_OK);
    line += " write=" + std::to_string(api.stream_write_value32(stream, word, 7, 0));
    // A copy running past the end of a device allocation: refused by the plugin itself (a real
    // driver may map more than was asked, and not notice).
    void* memory = nullptr;
    ASSERT_EQ(api.mem_alloc(0, 4096, HM_MEM_DEVICE, &memory), HM_OK);
    const hm_status past = api.memcpy_async(stream, static_cast<char*>(memory) + 4080, word, 32);
    line += " past=" + std::to_string(past) +
            (contains(api.last_error(), "dst range") ? "/plugin" : "/driver");
    EXPECT_EQ(api.stream_synchronize(stream, HM_TIMEOUT_INFINITE), HM_OK);
    EXPECT_EQ(api.mem_free(memory), HM_OK);
    EXPECT_EQ(api.stream_destroy(stream), HM_OK);
    EXPECT_EQ(api.mem_free(word), HM_OK);
  }
  std::printf("REPORT %s\n", line.c_str());
}

#ifdef HETMESH_TEST_ZE_HOST_DRIVER
// The report of a child process whose Level Zero loader finds the stand-in driver.
std::string child_report(bool withhold_memory_sync, bool withhold_dmabuf = false) {
  setenv(kChildEnv, "1", 1);
  setenv("ZE_ENABLE_ALT_DRIVERS", HETMESH_TEST_ZE_HOST_DRIVER, 1);
  setenv("HETMESH_ZE_HOST_NO_MEMORY_SYNC", withhold_memory_sync ? "1" : "0", 1);
  setenv("HETMESH_ZE_HOST_NO_DMABUF", withhold_dmabuf ? "1" : "0", 1);
  ProcessResult r = run_process({self_executable(), "--gtest_filter=LevelZeroPlugin.ChildReport"},
                                std::chrono::milliseconds(60000));
  unsetenv(kChildEnv);
  unsetenv("ZE_ENABLE_ALT_DRIVERS");
  unsetenv("HETMESH_ZE_HOST_NO_MEMORY_SYNC");
  unsetenv("HETMESH_ZE_HOST_NO_DMABUF");
  EXPECT_EQ(r.exit_code, 0) << r.describe() << "\n" << r.out << r.err;
  const size_t at = r.out.find("REPORT ");
  if (at == std::string::npos) return "no report: " + r.out + r.err;
  return r.out.substr(at + 7, r.out.find('\n', at) - at - 7);
}

TEST(LevelZeroPlugin, StreamMemopsFollowTheDriversMemorySyncCalls) {
  const std::string past = " past=" + std::to_string(HM_ERR_INVALID_ARGUMENT) + "/plugin";
  EXPECT_EQ(child_report(false),
            "devices=2 memops=1 dmabuf=1 write=" + std::to_string(HM_OK) + past);
  // Without zexCommandListAppendWaitOnMemory(64) the capability is clear and the slot refuses.
  EXPECT_EQ(child_report(true),
            "devices=2 memops=0 dmabuf=1 write=" + std::to_string(HM_ERR_NOT_SUPPORTED) + past);
}

// A driver that refuses exportable allocations: HM_CAP_DMABUF_EXPORT is clear, and allocations
// are made without the export descriptor (else every allocation would fail).
TEST(LevelZeroPlugin, DmabufExportFollowsTheDriversExternalMemory) {
  EXPECT_EQ(child_report(false, true),
            "devices=2 memops=1 dmabuf=0 write=" + std::to_string(HM_OK) +
                " past=" + std::to_string(HM_ERR_INVALID_ARGUMENT) + "/plugin");
}
#endif

}  // namespace
}  // namespace hetmesh
