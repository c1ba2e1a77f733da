// cuda: NVIDIA GPUs through the CUDA driver API, host code only (design: plugins/cuda/README.md).
// This file holds the vendor extensions and the slot table behind the plugin's only exported
// symbol, hm_device_plugin_v1; the slots live in the other cuda_*.cc files (cuda_slots.hpp).
#include "cuda_slots.hpp"
#include "cuda_state.hpp"

#include <hetmesh/cuda.h>
#include <hetmesh/device_plugin.h>
#include <hetmesh/plugin_kit/extension.hpp>
#include <hetmesh/plugin_kit/status.hpp>

#include <cstdio>
#include <cstring>

namespace hm::cuda {
namespace {

// ---- extensions ----

hm_status stream_native(hm_stream stream, void** cu_stream, int32_t* cuda_ordinal) {
  return guarded("hm.cuda.native.stream_native", [&] {
    if (cu_stream == nullptr || cuda_ordinal == nullptr)
      fail(HM_ERR_INVALID_ARGUMENT, "cu_stream or cuda_ordinal is NULL");
    Stream& s = stream_of(stream);
    *cu_stream = s.stream;
    *cuda_ordinal = static_cast<int32_t>(device_state(s.device).handle);
  });
}

const hm_cuda_native_ext kNativeExtension = {{sizeof(hm_cuda_native_ext), HM_CUDA_NATIVE_VERSION},
                                             stream_native};

hm_status get_extension(const char* name, uint32_t min_version, const void** table) {
  return hm::kit::get_single_extension(name, min_version, table, HM_CUDA_NATIVE_EXTENSION,
                                       &kNativeExtension);
}

// ---- the table ----

hm_device_plugin_api make_table() {
  static char version[64];
  std::snprintf(version, sizeof version, "%s+cuda%d.%d", HETMESH_VERSION, CUDA_VERSION / 1000,
                CUDA_VERSION % 1000 / 10);
  hm_device_plugin_api t{};
  t.struct_size = sizeof t;
  t.abi_major = HM_DEVICE_PLUGIN_ABI_MAJOR;
  t.abi_minor = HM_DEVICE_PLUGIN_ABI_MINOR;
  t.name = "cuda";
  t.version = version;
  t.initialize = initialize;
  t.last_error = hm::kit::last_error;
  t.device_count = device_count;
  t.device_properties = device_properties;
  t.mem_alloc = mem_alloc;
  t.mem_free = mem_free;
  t.pointer_query = pointer_query;
  t.memcpy_async = memcpy_async;
  t.memset_async = memset_async;
  t.stream_create = stream_create;
  t.stream_destroy = stream_destroy;
  t.stream_synchronize = stream_synchronize;
  t.stream_query = stream_query;
  t.event_create = event_create;
  t.event_destroy = event_destroy;
  t.event_record = event_record;
  t.event_query = event_query;
  t.event_synchronize = event_synchronize;
  t.stream_wait_event = stream_wait_event;
  t.shutdown = shutdown;
  t.host_register = host_register;
  t.host_unregister = host_unregister;
  t.stream_add_callback = stream_add_callback;
  t.event_elapsed_ms = event_elapsed_ms;
  t.stream_write_value32 = stream_write_value32;
  t.stream_wait_value32 = stream_wait_value32;
  t.ipc_export = ipc_export;
  t.ipc_open = ipc_open;
  t.ipc_close = ipc_close;
  t.dmabuf_export = dmabuf_export;
  t.dmabuf_release = dmabuf_release;
  t.get_extension = get_extension;
  return t;
}

}  // namespace
}  // namespace hm::cuda

extern "C" const hm_device_plugin_api* hm_device_plugin_v1(void) {
  static const hm_device_plugin_api table = hm::cuda::make_table();
  return &table;
}
