// rocm: AMD GPUs through the HIP runtime API. Host code only, built with g++ against the HIP
// headers (-D__HIP_PLATFORM_AMD__); libamdhip64 is loaded at initialize() (hip_runtime.cc), so the
// plugin loads anywhere and reports zero devices, with the reason in last_error, where ROCm or an
// AMD GPU is missing. plugins/rocm/README.md describes the design.
//
// This file only fills the function table; each group of slots has its own file (slots.hpp).
#include "slots.hpp"

#include <hetmesh/device_plugin.h>
#include <hetmesh/plugin_kit/status.hpp>

#include <hip/hip_version.h>

#include <cstdio>

namespace {

hm_device_plugin_api make_table() {
  namespace r = hm::rocm;
  static char version[64];
  std::snprintf(version, sizeof version, "%s+hip%d.%d", HETMESH_VERSION, HIP_VERSION_MAJOR,
                HIP_VERSION_MINOR);
  hm_device_plugin_api t{};
  t.struct_size = sizeof t;
  t.abi_major = HM_DEVICE_PLUGIN_ABI_MAJOR;
  t.abi_minor = HM_DEVICE_PLUGIN_ABI_MINOR;
  t.name = "rocm";
  t.version = version;
  t.initialize = r::initialize;
  t.last_error = hm::kit::last_error;
  t.device_count = r::device_count;
  t.device_properties = r::device_properties;
  t.mem_alloc = r::mem_alloc;
  t.mem_free = r::mem_free;
  t.pointer_query = r::pointer_query;
  t.memcpy_async = r::memcpy_async;
  t.memset_async = r::memset_async;
  t.stream_create = r::stream_create;
  t.stream_destroy = r::stream_destroy;
  t.stream_synchronize = r::stream_synchronize;
  t.stream_query = r::stream_query;
  t.event_create = r::event_create;
  t.event_destroy = r::event_destroy;
  t.event_record = r::event_record;
  t.event_query = r::event_query;
  t.event_synchronize = r::event_synchronize;
  t.stream_wait_event = r::stream_wait_event;
  t.shutdown = r::shutdown;
  t.host_register = r::host_register;
  t.host_unregister = r::host_unregister;
  t.stream_add_callback = r::stream_add_callback;
  t.event_elapsed_ms = r::event_elapsed_ms;
  t.stream_write_value32 = r::stream_write_value32;
  t.stream_wait_value32 = r::stream_wait_value32;
  t.ipc_export = r::ipc_export;
  t.ipc_open = r::ipc_open;
  t.ipc_close = r::ipc_close;
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
