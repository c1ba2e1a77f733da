// The cuda plugin's side of the table: its CUDA calls for the kit's GPU layer
// (hetmesh/plugin_kit/gpu_vendor.hpp says what each does), and the slots it writes itself;
// cuda_plugin.cc puts them in the table. Internal to the plugin: hidden, never exported.
#pragma once

#include "cuda_state.hpp"

#include <hetmesh/device_plugin.h>
#include <hetmesh/plugin_kit/gpu_vendor.hpp>

namespace hm::cuda {

// Each call is defined in the file of its group: cuda_devices.cc (initialize), cuda_streams.cc,
// cuda_memops.cc, cuda_events.cc, cuda_memory.cc and cuda_ipc.cc.
struct Vendor : hm::kit::gpu::VendorBase<State, Stream, Event, ContextScope, CUipcMemHandle> {
  // CUDA's GEQ is the cyclic (int32_t)(*addr - value) >= 0, as the ABI's.
  static constexpr hm::kit::gpu::VendorInfo kInfo = {
      .name = "cuda",
      .runtime = "CUDA",
      .vendor = "NVIDIA",
      .dlpack = HM_DLPACK_CUDA,
      .ipc_magic = 0x41445543,  // "CUDA"
      .wait_flags = {CU_STREAM_WAIT_VALUE_GEQ, CU_STREAM_WAIT_VALUE_EQ, CU_STREAM_WAIT_VALUE_AND,
                     CU_STREAM_WAIT_VALUE_NOR}};
  HM_KIT_GPU_VENDOR_CALLS
};

// cuda_devices.cc
hm_status shutdown();

// cuda_dmabuf.cc
hm_status dmabuf_export(const void* ptr, uint64_t size, hm_dmabuf* out);

}  // namespace hm::cuda
