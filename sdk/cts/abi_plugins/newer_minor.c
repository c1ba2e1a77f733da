/*
 * abi_newer_minor: NOT broken; it tests forward compatibility. A table from a future ABI 1.(n+1):
 * abi_minor is one above this SDK's and struct_size includes two slots appended after the last v1
 * slot. A v1.n host must load it (it knows every slot it reads), negotiate minor n and ignore the
 * extra slots. It initializes with zero devices; its required slots are stubs.
 */
#include "abi_stub_slots.h"

/* What the table of a v1.(n+1) plugin looks like to a v1.n host: the known table, then more. */
typedef struct future_plugin_api {
  hm_device_plugin_api v1;
  hm_status (*future_slot_a)(void);
  hm_status (*future_slot_b)(void);
} future_plugin_api;

_Static_assert(sizeof(future_plugin_api) == sizeof(hm_device_plugin_api) + 2 * sizeof(void*),
               "two slots appended without padding");

static hm_status future_slot(void) {
  return abi_stub_fail(HM_ERR_INTERNAL, "a slot from the future was called by a v1.0 host");
}

static const future_plugin_api kTable = {
    .v1 = {.struct_size = sizeof(hm_device_plugin_api) + 2 * sizeof(void*),
           .abi_major = HM_DEVICE_PLUGIN_ABI_MAJOR,
           .abi_minor = HM_DEVICE_PLUGIN_ABI_MINOR + 1,
           .name = "abi_newer_minor",
           .version = "cts",
           ABI_STUB_REQUIRED_SLOTS},
    .future_slot_a = future_slot,
    .future_slot_b = future_slot};

const hm_device_plugin_api* hm_device_plugin_v1(void) {
  return &kTable.v1;
}
