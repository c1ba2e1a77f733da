// hetmesh-cts: the device-plugin conformance kit. Shared fixtures and helpers.
//
// Tests are parameterised over the devices the real loader found (or the plugins named with
// --plugin), and over every ordered pair of them. Optional operations are gated by capability
// bits: a test needing a bit skips without it, and a companion test checks that the operation then
// really answers HM_ERR_NOT_SUPPORTED (or that its slot is NULL).
//
// Every test starts with HM_RULE("HM-R<n>"), the ABI rule (sdk/include/hetmesh/device_plugin.h)
// its checks verify; a test that checks several rules names the next one before its checks. A
// failing check is reported with the rule that was named last.
#pragma once

#include <hetmesh/core/device.hpp>
#include <hetmesh/core/plugin.hpp>

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace hetmesh::cts {

// What main() loaded, available to test registration and bodies.
struct Environment {
  PluginRegistry registry;
  std::vector<Device> devices;
  std::string self;  // path of this executable, for cross-process tests
  // Extension names whose tables are checked where a plugin answers them (HM-R41): hetmesh's own
  // plugins' and those named with --extension.
  std::vector<std::string> extensions = {"hm.asic_stub.launch", "hm.cuda.native", "hm.rocm.native"};
};
Environment& env();

struct DeviceParam {
  size_t index;  // into env().devices
};
struct PairParam {
  size_t a, b;
};

// Readable parameters in gtest messages.
void PrintTo(const DeviceParam& param, std::ostream* out);
void PrintTo(const PairParam& param, std::ostream* out);

std::vector<DeviceParam> device_params();
std::vector<PairParam> pair_params();
std::string param_name(const testing::TestParamInfo<DeviceParam>& info);
std::string pair_name(const testing::TestParamInfo<PairParam>& info);

// Names the ABI rule that the running test's next checks verify (HM_RULE).
void check_rule(const char* id);

// "status HM_ERR_X, last_error: ..." for assertion messages.
std::string describe(const Device& device, hm_status status);

class DeviceTest : public testing::TestWithParam<DeviceParam> {
 protected:
  const Device& device() const { return env().devices.at(GetParam().index); }
  const hm_device_plugin_api& api() const { return device().api(); }
  int32_t index() const { return device().index(); }
  bool has(hm_capabilities caps) const { return device().has(caps); }
  // Why the test cannot run without `caps` (used by HM_REQUIRE).
  std::string lacks(hm_capabilities caps, const char* what) const;
  // Memory the host can read and write that this device can copy to and from: pinned memory when
  // the device offers it, plain host memory otherwise.
  void* host_buffer(uint64_t size);

 private:
  std::vector<Buffer> pinned_;
  std::vector<std::vector<uint8_t>> plain_;
};

class PairTest : public testing::TestWithParam<PairParam> {
 protected:
  const Device& a() const { return env().devices.at(GetParam().a); }
  const Device& b() const { return env().devices.at(GetParam().b); }
  bool same_plugin() const { return a().plugin_ptr() == b().plugin_ptr(); }
};

// Fills `size` bytes with a pattern derived from `seed`.
void fill_pattern(void* data, uint64_t size, uint32_t seed);
// Index of the first byte that differs from the pattern, or -1.
int64_t find_mismatch(const void* data, uint64_t size, uint32_t seed);

}  // namespace hetmesh::cts

// The ABI rule, "HM-R<n>", that the checks after it verify.
#define HM_RULE(id) ::hetmesh::cts::check_rule(id)

// Skips the current test unless the device has every bit in `caps`.
#define HM_REQUIRE(caps, what) \
  if (!has(caps)) GTEST_SKIP() << lacks((caps), (what))

// Asserts a raw slot call's exact status, printing the plugin's last_error on mismatch.
#define HM_EXPECT_STATUS(device, expected, call)                                       \
  do {                                                                                 \
    hm_status hm_status_got_ = (call);                                                 \
    EXPECT_EQ(hm_status_got_, (expected))                                              \
        << #call << " returned " << ::hetmesh::cts::describe((device), hm_status_got_) \
        << ", expected " << ::hetmesh::status_name(expected);                          \
  } while (0)
#define HM_ASSERT_OK(device, call)                                                      \
  do {                                                                                  \
    hm_status hm_status_got_ = (call);                                                  \
    ASSERT_EQ(hm_status_got_, HM_OK)                                                    \
        << #call << " returned " << ::hetmesh::cts::describe((device), hm_status_got_); \
  } while (0)
