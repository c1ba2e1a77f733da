// level_zero: GPUs through Level Zero (oneAPI), host code only. libze_loader.so.1 is loaded at
// initialize() (level_zero_loader.cc), so the plugin loads anywhere and reports zero devices, with
// the reason in last_error, where Level Zero or a GPU driver is missing.
// plugins/level_zero/README.md describes the design.
//
// This file only fills the function table: the kit's GPU layer over the Level Zero calls in the
// other files, and the slots the plugin writes itself (level_zero_slots.hpp).
#include "level_zero_slots.hpp"

#include <hetmesh/device_plugin.h>
#include <hetmesh/plugin_kit/gpu_slots.hpp>

#include <cstdio>

namespace {

hm_device_plugin_api make_table() {
  namespace l = hm::level_zero;
  static char version[64];
  // The Level Zero headers the plugin was built against (Debian 12's libze-dev: spec 1.4).
  std::snprintf(version, sizeof version, "%s+ze%d.%d", HETMESH_VERSION,
                ZE_MAJOR_VERSION(ZE_API_VERSION_CURRENT), ZE_MINOR_VERSION(ZE_API_VERSION_CURRENT));
  hm_device_plugin_api t = hm::kit::gpu::gpu_plugin_table<l::Vendor>(version);  // "level_zero"
  t.shutdown = l::shutdown;
  t.dmabuf_export = l::dmabuf_export;
  t.dmabuf_release = hm::kit::gpu::close_dmabuf;
  // get_extension stays NULL: no vendor extensions yet.
  return t;
}

}  // namespace

extern "C" const hm_device_plugin_api* hm_device_plugin_v1(void) {
  static const hm_device_plugin_api table = make_table();
  return &table;
}
