// The rocm plugin's side of the table: its HIP calls for the kit's GPU layer
// (hetmesh/plugin_kit/gpu_vendor.hpp says what each does), and the slots it writes itself;
// rocm_plugin.cc puts them in the table. Internal to the plugin: hidden, never exported.
#pragma once

#include "rocm_state.hpp"

#include <hetmesh/device_plugin.h>
#include <hetmesh/plugin_kit/gpu_vendor.hpp>

namespace hm::rocm {

// Each call is defined in the file of its group: rocm_devices.cc (initialize), rocm_streams.cc,
// rocm_memops.cc, rocm_events.cc, rocm_memory.cc and rocm_ipc.cc.
struct Vendor : hm::kit::gpu::VendorBase<State, Stream, Event, DeviceScope, hipIpcMemHandle_t> {
  // EQ, AND and NOR with a full mask are exactly the ABI's conditions; GEQ goes through the relay.
  static constexpr hm::kit::gpu::VendorInfo kInfo = {
      .name = "rocm",
      .runtime = "HIP",
      .vendor = "AMD",
      .dlpack = HM_DLPACK_ROCM,
      .ipc_magic = 0x4d434f52,  // "ROCM"
      .wait_flags = {hipStreamWaitValueGte, hipStreamWaitValueEq, hipStreamWaitValueAnd,
                     hipStreamWaitValueNor}};
  HM_KIT_GPU_VENDOR_CALLS
};

// rocm_devices.cc
hm_status shutdown();

// rocm_dmabuf.cc
hm_status dmabuf_export(const void* ptr, uint64_t size, hm_dmabuf* out);
hm_status dmabuf_release(const hm_dmabuf* dmabuf);

}  // namespace hm::rocm
