// What the device tests share: loading a reference plugin with its defaults, the page size, and
// the message of the hetmesh::Error a call throws.
#pragma once

#include "test_support.hpp"

#include <hetmesh/core/device.hpp>
#include <hetmesh/core/plugin.hpp>

#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace hetmesh::device_test {

using test::error_of;
using test::plugin_path;
using test::ScopedEnv;

inline const uint64_t kPage = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));

inline std::shared_ptr<Plugin> load(const std::string& name) {
  // Only the first load in the process initializes the plugin; keep the defaults for that one.
  ScopedEnv devices("HETMESH_ASIC_STUB_DEVICES", std::nullopt);
  ScopedEnv memory("HETMESH_ASIC_STUB_MEMORY_MIB", std::nullopt);
  std::string refusal;
  auto plugin = load_plugin_file(plugin_path(name), "", &refusal);
  EXPECT_NE(plugin, nullptr) << name << ": " << refusal;
  return plugin;
}

inline uint8_t* bytes(const Buffer& buffer) {
  return static_cast<uint8_t*>(buffer.data());
}

}  // namespace hetmesh::device_test
