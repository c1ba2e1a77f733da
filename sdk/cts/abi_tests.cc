// The loader's side of the ABI: deliberately broken plugins (sdk/cts/abi_plugins) must each be
// refused with a message naming the file and the reason, without harming this process.
#include "cts.hpp"

#include <hetmesh/core/log.hpp>

#include <fmt/format.h>

#include <unistd.h>

namespace hetmesh::cts {
namespace {

std::string broken_plugin(const std::string& name) {
  std::string path = fmt::format("{}/../cts-plugins/{}{}.so", installed_plugin_dir(),
                                 HM_DEVICE_PLUGIN_PREFIX, name);
  if (access(path.c_str(), R_OK) != 0)
    ADD_FAILURE() << "test plugin " << path << " is missing; the CTS install is incomplete";
  return path;
}

// While it lives, the loader's refusal of `path` is this test's subject, not a warning of the
// run: it is dropped from the log (the test checks it, and reports it if it is wrong); anything
// else the loader says still reaches stderr.
class ExpectedRefusal {
 public:
  explicit ExpectedRefusal(std::string path)
      : previous_(set_log_sink([path = std::move(path)](LogLevel, std::string_view message) {
          if (message.find("refused plugin " + path) == std::string_view::npos)
            fmt::print(stderr, "[hetmesh] {}\n", message);
        })) {}
  ~ExpectedRefusal() { set_log_sink(std::move(previous_)); }
  ExpectedRefusal(const ExpectedRefusal&) = delete;
  ExpectedRefusal& operator=(const ExpectedRefusal&) = delete;

 private:
  LogSink previous_;
};

// Loads `path` through the registry (isolated, as `hetmesh info` does) and returns its refusal.
std::string refusal_of(const std::string& path, bool isolate) {
  const ExpectedRefusal quiet(path);
  PluginLoadOptions options;
  options.explicit_paths = {path};
  options.search = false;
  options.isolate = isolate;
  options.isolate_timeout = std::chrono::seconds(60);
  PluginRegistry registry = PluginRegistry::load(options);
  EXPECT_TRUE(registry.plugins().empty()) << path << " was accepted";
  if (registry.refused().size() != 1) return "<not refused>";
  EXPECT_EQ(registry.refused()[0].path, path);
  return registry.refused()[0].reason;
}

struct BrokenCase {
  const char* plugin;
  const char* reason;  // a substring the refusal must contain
  const char* rule;    // the ABI rule the plugin breaks
};

class AbiRefusal : public testing::TestWithParam<BrokenCase> {};

TEST_P(AbiRefusal, IsRefusedWithItsReason) {
  HM_RULE(GetParam().rule);
  std::string reason = refusal_of(broken_plugin(GetParam().plugin), /*isolate=*/false);
  EXPECT_NE(reason.find(GetParam().reason), std::string::npos)
      << "refusal was: " << reason << "\nexpected it to mention: " << GetParam().reason;
}

INSTANTIATE_TEST_SUITE_P(
    Abi, AbiRefusal,
    testing::Values(BrokenCase{"abi_wrong_major", "ABI major version 2 is not supported", "HM-R3"},
                    BrokenCase{"abi_short_table", "is shorter than the", "HM-R4"},
                    BrokenCase{"abi_missing_slot", "required slot 'memcpy_async' is NULL", "HM-R4"},
                    BrokenCase{"abi_init_fails", "initialize() failed with HM_ERR_BACKEND",
                               "HM-R7"},
                    BrokenCase{"abi_no_entry", "does not export hm_device_plugin_v1", "HM-R1"}),
    [](const testing::TestParamInfo<BrokenCase>& param) {
      return std::string(param.param.plugin);
    });

TEST(Abi, CrashInInitializeIsRefusedWhenIsolated) {
  HM_RULE("HM-R10");
  std::string reason = refusal_of(broken_plugin("abi_init_crashes"), /*isolate=*/true);
  EXPECT_NE(reason.find("crashed"), std::string::npos) << reason;
  EXPECT_NE(reason.find("signal 11"), std::string::npos) << reason;
}

TEST(Abi, MissingFileIsRefusedWithDlerror) {
  HM_RULE("HM-R1");
  std::string reason = refusal_of("/nonexistent/libhetmesh-device-nothing.so", false);
  EXPECT_NE(reason.find("dlopen failed"), std::string::npos) << reason;
}

TEST(Abi, NewerMinorLoadsWithNegotiatedMinor) {
  HM_RULE("HM-R3");
  PluginLoadOptions options;
  options.explicit_paths = {broken_plugin("abi_newer_minor")};
  options.search = false;
  PluginRegistry registry = PluginRegistry::load(options);
  ASSERT_EQ(registry.plugins().size(), 1u)
      << (registry.refused().empty() ? "" : registry.refused()[0].reason);
  const Plugin& plugin = *registry.plugins()[0];
  EXPECT_EQ(plugin.plugin_abi_minor(), HM_DEVICE_PLUGIN_ABI_MINOR + 1u);
  EXPECT_EQ(plugin.negotiated_abi_minor(), static_cast<uint32_t>(HM_DEVICE_PLUGIN_ABI_MINOR));
}

}  // namespace
}  // namespace hetmesh::cts
