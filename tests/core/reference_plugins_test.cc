// What only one reference plugin does, through the device wrappers: cpu device memory the host
// can write, asic_stub's device memory the host cannot touch, its memory cap and its kernel
// launch extension; and the options each plugin's initialize() accepts or refuses.
#include "device_helpers.hpp"

#include <hetmesh/plugins/asic_stub.h>
#include <hetmesh/core/subprocess.hpp>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace hetmesh {
namespace {

using namespace std::chrono_literals;
using namespace device_test;
using test::plugin_path;
using test::ScopedEnv;
using ::testing::HasSubstr;

// ---- cpu only ----

TEST(CpuDeviceTest, DeviceMemoryIsHostAddressable) {
  auto plugin = load("cpu");
  ASSERT_NE(plugin, nullptr);
  Device device(plugin, 0);
  Buffer dev = device.allocate(kPage);
  Buffer out = device.allocate(kPage, MemoryKind::pinned_host);
  std::memset(dev.data(), 0x77, kPage);  // the host writes device memory directly
  Stream s = device.create_stream();
  s.copy(out.data(), dev.data(), kPage);
  s.synchronize();
  EXPECT_EQ(bytes(out)[kPage - 1], 0x77);
}

// ---- asic_stub only ----

class AsicStubTest : public ::testing::Test {
 protected:
  void SetUp() override {
    plugin_ = load("asic_stub");
    ASSERT_NE(plugin_, nullptr);
    ASSERT_EQ(plugin_->device_count(), 2);
  }
  std::shared_ptr<Plugin> plugin_;
};

using AsicStubDeathTest = AsicStubTest;

TEST_F(AsicStubDeathTest, HostDereferenceOfDeviceMemoryCrashes) {
  // Re-execute for the death test rather than fork a process that has stream threads; and let the
  // signal end the child even under AddressSanitizer.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  ScopedEnv asan("ASAN_OPTIONS", test::asan_options_keeping_segv());
  Device device(plugin_, 0);
  Buffer dev = device.allocate(kPage);
  const volatile uint8_t* p = bytes(dev);
  EXPECT_EXIT(
      {
        uint8_t value = p[0];
        std::fprintf(stderr, "read %u from device memory\n", value);
        std::_Exit(0);
      },
      ::testing::KilledBySignal(SIGSEGV), "");
}

TEST_F(AsicStubTest, AllocatingMoreThanTotalMemoryFails) {
  Device device(plugin_, 1);
  const uint64_t total = device.properties().total_memory;
  ASSERT_GT(total, 0u);
  EXPECT_THAT(error_of([&] { device.allocate(total + 1); }, HM_ERR_OUT_OF_MEMORY),
              HasSubstr("bytes requested"));

  // The failed request reserved nothing; a full-size allocation then exhausts the device until
  // it is freed. (memfd pages are only reserved, never touched.)
  Buffer all = device.allocate(total);
  EXPECT_THAT(error_of([&] { device.allocate(1); }, HM_ERR_OUT_OF_MEMORY),
              HasSubstr("bytes requested"));
  all.reset();
  Buffer one = device.allocate(1);
  EXPECT_TRUE(one);
  // Pinned host memory does not count against device memory.
  Buffer pinned = device.allocate(kPage, MemoryKind::pinned_host);
  EXPECT_TRUE(pinned);
}

struct ScaleArgs {
  uint64_t count;
  float factor;
};

void scale_kernel(void* const* buffers, size_t buffer_count, const void* args) {
  const auto* a = static_cast<const ScaleArgs*>(args);
  if (buffer_count != 1) return;
  auto* x = static_cast<float*>(buffers[0]);
  for (uint64_t i = 0; i < a->count; ++i)
    x[i] *= a->factor;
}

TEST_F(AsicStubTest, LaunchExtensionRunsAKernelOnDeviceMemory) {
  Device device(plugin_, 0);
  const void* table = nullptr;
  plugin_->check(device.api().get_extension(HM_ASIC_STUB_LAUNCH_EXTENSION,
                                            HM_ASIC_STUB_LAUNCH_VERSION, &table),
                 "get_extension");
  ASSERT_NE(table, nullptr);
  const auto* ext = static_cast<const hm_asic_stub_launch_ext*>(table);
  EXPECT_GE(ext->header.struct_size, sizeof(hm_asic_stub_launch_ext));
  EXPECT_EQ(ext->header.version, HM_ASIC_STUB_LAUNCH_VERSION);

  constexpr uint64_t kCount = 1000;
  const uint64_t size = kCount * sizeof(float);
  Buffer dev = device.allocate(size);
  Buffer in = device.allocate(size, MemoryKind::pinned_host);
  Buffer out = device.allocate(size, MemoryKind::pinned_host);
  auto* input = static_cast<float*>(in.data());
  for (uint64_t i = 0; i < kCount; ++i)
    input[i] = static_cast<float>(i) * 0.5f - 100.0f;
  Stream s = device.create_stream();

  s.copy(dev.data(), in.data(), size);
  ScaleArgs args{kCount, 2.0f};
  void* buffers[] = {dev.data()};
  uint64_t sizes[] = {size};
  plugin_->check(ext->launch(s.native(), scale_kernel, buffers, sizes, 1, &args, sizeof args),
                 "launch");
  args.factor = 100.0f;  // the arguments were copied at launch
  s.copy(out.data(), dev.data(), size);
  s.synchronize();
  const auto* result = static_cast<const float*>(out.data());
  for (uint64_t i = 0; i < kCount; ++i)
    ASSERT_EQ(result[i], 2.0f * input[i]) << "at " << i;

  // Only memory of this plugin can be handed to a kernel.
  std::vector<float> plain(kCount);
  void* plain_buffers[] = {plain.data()};
  EXPECT_EQ(ext->launch(s.native(), scale_kernel, plain_buffers, sizes, 1, &args, sizeof args),
            HM_ERR_INVALID_ARGUMENT);
}

TEST_F(AsicStubTest, UnknownOrNewerExtensionsAreNotSupported) {
  const void* table = nullptr;
  EXPECT_EQ(plugin_->api().get_extension("hm.asic_stub.nosuch", 1, &table), HM_ERR_NOT_SUPPORTED);
  EXPECT_EQ(plugin_->api().get_extension(HM_ASIC_STUB_LAUNCH_EXTENSION,
                                         HM_ASIC_STUB_LAUNCH_VERSION + 1, &table),
            HM_ERR_NOT_SUPPORTED);
  EXPECT_EQ(table, nullptr);

  // The cpu plugin has no extensions: its slot is NULL, which the ABI reads as NOT_SUPPORTED.
  auto cpu = load("cpu");
  ASSERT_NE(cpu, nullptr);
  EXPECT_EQ(cpu->api().get_extension, nullptr);
}

// Plugin options are read by initialize(), which runs once per process, so option errors are
// checked in a fresh process: the isolation probe.
ProcessResult probe(const std::string& plugin, const std::string& options) {
  return run_process({test::probe_path(), plugin_path(plugin), options}, 60s);
}

TEST(PluginOptionsTest, UnknownOptionFailsInitialize) {
  ProcessResult r = probe("asic_stub", "bogus=1");
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.signal, 0);
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("initialize() failed with HM_ERR_INVALID_ARGUMENT"));
  EXPECT_THAT(r.out, HasSubstr("unknown option 'bogus'"));

  ProcessResult cpu = probe("cpu", "bogus=1");
  EXPECT_EQ(cpu.exit_code, 1) << cpu.out << cpu.err;
  EXPECT_THAT(cpu.out, HasSubstr("unknown option 'bogus'"));
}

TEST(PluginOptionsTest, MalformedOptionValuesFailInitialize) {
  ProcessResult r = probe("asic_stub", "devices=many");
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("option devices='many' is not a non-negative number"));

  ProcessResult no_equals = probe("asic_stub", "devices");
  EXPECT_EQ(no_equals.exit_code, 1) << no_equals.out << no_equals.err;
  EXPECT_THAT(no_equals.out, HasSubstr("is not of the form key=value"));
}

TEST(PluginOptionsTest, KnownOptionsAreAccepted) {
  ProcessResult r = probe("asic_stub", "devices=3;memory_mib=64;copy_bandwidth_gbps=0");
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(r.out, "ok asic_stub\n");
}

}  // namespace
}  // namespace hetmesh
