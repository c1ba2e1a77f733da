/*
 * abi_init_fails: broken for initialize() failure handling. A valid table whose initialize()
 * returns HM_ERR_BACKEND with last_error "simulated driver failure: no such device", as a plugin
 * whose driver is missing would; the host must refuse it and report that message.
 */
#include "abi_stub_slots.h"

static hm_status failing_initialize(const hm_host_api* host) {
  (void)host;
  return abi_stub_fail(HM_ERR_BACKEND, "simulated driver failure: no such device");
}

static const hm_device_plugin_api kTable = {.struct_size = sizeof(hm_device_plugin_api),
                                            .abi_major = HM_DEVICE_PLUGIN_ABI_MAJOR,
                                            .abi_minor = HM_DEVICE_PLUGIN_ABI_MINOR,
                                            .name = "abi_init_fails",
                                            .version = "cts",
                                            .initialize = failing_initialize,
                                            .last_error = abi_stub_last_error,
                                            ABI_STUB_DEVICE_SLOTS};

const hm_device_plugin_api* hm_device_plugin_v1(void) {
  return &kTable;
}
