// The start of a plugin's function table: the header the host checks before it calls any slot
// (struct_size, abi_major, abi_minor, name, version) and the kit's last_error slot. Every plugin
// writes these the same way, so they are written once here; the plugin then sets its own slots.
#pragma once

#include <hetmesh/device_plugin.h>
#include <hetmesh/plugin_kit/status.hpp>

namespace hm::kit {

// A table of this SDK's size and ABI version, with `name` and `version` (both must outlive the
// table: string literals or static storage), last_error from status.hpp, and every other slot
// NULL.
inline hm_device_plugin_api plugin_table(const char* name, const char* version) {
  hm_device_plugin_api t{};
  t.struct_size = sizeof t;
  t.abi_major = HM_DEVICE_PLUGIN_ABI_MAJOR;
  t.abi_minor = HM_DEVICE_PLUGIN_ABI_MINOR;
  t.name = name;
  t.version = version;
  t.last_error = hm::kit::last_error;
  return t;
}

}  // namespace hm::kit
