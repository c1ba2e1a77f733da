/*
 * abi_missing_slot: broken for the required-slot check. A full-size v1 table in which the required
 * slot memcpy_async is NULL; the host must refuse it ("required slot 'memcpy_async' is NULL")
 * before calling initialize().
 */
#include "abi_stub_slots.h"

static const hm_device_plugin_api kTable = {.struct_size = sizeof(hm_device_plugin_api),
                                            .abi_major = HM_DEVICE_PLUGIN_ABI_MAJOR,
                                            .abi_minor = HM_DEVICE_PLUGIN_ABI_MINOR,
                                            .name = "abi_missing_slot",
                                            .version = "cts",
                                            .initialize = abi_stub_initialize,
                                            .last_error = abi_stub_last_error,
                                            .device_count = abi_stub_device_count,
                                            .device_properties = abi_stub_device_properties,
                                            .mem_alloc = abi_stub_mem_alloc,
                                            .mem_free = abi_stub_mem_free,
                                            .pointer_query = abi_stub_pointer_query,
                                            .memcpy_async = NULL, /* the defect */
                                            .memset_async = abi_stub_memset_async,
                                            .stream_create = abi_stub_stream_create,
                                            .stream_destroy = abi_stub_stream_destroy,
                                            .stream_synchronize = abi_stub_stream_synchronize,
                                            .stream_query = abi_stub_stream_query,
                                            .event_create = abi_stub_event_create,
                                            .event_destroy = abi_stub_event_destroy,
                                            .event_record = abi_stub_event_record,
                                            .event_query = abi_stub_event_query,
                                            .event_synchronize = abi_stub_event_synchronize,
                                            .stream_wait_event = abi_stub_stream_wait_event};

const hm_device_plugin_api* hm_device_plugin_v1(void) {
  return &kTable;
}
