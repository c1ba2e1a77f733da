// The plugin's ABI slots, one group per source file; rocm_plugin.cc puts them in the table.
#pragma once

#include <hetmesh/device_plugin.h>

namespace hm::rocm {

// rocm_devices.cc
hm_status initialize(const hm_host_api* host);
hm_status shutdown();
hm_status device_count(int32_t* count);
hm_status device_properties(int32_t device, hm_device_properties* props);

// rocm_memory.cc
hm_status mem_alloc(int32_t device, uint64_t size, int32_t kind, void** ptr);
hm_status mem_free(void* ptr);
hm_status pointer_query(const void* ptr, hm_pointer_info* info);
hm_status memcpy_async(hm_stream stream, void* dst, const void* src, uint64_t size);
hm_status memset_async(hm_stream stream, void* dst, int32_t value, uint64_t size);
hm_status host_register(void* ptr, uint64_t size);
hm_status host_unregister(void* ptr);

// rocm_streams.cc
hm_status stream_create(int32_t device, uint32_t flags, hm_stream* stream);
hm_status stream_destroy(hm_stream stream);
hm_status stream_synchronize(hm_stream stream, uint64_t timeout_ns);
hm_status stream_query(hm_stream stream);
hm_status stream_add_callback(hm_stream stream, hm_host_fn fn, void* user_data);

// rocm_events.cc
hm_status event_create(int32_t device, uint32_t flags, hm_event* event);
hm_status event_destroy(hm_event event);
hm_status event_record(hm_event event, hm_stream stream);
hm_status event_query(hm_event event);
hm_status event_synchronize(hm_event event, uint64_t timeout_ns);
hm_status stream_wait_event(hm_stream stream, hm_event event);
hm_status event_elapsed_ms(hm_event start, hm_event end, float* milliseconds);

// rocm_memops.cc
hm_status stream_write_value32(hm_stream stream, void* address, uint32_t value, uint32_t flags);
hm_status stream_wait_value32(hm_stream stream, const void* address, uint32_t value,
                              int32_t condition, uint32_t flags);

// rocm_ipc.cc
hm_status ipc_export(void* ptr, hm_ipc_handle* handle);
hm_status ipc_open(int32_t device, const hm_ipc_handle* handle, void** ptr);
hm_status ipc_close(void* ptr);

// rocm_dmabuf.cc
hm_status dmabuf_export(const void* ptr, uint64_t size, hm_dmabuf* out);
hm_status dmabuf_release(const hm_dmabuf* dmabuf);

}  // namespace hm::rocm
