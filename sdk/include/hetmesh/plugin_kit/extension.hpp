// The get_extension slot of a plugin with one named extension: checks the arguments, the name and
// the version, and answers the table or HM_ERR_NOT_SUPPORTED with the reason.
#pragma once

#include <hetmesh/device_plugin.h>
#include <hetmesh/plugin_kit/status.hpp>

#include <cstring>

namespace hm::kit {

// `extension` is the plugin's static table; its header carries the version offered.
inline hm_status get_single_extension(const char* name, uint32_t min_version, const void** table,
                                      const char* extension_name, const void* extension) {
  return guarded("get_extension", [&] {
    if (name == nullptr || table == nullptr) fail(HM_ERR_INVALID_ARGUMENT, "name or table is NULL");
    if (std::strcmp(name, extension_name) != 0)
      fail(HM_ERR_NOT_SUPPORTED, "no extension named '%s'", name);
    uint32_t version = static_cast<const hm_extension_header*>(extension)->version;
    if (min_version > version)
      fail(HM_ERR_NOT_SUPPORTED, "'%s' version %u requested, this plugin has %u", name, min_version,
           version);
    *table = extension;
  });
}

}  // namespace hm::kit
