/*
 * abi_init_crashes: broken for crash isolation. A valid table whose initialize() writes through a
 * null pointer and dies with SIGSEGV. Load it only with PluginLoadOptions::isolate = true, where
 * the probe process crashes instead of the host and the plugin is refused ("signal 11").
 */
#include "abi_stub_slots.h"

#include <signal.h>
#include <stdio.h>

/* Read through volatile, so the compiler cannot prove the pointer null and replace the store with
 * a trap instruction (which would raise SIGILL instead). */
static int* volatile g_null_pointer = NULL;

/* The crash must be a plain SIGSEGV in every build: UBSan would report the store and exit(1), and
 * a SIGSEGV handler in the host (ASan installs one) would turn the signal into an exit code. */
#if defined(__GNUC__)
#define ABI_NO_NULL_SANITIZER __attribute__((no_sanitize("null")))
#else
#define ABI_NO_NULL_SANITIZER
#endif

static ABI_NO_NULL_SANITIZER hm_status crashing_initialize(const hm_host_api* host) {
  (void)host;
  /* What a dying runtime often does; the loader passes the first such line on in its refusal. */
  fputs("abi_init_crashes: writing through a null pointer\n", stderr);
  signal(SIGSEGV, SIG_DFL);
  *g_null_pointer = 1;
  return abi_stub_fail(HM_ERR_INTERNAL, "initialize: survived a null pointer write");
}

static const hm_device_plugin_api kTable = {.struct_size = sizeof(hm_device_plugin_api),
                                            .abi_major = HM_DEVICE_PLUGIN_ABI_MAJOR,
                                            .abi_minor = HM_DEVICE_PLUGIN_ABI_MINOR,
                                            .name = "abi_init_crashes",
                                            .version = "cts",
                                            .initialize = crashing_initialize,
                                            .last_error = abi_stub_last_error,
                                            ABI_STUB_DEVICE_SLOTS};

const hm_device_plugin_api* hm_device_plugin_v1(void) {
  return &kTable;
}
