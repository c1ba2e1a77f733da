// cuda: NVIDIA GPUs through the CUDA driver API, host code only (design: plugins/cuda/README.md).
// This file holds the vendor extensions and the slot table behind the plugin's only exported
// symbol, hm_device_plugin_v1: the kit's GPU layer over the CUDA calls in the other cuda_*.cc files
// (cuda_slots.hpp), and the slots the plugin writes itself.
#include "cuda_slots.hpp"
#include "cuda_state.hpp"

#include <hetmesh/device_plugin.h>
#include <hetmesh/plugins/cuda.h>
#include <hetmesh/plugin_kit/extension.hpp>
#include <hetmesh/plugin_kit/gpu_slots.hpp>
#include <hetmesh/plugin_kit/gpu_streams.hpp>
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

hm_status stream_borrow(int32_t device, void* cu_stream, hm_stream* out) {
  return hm::kit::gpu::stream_borrow<Vendor>(device, static_cast<CUstream>(cu_stream), out);
}

const hm_cuda_native_ext kNativeExtension = {
    {sizeof(hm_cuda_native_ext), HM_CUDA_NATIVE_VERSION}, stream_native, stream_borrow};

hm_status get_extension(const char* name, uint32_t min_version, const void** table) {
  return hm::kit::get_single_extension(name, min_version, table, HM_CUDA_NATIVE_EXTENSION,
                                       &kNativeExtension);
}

// ---- the table ----

hm_device_plugin_api make_table() {
  static char version[64];
  std::snprintf(version, sizeof version, "%s+cuda%d.%d", HETMESH_VERSION, CUDA_VERSION / 1000,
                CUDA_VERSION % 1000 / 10);
  hm_device_plugin_api t = hm::kit::gpu::gpu_plugin_table<Vendor>(version);  // named "cuda"
  t.shutdown = shutdown;
  t.dmabuf_export = dmabuf_export;
  t.dmabuf_release = hm::kit::gpu::close_dmabuf;
  t.get_extension = get_extension;
  return t;
}

}  // namespace
}  // namespace hm::cuda

extern "C" const hm_device_plugin_api* hm_device_plugin_v1(void) {
  static const hm_device_plugin_api table = hm::cuda::make_table();
  return &table;
}
