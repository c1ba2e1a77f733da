// The plugin loader against real plugins: the reference plugins, the deliberately broken ABI test
// plugins of sdk/cts/abi_plugins, discovery through the environment, and device selectors.
//
// The loader initializes each shared object once per process and remembers refusals, so every
// assertion here holds whichever tests ran before in the same process.
#include "test_support.hpp"

#include <hetmesh/core/device.hpp>
#include <hetmesh/core/plugin.hpp>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <filesystem>
#include <string>
#include <vector>

namespace hetmesh {
namespace {

using test::cts_plugin_path;
using test::error_of;
using test::plugin_path;
using test::ScopedEnv;
using test::TempDir;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// Every test starts without the discovery variables of the environment that runs it.
class LoaderTest : public ::testing::Test {
 private:
  ScopedEnv plugins_{"HETMESH_PLUGINS", std::nullopt};
  ScopedEnv plugin_path_{"HETMESH_PLUGIN_PATH", std::nullopt};
  ScopedEnv stub_devices_{"HETMESH_ASIC_STUB_DEVICES", std::nullopt};
};

PluginLoadOptions only(std::vector<std::string> paths, bool isolate = false) {
  PluginLoadOptions options;
  options.explicit_paths = std::move(paths);
  options.search = false;
  options.isolate = isolate;
  return options;
}

std::vector<std::string> names(const PluginRegistry& registry) {
  std::vector<std::string> all;
  for (const auto& p : registry.plugins())
    all.push_back(p->name());
  return all;
}

TEST_F(LoaderTest, LoadsTheCpuPlugin) {
  std::string refusal;
  auto cpu = load_plugin_file(plugin_path("cpu"), "", &refusal);
  ASSERT_NE(cpu, nullptr) << refusal;
  EXPECT_EQ(cpu->name(), "cpu");
  EXPECT_EQ(cpu->device_count(), 1);
  EXPECT_EQ(cpu->plugin_abi_minor(), static_cast<uint32_t>(HM_DEVICE_PLUGIN_ABI_MINOR));
  EXPECT_EQ(cpu->negotiated_abi_minor(), static_cast<uint32_t>(HM_DEVICE_PLUGIN_ABI_MINOR));
  EXPECT_FALSE(cpu->version().empty());
  EXPECT_EQ(cpu->api().struct_size, sizeof(hm_device_plugin_api));
  EXPECT_EQ(cpu->api().abi_major, static_cast<uint32_t>(HM_DEVICE_PLUGIN_ABI_MAJOR));
}

TEST_F(LoaderTest, LoadsTheAsicStubPluginWithDefaultDevices) {
  std::string refusal;
  auto stub = load_plugin_file(plugin_path("asic_stub"), "", &refusal);
  ASSERT_NE(stub, nullptr) << refusal;
  EXPECT_EQ(stub->name(), "asic_stub");
  EXPECT_EQ(stub->device_count(), 2);
  EXPECT_NE(stub->api().get_extension, nullptr);
  EXPECT_EQ(stub->api().host_register, nullptr);  // optional slot left NULL by asic_stub
}

TEST_F(LoaderTest, LoadingAFileTwiceReturnsTheSamePlugin) {
  std::string refusal;
  auto first = load_plugin_file(plugin_path("cpu"), "", &refusal);
  auto second = load_plugin_file(plugin_path("cpu"), "", &refusal);
  ASSERT_NE(first, nullptr) << refusal;
  EXPECT_EQ(first.get(), second.get());
}

TEST_F(LoaderTest, NonexistentPathIsRefusedByDlopen) {
  std::string path = "/nonexistent-hetmesh-dir/libhetmesh-device-nope.so";
  std::string refusal;
  EXPECT_EQ(load_plugin_file(path, "", &refusal), nullptr);
  EXPECT_THAT(refusal, StartsWith("dlopen failed: "));
  EXPECT_THAT(refusal, HasSubstr(path));

  PluginRegistry registry = PluginRegistry::load(only({path}));
  EXPECT_TRUE(registry.plugins().empty());
  ASSERT_EQ(registry.refused().size(), 1u);
  EXPECT_EQ(registry.refused()[0].path, path);
  EXPECT_THAT(registry.refused()[0].reason, HasSubstr("dlopen failed"));
}

// ---- the broken plugins of sdk/cts/abi_plugins ----

struct BrokenPlugin {
  const char* name;
  std::vector<std::string> reason_contains;
};

void PrintTo(const BrokenPlugin& p, std::ostream* os) {
  *os << p.name;
}

std::vector<BrokenPlugin> broken_plugins() {
  return {
      {"abi_wrong_major", {"ABI major version 2 is not supported", "this host speaks 1."}},
      {"abi_short_table",
       {"table struct_size " + std::to_string(offsetof(hm_device_plugin_api, stream_wait_event)),
        "shorter than the " + std::to_string(HM_DEVICE_PLUGIN_API_MIN_SIZE) + " bytes"}},
      {"abi_missing_slot", {"required slot 'memcpy_async' is NULL"}},
      {"abi_init_fails",
       {"initialize() failed with HM_ERR_BACKEND: simulated driver failure: no such device"}},
      {"abi_no_entry", {"does not export hm_device_plugin_v1"}},
  };
}

class BrokenPluginTest : public LoaderTest, public ::testing::WithParamInterface<BrokenPlugin> {};

TEST_P(BrokenPluginTest, IsRefusedWithItsCause) {
  const BrokenPlugin& broken = GetParam();
  std::string path = cts_plugin_path(broken.name);
  ASSERT_TRUE(std::filesystem::exists(path)) << path;
  std::string refusal;
  EXPECT_EQ(load_plugin_file(path, "", &refusal), nullptr);
  for (const auto& part : broken.reason_contains)
    EXPECT_THAT(refusal, HasSubstr(part));

  // The refusal is remembered: a second load gives the same answer without re-running anything.
  std::string again;
  EXPECT_EQ(load_plugin_file(path, "", &again), nullptr);
  EXPECT_EQ(again, refusal);
}

TEST_P(BrokenPluginTest, RegistryRefusesItWithItsPathAndKeepsTheOthers) {
  const BrokenPlugin& broken = GetParam();
  std::string path = cts_plugin_path(broken.name);
  PluginRegistry registry = PluginRegistry::load(only({plugin_path("cpu"), path}));
  EXPECT_EQ(names(registry), std::vector<std::string>{"cpu"});
  ASSERT_EQ(registry.refused().size(), 1u);
  EXPECT_EQ(registry.refused()[0].path, path);
  for (const auto& part : broken.reason_contains)
    EXPECT_THAT(registry.refused()[0].reason, HasSubstr(part));

  // Asking for its device names the file and the reason.
  std::string message =
      error_of([&] { registry.device(std::string(broken.name) + ":0"); }, HM_ERR_INVALID_ARGUMENT);
  EXPECT_THAT(message, HasSubstr("was refused"));
  EXPECT_THAT(message, HasSubstr(path));
  EXPECT_THAT(message, HasSubstr(broken.reason_contains[0]));
}

TEST_P(BrokenPluginTest, IsolatedProbeRefusesItWithTheSameCause) {
  const BrokenPlugin& broken = GetParam();
  PluginRegistry registry = PluginRegistry::load(only({cts_plugin_path(broken.name)}, true));
  EXPECT_TRUE(registry.plugins().empty());
  ASSERT_EQ(registry.refused().size(), 1u);
  for (const auto& part : broken.reason_contains)
    EXPECT_THAT(registry.refused()[0].reason, HasSubstr(part));
}

INSTANTIATE_TEST_SUITE_P(AbiPlugins, BrokenPluginTest, ::testing::ValuesIn(broken_plugins()),
                         [](const auto& test) { return std::string(test.param.name); });

TEST_F(LoaderTest, CrashInInitializeIsRefusedWhenIsolated) {
  std::string path = cts_plugin_path("abi_init_crashes");
  ASSERT_TRUE(std::filesystem::exists(path)) << path;
  PluginRegistry registry = PluginRegistry::load(only({path, plugin_path("cpu")}, true));
  // This process is still alive, and the good plugin after the bad one still loads.
  EXPECT_EQ(names(registry), std::vector<std::string>{"cpu"});
  ASSERT_EQ(registry.refused().size(), 1u);
  EXPECT_EQ(registry.refused()[0].path, path);
  EXPECT_THAT(registry.refused()[0].reason, HasSubstr("crashed the probe process"));
  EXPECT_THAT(registry.refused()[0].reason, HasSubstr("signal 11"));
  EXPECT_THAT(registry.refused()[0].reason,
              HasSubstr("it said: abi_init_crashes: writing through a null pointer"));
}

TEST_F(LoaderTest, NewerMinorVersionLoadsWithTheHostMinor) {
  std::string path = cts_plugin_path("abi_newer_minor");
  std::string refusal;
  auto plugin = load_plugin_file(path, "", &refusal);
  ASSERT_NE(plugin, nullptr) << refusal;
  EXPECT_EQ(plugin->name(), "abi_newer_minor");
  EXPECT_EQ(plugin->plugin_abi_minor(), static_cast<uint32_t>(HM_DEVICE_PLUGIN_ABI_MINOR + 1));
  EXPECT_EQ(plugin->negotiated_abi_minor(), static_cast<uint32_t>(HM_DEVICE_PLUGIN_ABI_MINOR));
  EXPECT_EQ(plugin->device_count(), 0);
  // The host keeps its own full-size copy of the table, without the slots from the future.
  EXPECT_EQ(plugin->api().struct_size, sizeof(hm_device_plugin_api));

  PluginRegistry registry = PluginRegistry::load(only({path}, true));
  EXPECT_EQ(names(registry), std::vector<std::string>{"abi_newer_minor"});
  EXPECT_TRUE(registry.devices().empty());
  EXPECT_THAT(error_of([&] { registry.device("abi_newer_minor"); }, HM_ERR_INVALID_ARGUMENT),
              HasSubstr("has 0 device"));
}

// ---- discovery ----

TEST_F(LoaderTest, DefaultDiscoveryFindsTheInstalledPluginsButNotTheTestPlugins) {
  PluginRegistry registry = PluginRegistry::load();
  auto loaded = names(registry);
  EXPECT_THAT(loaded, ::testing::Contains("cpu"));
  EXPECT_THAT(loaded, ::testing::Contains("asic_stub"));
  for (const auto& name : loaded)
    EXPECT_THAT(name, ::testing::Not(StartsWith("abi_")));
  for (const auto& refused : registry.refused())
    EXPECT_THAT(refused.path, ::testing::Not(HasSubstr("cts-plugins")));
  EXPECT_TRUE(std::filesystem::equivalent(installed_plugin_dir(), HETMESH_TEST_PLUGIN_DIR))
      << installed_plugin_dir();
}

TEST_F(LoaderTest, PluginPathEnvironmentVariableAddsFolders) {
  TempDir dir;
  std::filesystem::create_symlink(plugin_path("cpu"), dir.file("libhetmesh-device-cpu.so"));
  std::filesystem::create_symlink(cts_plugin_path("abi_newer_minor"),
                                  dir.file("libhetmesh-device-abi_newer_minor.so"));
  // Files that do not follow the naming pattern are not candidates.
  std::filesystem::create_symlink(cts_plugin_path("abi_init_fails"), dir.file("init_fails.so"));
  std::filesystem::create_symlink(cts_plugin_path("abi_wrong_major"),
                                  dir.file("libhetmesh-device-abi_wrong_major.so.1"));

  ScopedEnv env("HETMESH_PLUGIN_PATH", "/nonexistent-hetmesh-dir::" + dir.path().string());
  PluginRegistry registry = PluginRegistry::load();
  auto loaded = names(registry);
  EXPECT_THAT(loaded, ::testing::Contains("cpu"));
  EXPECT_THAT(loaded, ::testing::Contains("abi_newer_minor"));  // only reachable through the env
  EXPECT_THAT(loaded, ::testing::Contains("asic_stub"));        // the installed folder still counts
  for (const auto& refused : registry.refused())
    EXPECT_THAT(refused.path, ::testing::Not(StartsWith(dir.path().string())));
  EXPECT_EQ(std::count(loaded.begin(), loaded.end(), "cpu"), 1);
}

TEST_F(LoaderTest, WantedLoadsOnlyThoseFromTheFoldersAndNeverRunsTheOthers) {
  TempDir dir;
  std::filesystem::create_symlink(plugin_path("cpu"), dir.file("libhetmesh-device-cpu.so"));
  // Loaded, this one would be refused (its initialize fails): it must not even be tried.
  std::filesystem::create_symlink(cts_plugin_path("abi_init_fails"),
                                  dir.file("libhetmesh-device-abi_init_fails.so"));
  std::filesystem::create_symlink(cts_plugin_path("abi_newer_minor"),
                                  dir.file("libhetmesh-device-abi_newer_minor.so"));
  ScopedEnv env("HETMESH_PLUGIN_PATH", dir.path().string());
  PluginLoadOptions options;
  options.wanted = {"cpu", "asic_stub"};
  PluginRegistry registry = PluginRegistry::load(options);
  auto loaded = names(registry);
  std::sort(loaded.begin(), loaded.end());
  EXPECT_EQ(loaded, (std::vector<std::string>{"asic_stub", "cpu"}));  // asic_stub: installed
  EXPECT_TRUE(registry.refused().empty()) << registry.refused()[0].path;
  EXPECT_THAT(registry.searched().back(), HasSubstr("only asic_stub, cpu"));

  // An explicit path is loaded whatever is wanted, and counts as the wanted name it carries.
  options.explicit_paths = {cts_plugin_path("abi_newer_minor")};
  options.wanted = {"cpu", "abi_newer_minor"};
  loaded = names(PluginRegistry::load(options));
  std::sort(loaded.begin(), loaded.end());
  EXPECT_EQ(loaded, (std::vector<std::string>{"abi_newer_minor", "cpu"}));
}

TEST_F(LoaderTest, AWantedNameNoFileCarriesLoadsEveryFileToFindIt) {
  TempDir dir;
  // A vendor's file named otherwise than its plugin: found only by loading it.
  std::filesystem::create_symlink(cts_plugin_path("abi_newer_minor"),
                                  dir.file("libhetmesh-device-vendor_x.so"));
  ScopedEnv env("HETMESH_PLUGIN_PATH", dir.path().string());
  PluginLoadOptions options;
  options.wanted = {"abi_newer_minor"};
  PluginRegistry registry = PluginRegistry::load(options);
  EXPECT_NE(registry.find("abi_newer_minor"), nullptr);
  EXPECT_NE(registry.find("cpu"), nullptr);  // everything was loaded
}

TEST_F(LoaderTest, PluginsEnvironmentVariableIsExclusive) {
  TempDir dir;
  std::filesystem::create_symlink(cts_plugin_path("abi_newer_minor"),
                                  dir.file("libhetmesh-device-abi_newer_minor.so"));
  ScopedEnv path_env("HETMESH_PLUGIN_PATH", dir.path().string());
  ScopedEnv env("HETMESH_PLUGINS", plugin_path("cpu"));
  PluginLoadOptions options;
  options.explicit_paths = {plugin_path("asic_stub")};
  PluginRegistry registry = PluginRegistry::load(options);
  EXPECT_EQ(names(registry), std::vector<std::string>{"cpu"});
  EXPECT_TRUE(registry.refused().empty());
}

TEST_F(LoaderTest, PluginsEnvironmentVariableTakesAList) {
  ScopedEnv env("HETMESH_PLUGINS", plugin_path("asic_stub") + ":" +
                                       cts_plugin_path("abi_init_fails") + ":" +
                                       plugin_path("cpu"));
  PluginRegistry registry = PluginRegistry::load();
  EXPECT_EQ(names(registry), (std::vector<std::string>{"asic_stub", "cpu"}));
  ASSERT_EQ(registry.refused().size(), 1u);
  EXPECT_EQ(registry.refused()[0].path, cts_plugin_path("abi_init_fails"));
}

TEST_F(LoaderTest, SecondPluginWithTheSameNameIsRefused) {
  TempDir dir;
  std::string copy = dir.file("libhetmesh-device-cpu.so");
  std::filesystem::copy_file(plugin_path("cpu"), copy);
  PluginRegistry registry = PluginRegistry::load(only({plugin_path("cpu"), copy}));
  ASSERT_EQ(names(registry), std::vector<std::string>{"cpu"});
  EXPECT_NE(registry.plugins()[0]->path(), copy);
  ASSERT_EQ(registry.refused().size(), 1u);
  EXPECT_EQ(registry.refused()[0].path, copy);
  EXPECT_THAT(registry.refused()[0].reason, HasSubstr("plugin name 'cpu' is already provided by"));
  EXPECT_THAT(registry.refused()[0].reason, HasSubstr(registry.plugins()[0]->path()));
}

TEST_F(LoaderTest, SamePathTwiceLoadsOnce) {
  PluginRegistry registry = PluginRegistry::load(only({plugin_path("cpu"), plugin_path("cpu")}));
  EXPECT_EQ(names(registry), std::vector<std::string>{"cpu"});
  EXPECT_TRUE(registry.refused().empty());
}

// ---- device selectors ----

class SelectorTest : public LoaderTest {
 protected:
  PluginRegistry registry_ =
      PluginRegistry::load(only({plugin_path("cpu"), plugin_path("asic_stub")}));
};

TEST_F(SelectorTest, SelectsDevices) {
  ASSERT_EQ(names(registry_), (std::vector<std::string>{"cpu", "asic_stub"}));
  Device cpu0 = registry_.device("cpu:0");
  EXPECT_EQ(cpu0.plugin().name(), "cpu");
  EXPECT_EQ(cpu0.index(), 0);
  EXPECT_EQ(cpu0.selector(), "cpu:0");
  EXPECT_TRUE(registry_.device("cpu") == cpu0);
  Device stub1 = registry_.device("asic_stub:1");
  EXPECT_EQ(stub1.index(), 1);
  EXPECT_EQ(stub1.properties().dlpack_device_type, HM_DLPACK_EXT_DEV);

  std::vector<std::string> all;
  for (const auto& d : registry_.devices())
    all.push_back(d.selector());
  EXPECT_EQ(all, (std::vector<std::string>{"cpu:0", "asic_stub:0", "asic_stub:1"}));
}

TEST_F(SelectorTest, IndexOutOfRangeNamesTheDeviceCount) {
  std::string message = error_of([&] { registry_.device("cpu:7"); }, HM_ERR_INVALID_ARGUMENT);
  EXPECT_THAT(message, HasSubstr("'cpu:7'"));
  EXPECT_THAT(message, HasSubstr("has 1 device"));
}

TEST_F(SelectorTest, UnknownPluginNamesTheLoadedOnes) {
  std::string message = error_of([&] { registry_.device("nosuch:0"); }, HM_ERR_INVALID_ARGUMENT);
  EXPECT_THAT(message, HasSubstr("no plugin named 'nosuch'"));
  EXPECT_THAT(message, HasSubstr("loaded: cpu, asic_stub"));
}

TEST_F(SelectorTest, MalformedIndexIsRejected) {
  for (const char* selector : {"cpu:x", "cpu:", "cpu:-1", "cpu:0x1", "cpu:99999999999"}) {
    std::string message = error_of([&] { registry_.device(selector); }, HM_ERR_INVALID_ARGUMENT);
    EXPECT_THAT(message, HasSubstr("is not a device index")) << selector;
  }
}

TEST_F(SelectorTest, DeviceConstructorChecksTheIndex) {
  EXPECT_THAT(error_of([&] { Device(registry_.find("cpu"), 1); }, HM_ERR_INVALID_ARGUMENT),
              HasSubstr("device 1 does not exist"));
}

}  // namespace
}  // namespace hetmesh
