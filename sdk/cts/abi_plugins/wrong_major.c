/*
 * abi_wrong_major: broken for the ABI major version check. A complete, otherwise loadable table
 * that claims ABI 2.0; a v1 host must refuse it ("ABI major version 2 is not supported") before
 * calling any slot.
 */
#include "abi_stub_slots.h"

static const hm_device_plugin_api kTable = {.struct_size = sizeof(hm_device_plugin_api),
                                            .abi_major = HM_DEVICE_PLUGIN_ABI_MAJOR + 1, /* 2 */
                                            .abi_minor = 0,
                                            .name = "abi_wrong_major",
                                            .version = "cts",
                                            ABI_STUB_REQUIRED_SLOTS};

const hm_device_plugin_api* hm_device_plugin_v1(void) {
  return &kTable;
}
