// The cuda plugin's slot functions, declared for the table in cuda_plugin.cc and defined in one
// file per job (named below). Internal to the plugin: hidden, never exported.
#pragma once

#include <hetmesh/device_plugin.h>

#include <cstdint>

namespace hm::cuda {

// cuda_devices.cc: lifecycle and devices.
hm_status initialize(const hm_host_api* host);
hm_status shutdown();
hm_status device_count(int32_t* count);
hm_status device_properties(int32_t device, hm_device_properties* props);

// cuda_memory.cc: allocation, pointer queries, copies and fills, host registration.
hm_status mem_alloc(int32_t device, uint64_t size, int32_t kind, void** ptr);
hm_status mem_free(void* ptr);
hm_status pointer_query(const void* ptr, hm_pointer_info* info);
hm_status memcpy_async(hm_stream stream, void* dst, const void* src, uint64_t size);
hm_status memset_async(hm_stream stream, void* dst, int32_t value, uint64_t size);
hm_status host_register(void* ptr, uint64_t size);
hm_status host_unregister(void* ptr);

// cuda_streams.cc: streams, host callbacks and stream memory operations.
hm_status stream_create(int32_t device, uint32_t flags, hm_stream* out);
hm_status stream_destroy(hm_stream stream);
hm_status stream_synchronize(hm_stream stream, uint64_t timeout_ns);
hm_status stream_query(hm_stream stream);
hm_status stream_add_callback(hm_stream stream, hm_host_fn fn, void* user_data);
hm_status stream_write_value32(hm_stream stream, void* address, uint32_t value, uint32_t flags);
hm_status stream_wait_value32(hm_stream stream, const void* address, uint32_t value,
                              int32_t condition, uint32_t flags);

// cuda_events.cc: events.
hm_status event_create(int32_t device, uint32_t flags, hm_event* out);
hm_status event_destroy(hm_event event);
hm_status event_record(hm_event event, hm_stream stream);
hm_status event_query(hm_event event);
hm_status event_synchronize(hm_event event, uint64_t timeout_ns);
hm_status stream_wait_event(hm_stream stream, hm_event event);
hm_status event_elapsed_ms(hm_event start, hm_event end, float* milliseconds);

// cuda_ipc.cc: IPC and dma-buf export.
hm_status ipc_export(void* ptr, hm_ipc_handle* handle);
hm_status ipc_open(int32_t device, const hm_ipc_handle* handle, void** ptr);
hm_status ipc_close(void* ptr);
hm_status dmabuf_export(const void* ptr, uint64_t size, hm_dmabuf* out);
hm_status dmabuf_release(const hm_dmabuf* dmabuf);

}  // namespace hm::cuda
