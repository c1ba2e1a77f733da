/*
 * abi_short_table: broken for the table size check. The table holds the version fields but its
 * struct_size stops just before the last required slot (stream_wait_event), i.e. it is smaller than
 * HM_DEVICE_PLUGIN_API_MIN_SIZE; the host must refuse it without reading past struct_size, even
 * though every slot in the struct is actually filled in.
 */
#include "abi_stub_slots.h"

static const hm_device_plugin_api kTable = {
    .struct_size = offsetof(hm_device_plugin_api, stream_wait_event),
    .abi_major = HM_DEVICE_PLUGIN_ABI_MAJOR,
    .abi_minor = HM_DEVICE_PLUGIN_ABI_MINOR,
    .name = "abi_short_table",
    .version = "cts",
    ABI_STUB_REQUIRED_SLOTS};

_Static_assert(offsetof(hm_device_plugin_api, stream_wait_event) < HM_DEVICE_PLUGIN_API_MIN_SIZE,
               "the table must be too short");
_Static_assert(offsetof(hm_device_plugin_api, stream_wait_event) >
                   offsetof(hm_device_plugin_api, abi_minor) + sizeof(uint32_t),
               "the table must still hold the version fields");

const hm_device_plugin_api* hm_device_plugin_v1(void) {
  return &kTable;
}
