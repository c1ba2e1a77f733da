// The kit's GPU layer: the slots that a plugin over a CUDA-like runtime (streams, events, device
// and pinned memory, IPC handles, a current device) writes the same way whatever the vendor. A
// plugin supplies its vendor calls as a policy struct `V` of static members (gpu_vendor.hpp), and
// keeps the slots that really differ (dma-buf, shutdown, extensions) for itself.
#pragma once

#include "gpu_devices.hpp"
#include "gpu_events.hpp"
#include "gpu_ipc.hpp"
#include "gpu_memops.hpp"
#include "gpu_memory.hpp"
#include "gpu_streams.hpp"
#include "gpu_vendor.hpp"
#include "table.hpp"

#include <hetmesh/device_plugin.h>

namespace hm::kit::gpu {

// The plugin's table: the header (named V::kInfo.name, with the plugin's `version`, which must
// outlive the table) and every slot the GPU layer implements; the plugin adds its own slots.
template <typename V>
hm_device_plugin_api gpu_plugin_table(const char* version) {
  hm_device_plugin_api t = hm::kit::plugin_table(V::kInfo.name, version);
  t.initialize = initialize<V>;
  t.device_count = device_count<V>;
  t.device_properties = device_properties<V>;
  t.mem_alloc = mem_alloc<V>;
  t.mem_free = mem_free<V>;
  t.pointer_query = pointer_query<V>;
  t.memcpy_async = memcpy_async<V>;
  t.memset_async = memset_async<V>;
  t.stream_create = stream_create<V>;
  t.stream_destroy = stream_destroy<V>;
  t.stream_synchronize = stream_synchronize<V>;
  t.stream_query = stream_query<V>;
  t.event_create = event_create<V>;
  t.event_destroy = event_destroy<V>;
  t.event_record = event_record<V>;
  t.event_query = event_query<V>;
  t.event_synchronize = event_synchronize<V>;
  t.stream_wait_event = stream_wait_event<V>;
  t.host_register = host_register<V>;
  t.host_unregister = host_unregister<V>;
  t.stream_add_callback = stream_add_callback<V>;
  t.event_elapsed_ms = event_elapsed_ms<V>;
  t.stream_write_value32 = stream_write_value32<V>;
  t.stream_wait_value32 = stream_wait_value32<V>;
  t.ipc_export = ipc_export<V>;
  t.ipc_open = ipc_open<V>;
  t.ipc_close = ipc_close<V>;
  return t;
}

}  // namespace hm::kit::gpu
