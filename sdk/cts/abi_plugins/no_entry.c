/*
 * abi_no_entry: broken for entry-point lookup. A shared object named like a plugin that exports no
 * hm_device_plugin_v1: its table is exported under a misspelled name (hm_device_plugin, without
 * the _v1). The host must refuse it ("does not export hm_device_plugin_v1"). Built without the
 * plugin version script, which names hm_device_plugin_v1 (see CMakeLists.txt).
 */
#include "abi_stub_slots.h"

static const hm_device_plugin_api kTable = {.struct_size = sizeof(hm_device_plugin_api),
                                            .abi_major = HM_DEVICE_PLUGIN_ABI_MAJOR,
                                            .abi_minor = HM_DEVICE_PLUGIN_ABI_MINOR,
                                            .name = "abi_no_entry",
                                            .version = "cts",
                                            ABI_STUB_REQUIRED_SLOTS};

HM_PLUGIN_EXPORT const hm_device_plugin_api* hm_device_plugin(void);

const hm_device_plugin_api* hm_device_plugin(void) {
  return &kTable;
}
