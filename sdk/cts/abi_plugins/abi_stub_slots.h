/*
 * Shared by the deliberately broken ABI test plugins in this folder (see CMakeLists.txt): trivial
 * required slots for a plugin with zero devices, so that each test plugin differs from a loadable
 * one in exactly the way its file says. Not a model for real plugins: see sdk/template.
 */
#ifndef HETMESH_CTS_ABI_STUB_SLOTS_H_
#define HETMESH_CTS_ABI_STUB_SLOTS_H_

#include <hetmesh/device_plugin.h>

#include <stddef.h>

static _Thread_local const char* abi_stub_error = "";

static inline hm_status abi_stub_fail(hm_status status, const char* message) {
  abi_stub_error = message;
  return status;
}

static inline const char* abi_stub_last_error(void) {
  return abi_stub_error;
}

/* Succeeds with zero devices; refuses a missing host table and any option, as the ABI asks. */
static inline hm_status abi_stub_initialize(const hm_host_api* host) {
  if (host == NULL || host->struct_size < HM_HOST_API_SIZE_V1)
    return abi_stub_fail(HM_ERR_INVALID_ARGUMENT, "initialize: host is NULL or too small");
  if (host->options != NULL && host->options[0] != '\0')
    return abi_stub_fail(HM_ERR_INVALID_ARGUMENT, "initialize: this plugin takes no options");
  return HM_OK;
}

static inline hm_status abi_stub_device_count(int32_t* count) {
  if (count == NULL) return abi_stub_fail(HM_ERR_INVALID_ARGUMENT, "device_count: count is NULL");
  *count = 0;
  return HM_OK;
}

static inline hm_status abi_stub_device_properties(int32_t device, hm_device_properties* props) {
  (void)device;
  (void)props;
  return abi_stub_fail(HM_ERR_INVALID_ARGUMENT, "device_properties: this plugin has no devices");
}

static inline hm_status abi_stub_mem_alloc(int32_t device, uint64_t size, int32_t kind,
                                           void** ptr) {
  (void)device;
  (void)size;
  (void)kind;
  (void)ptr;
  return abi_stub_fail(HM_ERR_INVALID_ARGUMENT, "mem_alloc: this plugin has no devices");
}

static inline hm_status abi_stub_mem_free(void* ptr) {
  if (ptr == NULL) return HM_OK;
  return abi_stub_fail(HM_ERR_INVALID_ARGUMENT, "mem_free: not memory of this plugin");
}

static inline hm_status abi_stub_pointer_query(const void* ptr, hm_pointer_info* info) {
  (void)ptr;
  if (info == NULL || info->struct_size < HM_POINTER_INFO_SIZE_V1)
    return abi_stub_fail(HM_ERR_INVALID_ARGUMENT, "pointer_query: info is NULL or too small");
  info->kind = HM_MEM_UNKNOWN;
  info->device = -1;
  info->base = NULL;
  info->size = 0;
  return HM_OK;
}

/* No stream or event can exist, so every handle is invalid. */
static inline hm_status abi_stub_no_handle(const char* message) {
  return abi_stub_fail(HM_ERR_INVALID_HANDLE, message);
}

static inline hm_status abi_stub_memcpy_async(hm_stream stream, void* dst, const void* src,
                                              uint64_t size) {
  (void)stream;
  (void)dst;
  (void)src;
  (void)size;
  return abi_stub_no_handle("memcpy_async: not a stream of this plugin");
}

static inline hm_status abi_stub_memset_async(hm_stream stream, void* dst, int32_t value,
                                              uint64_t size) {
  (void)stream;
  (void)dst;
  (void)value;
  (void)size;
  return abi_stub_no_handle("memset_async: not a stream of this plugin");
}

static inline hm_status abi_stub_stream_create(int32_t device, uint32_t flags, hm_stream* stream) {
  (void)device;
  (void)flags;
  (void)stream;
  return abi_stub_fail(HM_ERR_INVALID_ARGUMENT, "stream_create: this plugin has no devices");
}

static inline hm_status abi_stub_stream_destroy(hm_stream stream) {
  (void)stream;
  return abi_stub_no_handle("stream_destroy: not a stream of this plugin");
}

static inline hm_status abi_stub_stream_synchronize(hm_stream stream, uint64_t timeout_ns) {
  (void)stream;
  (void)timeout_ns;
  return abi_stub_no_handle("stream_synchronize: not a stream of this plugin");
}

static inline hm_status abi_stub_stream_query(hm_stream stream) {
  (void)stream;
  return abi_stub_no_handle("stream_query: not a stream of this plugin");
}

static inline hm_status abi_stub_event_create(int32_t device, uint32_t flags, hm_event* event) {
  (void)device;
  (void)flags;
  (void)event;
  return abi_stub_fail(HM_ERR_INVALID_ARGUMENT, "event_create: this plugin has no devices");
}

static inline hm_status abi_stub_event_destroy(hm_event event) {
  (void)event;
  return abi_stub_no_handle("event_destroy: not an event of this plugin");
}

static inline hm_status abi_stub_event_record(hm_event event, hm_stream stream) {
  (void)event;
  (void)stream;
  return abi_stub_no_handle("event_record: not an event of this plugin");
}

static inline hm_status abi_stub_event_query(hm_event event) {
  (void)event;
  return abi_stub_no_handle("event_query: not an event of this plugin");
}

static inline hm_status abi_stub_event_synchronize(hm_event event, uint64_t timeout_ns) {
  (void)event;
  (void)timeout_ns;
  return abi_stub_no_handle("event_synchronize: not an event of this plugin");
}

static inline hm_status abi_stub_stream_wait_event(hm_stream stream, hm_event event) {
  (void)stream;
  (void)event;
  return abi_stub_no_handle("stream_wait_event: not a stream of this plugin");
}

/* Designated initializers for every required slot after initialize and last_error. */
#define ABI_STUB_DEVICE_SLOTS                                                                   \
  .device_count = abi_stub_device_count, .device_properties = abi_stub_device_properties,       \
  .mem_alloc = abi_stub_mem_alloc, .mem_free = abi_stub_mem_free,                               \
  .pointer_query = abi_stub_pointer_query, .memcpy_async = abi_stub_memcpy_async,               \
  .memset_async = abi_stub_memset_async, .stream_create = abi_stub_stream_create,               \
  .stream_destroy = abi_stub_stream_destroy, .stream_synchronize = abi_stub_stream_synchronize, \
  .stream_query = abi_stub_stream_query, .event_create = abi_stub_event_create,                 \
  .event_destroy = abi_stub_event_destroy, .event_record = abi_stub_event_record,               \
  .event_query = abi_stub_event_query, .event_synchronize = abi_stub_event_synchronize,         \
  .stream_wait_event = abi_stub_stream_wait_event

/* All required slots of a loadable zero-device plugin. */
#define ABI_STUB_REQUIRED_SLOTS \
  .initialize = abi_stub_initialize, .last_error = abi_stub_last_error, ABI_STUB_DEVICE_SLOTS

#endif /* HETMESH_CTS_ABI_STUB_SLOTS_H_ */
