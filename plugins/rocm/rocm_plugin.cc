// rocm: AMD GPUs through the HIP runtime API. Host code only, built with g++ against the HIP
// headers (-D__HIP_PLATFORM_AMD__); libamdhip64 is loaded at initialize() (rocm_loader.cc), so the
// plugin loads anywhere and reports zero devices, with the reason in last_error, where ROCm or an
// AMD GPU is missing. plugins/rocm/README.md describes the design.
//
// This file only fills the function table: the kit's GPU layer over the HIP calls in the other
// files, and the slots the plugin writes itself (rocm_slots.hpp).
#include "rocm_slots.hpp"

#include <hetmesh/device_plugin.h>
#include <hetmesh/plugin_kit/gpu_slots.hpp>

#include <hip/hip_version.h>

#include <cstdio>

namespace {

hm_device_plugin_api make_table() {
  namespace r = hm::rocm;
  static char version[64];
  std::snprintf(version, sizeof version, "%s+hip%d.%d", HETMESH_VERSION, HIP_VERSION_MAJOR,
                HIP_VERSION_MINOR);
  hm_device_plugin_api t = hm::kit::gpu::gpu_plugin_table<r::Vendor>(version);  // named "rocm"
  t.shutdown = r::shutdown;
  t.dmabuf_export = r::dmabuf_export;
  t.dmabuf_release = r::dmabuf_release;
  // get_extension stays NULL: the rocm plugin has no vendor extensions yet.
  return t;
}

}  // namespace

extern "C" const hm_device_plugin_api* hm_device_plugin_v1(void) {
  static const hm_device_plugin_api table = make_table();
  return &table;
}
