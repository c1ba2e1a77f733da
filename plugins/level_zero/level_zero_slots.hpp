// The level_zero plugin's side of the table: its Level Zero calls for the kit's GPU layer
// (hetmesh/plugin_kit/gpu_vendor.hpp says what each does), and the slots it writes itself;
// level_zero_plugin.cc puts them in the table. Internal to the plugin: hidden, never exported.
#pragma once

#include "level_zero_loader.hpp"
#include "level_zero_state.hpp"

#include <hetmesh/device_plugin.h>
#include <hetmesh/plugin_kit/gpu_vendor.hpp>

namespace hm::level_zero {

// A Level Zero IPC handle begins with a file descriptor of the exporting process (Intel's
// driver: a dma-buf); the importer brings it into its own process before opening the handle
// (level_zero_ipc.cc), so the handle travels with the exporter's pid.
struct IpcNative {
  ze_ipc_mem_handle_t handle;
  int32_t pid;
};

// Each call is defined in the file of its group: level_zero_devices.cc (initialize),
// level_zero_streams.cc, level_zero_memops.cc, level_zero_events.cc, level_zero_memory.cc and
// level_zero_ipc.cc.
struct Vendor : hm::kit::gpu::VendorBase<State, Stream, Event, DeviceScope, IpcNative> {
  // Only EQ is a native wait (zexCommandListAppendWaitOnMemory, EQUAL); GEQ (cyclic), AND and
  // NOR go through the kit's wait relay (level_zero_memops.cc), so their flags are unused.
  static constexpr hm::kit::gpu::VendorInfo kInfo = {
      .name = "level_zero",
      .runtime = "Level Zero",
      .vendor = "Intel",
      .dlpack = HM_DLPACK_ONEAPI,
      .ipc_magic = 0x5a454c4c,  // "LLEZ"
      .wait_flags = {0, ZEX_WAIT_ON_MEMORY_FLAG_EQUAL, 0, 0}};
  HM_KIT_GPU_VENDOR_CALLS
};

// level_zero_devices.cc
hm_status shutdown();

// level_zero_dmabuf.cc
hm_status dmabuf_export(const void* ptr, uint64_t size, hm_dmabuf* out);
// The dma-buf fd the driver answers for the allocation at `base` (the driver's own); fails without.
int driver_dmabuf_fd(const Driver& driver, const void* base);

}  // namespace hm::level_zero
