// Level Zero, loaded at run time.
//
// The plugin never links the loader: initialize() dlopen()s libze_loader.so.1 and resolves each
// entry point with dlsym, so the plugin loads on a machine without Level Zero and then reports
// zero devices with a reason. Function pointer types come from the headers the plugin was compiled
// against (Debian 12's libze-dev 1.8.12, spec 1.4): decltype(&::zeMemAllocDevice).
//
// Intel's experimental stream waits (zexCommandListAppendWaitOnMemory and WaitOnMemory64)
// are not loader entry points: a driver hands them out through zeDriverGetExtensionFunctionAddress.
// Their prototypes and enum values are in ze_memory_sync.h, shared with the driver stand-ins.
#pragma once

#include "ze_memory_sync.h"

#include <hetmesh/device_plugin.h>

#include <level_zero/ze_api.h>

#include <cstdint>
#include <string>
#include <type_traits>

namespace hm::level_zero {

// Every Level Zero entry point the plugin uses, by its exported name (the calls of the contract
// with the host stand-in driver, plugins/level_zero/README.md).
#define HM_ZE_API(X)                         \
  X(zeInit)                                  \
  X(zeDriverGet)                             \
  X(zeDriverGetApiVersion)                   \
  X(zeDriverGetProperties)                   \
  X(zeDriverGetExtensionProperties)          \
  X(zeDriverGetExtensionFunctionAddress)     \
  X(zeContextCreate)                         \
  X(zeContextDestroy)                        \
  X(zeDeviceGet)                             \
  X(zeDeviceGetProperties)                   \
  X(zeDeviceGetMemoryProperties)             \
  X(zeDeviceGetCommandQueueGroupProperties)  \
  X(zeDeviceCanAccessPeer)                   \
  X(zeDevicePciGetPropertiesExt)             \
  X(zeMemAllocDevice)                        \
  X(zeMemAllocHost)                          \
  X(zeMemFree)                               \
  X(zeMemGetAllocProperties)                 \
  X(zeMemGetAddressRange)                    \
  X(zeMemGetIpcHandle)                       \
  X(zeMemOpenIpcHandle)                      \
  X(zeMemCloseIpcHandle)                     \
  X(zeCommandListCreateImmediate)            \
  X(zeCommandListDestroy)                    \
  X(zeCommandListAppendMemoryCopy)           \
  X(zeCommandListAppendMemoryFill)           \
  X(zeCommandListAppendBarrier)              \
  X(zeCommandListAppendSignalEvent)          \
  X(zeCommandListAppendWaitOnEvents)         \
  X(zeCommandListAppendEventReset)           \
  X(zeCommandListAppendWriteGlobalTimestamp) \
  X(zeEventPoolCreate)                       \
  X(zeEventPoolDestroy)                      \
  X(zeEventCreate)                           \
  X(zeEventDestroy)                          \
  X(zeEventHostSynchronize)                  \
  X(zeEventQueryStatus)                      \
  X(zeEventHostSignal)                       \
  X(zeEventHostReset)

// Every ze_result_t of the 1.4 headers, for result_name().
#define HM_ZE_RESULTS(X)                            \
  X(ZE_RESULT_SUCCESS)                              \
  X(ZE_RESULT_NOT_READY)                            \
  X(ZE_RESULT_ERROR_DEVICE_LOST)                    \
  X(ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY)             \
  X(ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY)           \
  X(ZE_RESULT_ERROR_MODULE_BUILD_FAILURE)           \
  X(ZE_RESULT_ERROR_MODULE_LINK_FAILURE)            \
  X(ZE_RESULT_ERROR_DEVICE_REQUIRES_RESET)          \
  X(ZE_RESULT_ERROR_DEVICE_IN_LOW_POWER_STATE)      \
  X(ZE_RESULT_EXP_ERROR_DEVICE_IS_NOT_VERTEX)       \
  X(ZE_RESULT_EXP_ERROR_VERTEX_IS_NOT_DEVICE)       \
  X(ZE_RESULT_EXP_ERROR_REMOTE_DEVICE)              \
  X(ZE_RESULT_ERROR_INSUFFICIENT_PERMISSIONS)       \
  X(ZE_RESULT_ERROR_NOT_AVAILABLE)                  \
  X(ZE_RESULT_ERROR_DEPENDENCY_UNAVAILABLE)         \
  X(ZE_RESULT_WARNING_DROPPED_DATA)                 \
  X(ZE_RESULT_ERROR_UNINITIALIZED)                  \
  X(ZE_RESULT_ERROR_UNSUPPORTED_VERSION)            \
  X(ZE_RESULT_ERROR_UNSUPPORTED_FEATURE)            \
  X(ZE_RESULT_ERROR_INVALID_ARGUMENT)               \
  X(ZE_RESULT_ERROR_INVALID_NULL_HANDLE)            \
  X(ZE_RESULT_ERROR_HANDLE_OBJECT_IN_USE)           \
  X(ZE_RESULT_ERROR_INVALID_NULL_POINTER)           \
  X(ZE_RESULT_ERROR_INVALID_SIZE)                   \
  X(ZE_RESULT_ERROR_UNSUPPORTED_SIZE)               \
  X(ZE_RESULT_ERROR_UNSUPPORTED_ALIGNMENT)          \
  X(ZE_RESULT_ERROR_INVALID_SYNCHRONIZATION_OBJECT) \
  X(ZE_RESULT_ERROR_INVALID_ENUMERATION)            \
  X(ZE_RESULT_ERROR_UNSUPPORTED_ENUMERATION)        \
  X(ZE_RESULT_ERROR_UNSUPPORTED_IMAGE_FORMAT)       \
  X(ZE_RESULT_ERROR_INVALID_NATIVE_BINARY)          \
  X(ZE_RESULT_ERROR_INVALID_GLOBAL_NAME)            \
  X(ZE_RESULT_ERROR_INVALID_KERNEL_NAME)            \
  X(ZE_RESULT_ERROR_INVALID_FUNCTION_NAME)          \
  X(ZE_RESULT_ERROR_INVALID_GROUP_SIZE_DIMENSION)   \
  X(ZE_RESULT_ERROR_INVALID_GLOBAL_WIDTH_DIMENSION) \
  X(ZE_RESULT_ERROR_INVALID_KERNEL_ARGUMENT_INDEX)  \
  X(ZE_RESULT_ERROR_INVALID_KERNEL_ARGUMENT_SIZE)   \
  X(ZE_RESULT_ERROR_INVALID_KERNEL_ATTRIBUTE_VALUE) \
  X(ZE_RESULT_ERROR_INVALID_MODULE_UNLINKED)        \
  X(ZE_RESULT_ERROR_INVALID_COMMAND_LIST_TYPE)      \
  X(ZE_RESULT_ERROR_OVERLAPPING_REGIONS)            \
  X(ZE_RESULT_WARNING_ACTION_REQUIRED)              \
  X(ZE_RESULT_ERROR_UNKNOWN)

struct Loader {
#define HM_ZE_MEMBER(fn) decltype(&::fn) fn = nullptr;
  HM_ZE_API(HM_ZE_MEMBER)
#undef HM_ZE_MEMBER
  void* library = nullptr;  // the dlopen() handle, never closed
};

// Loads libze_loader.so.1 into `loader`. Returns "" on success, else why Level Zero is unusable.
std::string load_loader(Loader* loader);

// ---- Intel's experimental memory-sync calls (ze_memory_sync.h) ----

struct MemorySync {  // both set, or neither
  zex_pfnCommandListAppendWaitOnMemory_t wait_on_memory = nullptr;
  zex_pfnCommandListAppendWaitOnMemory64_t wait_on_memory64 = nullptr;
};

// Resolves the two wait calls through the driver. Returns "" when both are there, else which are
// missing (the reason HM_CAP_STREAM_MEMOPS is clear). zexCommandListAppendWriteToMemory, the
// extension's third call, is not used: it writes 8 bytes (level_zero_memops.cc).
std::string load_memory_sync(const Loader& ze, ze_driver_handle_t driver, MemorySync* out);

// "ZE_RESULT_ERROR_INVALID_ARGUMENT", or "ze_result_t 0x78000099" for a value the headers lack.
std::string result_name(ze_result_t result);

// The hm_status for a ze_result_t: NOT_READY, OUT_OF_MEMORY, INVALID_ARGUMENT, INVALID_HANDLE,
// NOT_SUPPORTED, UNINITIALIZED, DEVICE_LOST for a lost or reset device, else HM_ERR_BACKEND.
hm_status status_of(ze_result_t result);

}  // namespace hm::level_zero
