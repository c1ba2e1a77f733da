// A driver stand-in's only exports (both stand-ins share this file): the zeGet*ProcAddrTable /
// zetGet*ProcAddrTable / zesGet*ProcAddrTable functions through which the Level Zero loader
// (libze_loader.so.1, 1.8.12) fills its dispatch tables. Facts from the loader's source at v1.8.12
// that shape this file:
// - source/lib/{ze,zet,zes}_libddi.cpp: zeInit chains every non-experimental table getter of ze,
//   zet and zes with ZE_API_VERSION_1_4 and fails if one fails;
// - source/loader/*_ldrddi.cpp: for each such table, a driver without the export (or whose getter
//   fails) counts as "no valid driver" (UNINITIALIZED), and a getter's failure also disables the
//   driver; the experimental tables (DeviceExp, EventExp, ImageExp, KernelExp, FabricVertexExp,
//   FabricEdgeExp, MetricGroupExp) are optional and left zeroed when absent;
// - with one driver and no ZE_ENABLE_LOADER_INTERCEPT, the application gets the driver's tables
//   (and handles) directly;
// - source/loader/ze_loader.cpp: check_drivers calls the driver's zeGetGlobalProcAddrTable with
//   ZE_API_VERSION_CURRENT (1.4) and then its pfnInit.
// So: every required getter is exported and succeeds; functions outside the contract stay null, and
// the loader answers a call to a null slot with ZE_RESULT_ERROR_UNSUPPORTED_FEATURE.
#include <level_zero/ze_ddi.h>
#include <level_zero/zes_ddi.h>
#include <level_zero/zet_ddi.h>

#include "ze_driver_calls.h"

namespace hetmesh_ze {
namespace {

// Tables are sized by the 1.4 headers; a 1.x caller asking for 1.4 or later has tables at least
// that large (the loader only ever appends slots).
ze_result_t check_table(ze_api_version_t version, const void* table) {
  if (table == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
  if (ZE_MAJOR_VERSION(version) != 1 || ZE_MINOR_VERSION(version) < 4) {
    return ZE_RESULT_ERROR_UNSUPPORTED_VERSION;
  }
  return ZE_RESULT_SUCCESS;
}

}  // namespace
}  // namespace hetmesh_ze

using namespace hetmesh_ze;

extern "C" {

ZE_DLLEXPORT ze_result_t ZE_APICALL zeGetGlobalProcAddrTable(ze_api_version_t version,
                                                             ze_global_dditable_t* t) {
  if (auto r = check_table(version, t); r != ZE_RESULT_SUCCESS) return r;
  *t = {};
  t->pfnInit = Init;
  return ZE_RESULT_SUCCESS;
}

ZE_DLLEXPORT ze_result_t ZE_APICALL zeGetDriverProcAddrTable(ze_api_version_t version,
                                                             ze_driver_dditable_t* t) {
  if (auto r = check_table(version, t); r != ZE_RESULT_SUCCESS) return r;
  *t = {};
  t->pfnGet = DriverGet;
  t->pfnGetApiVersion = DriverGetApiVersion;
  t->pfnGetProperties = DriverGetProperties;
  t->pfnGetIpcProperties = DriverGetIpcProperties;
  t->pfnGetExtensionProperties = DriverGetExtensionProperties;
  t->pfnGetExtensionFunctionAddress = DriverGetExtensionFunctionAddress;
  return ZE_RESULT_SUCCESS;
}

ZE_DLLEXPORT ze_result_t ZE_APICALL zeGetDeviceProcAddrTable(ze_api_version_t version,
                                                             ze_device_dditable_t* t) {
  if (auto r = check_table(version, t); r != ZE_RESULT_SUCCESS) return r;
  *t = {};
  t->pfnGet = DeviceGet;
  t->pfnGetSubDevices = DeviceGetSubDevices;
  t->pfnGetProperties = DeviceGetProperties;
  t->pfnGetCommandQueueGroupProperties = DeviceGetCommandQueueGroupProperties;
  t->pfnGetMemoryProperties = DeviceGetMemoryProperties;
  t->pfnCanAccessPeer = DeviceCanAccessPeer;
  t->pfnGetStatus = DeviceGetStatus;
  t->pfnGetGlobalTimestamps = DeviceGetGlobalTimestamps;
  t->pfnPciGetPropertiesExt = DevicePciGetPropertiesExt;
  return ZE_RESULT_SUCCESS;
}

ZE_DLLEXPORT ze_result_t ZE_APICALL zeGetContextProcAddrTable(ze_api_version_t version,
                                                              ze_context_dditable_t* t) {
  if (auto r = check_table(version, t); r != ZE_RESULT_SUCCESS) return r;
  *t = {};
  t->pfnCreate = ContextCreate;
  t->pfnDestroy = ContextDestroy;
  t->pfnGetStatus = ContextGetStatus;
  return ZE_RESULT_SUCCESS;
}

ZE_DLLEXPORT ze_result_t ZE_APICALL zeGetCommandListProcAddrTable(ze_api_version_t version,
                                                                  ze_command_list_dditable_t* t) {
  if (auto r = check_table(version, t); r != ZE_RESULT_SUCCESS) return r;
  *t = {};
  t->pfnCreateImmediate = CommandListCreateImmediate;
  t->pfnDestroy = CommandListDestroy;
  t->pfnAppendWriteGlobalTimestamp = CommandListAppendWriteGlobalTimestamp;
  t->pfnAppendBarrier = CommandListAppendBarrier;
  t->pfnAppendMemoryCopy = CommandListAppendMemoryCopy;
  t->pfnAppendMemoryFill = CommandListAppendMemoryFill;
  t->pfnAppendSignalEvent = CommandListAppendSignalEvent;
  t->pfnAppendWaitOnEvents = CommandListAppendWaitOnEvents;
  t->pfnAppendEventReset = CommandListAppendEventReset;
  return ZE_RESULT_SUCCESS;
}

ZE_DLLEXPORT ze_result_t ZE_APICALL zeGetEventPoolProcAddrTable(ze_api_version_t version,
                                                                ze_event_pool_dditable_t* t) {
  if (auto r = check_table(version, t); r != ZE_RESULT_SUCCESS) return r;
  *t = {};
  t->pfnCreate = EventPoolCreate;
  t->pfnDestroy = EventPoolDestroy;
  return ZE_RESULT_SUCCESS;
}

ZE_DLLEXPORT ze_result_t ZE_APICALL zeGetEventProcAddrTable(ze_api_version_t version,
                                                            ze_event_dditable_t* t) {
  if (auto r = check_table(version, t); r != ZE_RESULT_SUCCESS) return r;
  *t = {};
  t->pfnCreate = EventCreate;
  t->pfnDestroy = EventDestroy;
  t->pfnHostSignal = EventHostSignal;
  t->pfnHostSynchronize = EventHostSynchronize;
  t->pfnQueryStatus = EventQueryStatus;
  t->pfnHostReset = EventHostReset;
  return ZE_RESULT_SUCCESS;
}

ZE_DLLEXPORT ze_result_t ZE_APICALL zeGetMemProcAddrTable(ze_api_version_t version,
                                                          ze_mem_dditable_t* t) {
  if (auto r = check_table(version, t); r != ZE_RESULT_SUCCESS) return r;
  *t = {};
  t->pfnAllocDevice = MemAllocDevice;
  t->pfnAllocHost = MemAllocHost;
  t->pfnFree = MemFree;
  t->pfnGetAllocProperties = MemGetAllocProperties;
  t->pfnGetAddressRange = MemGetAddressRange;
  t->pfnGetIpcHandle = MemGetIpcHandle;
  t->pfnOpenIpcHandle = MemOpenIpcHandle;
  t->pfnCloseIpcHandle = MemCloseIpcHandle;
  return ZE_RESULT_SUCCESS;
}

// Required by the loader, nothing in them implemented: all slots null.
#define HETMESH_ZE_EMPTY_TABLE(getter, table_type)                                      \
  ZE_DLLEXPORT ze_result_t ZE_APICALL getter(ze_api_version_t version, table_type* t) { \
    if (auto r = check_table(version, t); r != ZE_RESULT_SUCCESS) return r;             \
    *t = {};                                                                            \
    return ZE_RESULT_SUCCESS;                                                           \
  }

HETMESH_ZE_EMPTY_TABLE(zeGetCommandQueueProcAddrTable, ze_command_queue_dditable_t)
HETMESH_ZE_EMPTY_TABLE(zeGetFenceProcAddrTable, ze_fence_dditable_t)
HETMESH_ZE_EMPTY_TABLE(zeGetImageProcAddrTable, ze_image_dditable_t)
HETMESH_ZE_EMPTY_TABLE(zeGetKernelProcAddrTable, ze_kernel_dditable_t)
HETMESH_ZE_EMPTY_TABLE(zeGetModuleProcAddrTable, ze_module_dditable_t)
HETMESH_ZE_EMPTY_TABLE(zeGetModuleBuildLogProcAddrTable, ze_module_build_log_dditable_t)
HETMESH_ZE_EMPTY_TABLE(zeGetPhysicalMemProcAddrTable, ze_physical_mem_dditable_t)
HETMESH_ZE_EMPTY_TABLE(zeGetSamplerProcAddrTable, ze_sampler_dditable_t)
HETMESH_ZE_EMPTY_TABLE(zeGetVirtualMemProcAddrTable, ze_virtual_mem_dditable_t)

HETMESH_ZE_EMPTY_TABLE(zetGetDeviceProcAddrTable, zet_device_dditable_t)
HETMESH_ZE_EMPTY_TABLE(zetGetContextProcAddrTable, zet_context_dditable_t)
HETMESH_ZE_EMPTY_TABLE(zetGetCommandListProcAddrTable, zet_command_list_dditable_t)
HETMESH_ZE_EMPTY_TABLE(zetGetModuleProcAddrTable, zet_module_dditable_t)
HETMESH_ZE_EMPTY_TABLE(zetGetKernelProcAddrTable, zet_kernel_dditable_t)
HETMESH_ZE_EMPTY_TABLE(zetGetMetricGroupProcAddrTable, zet_metric_group_dditable_t)
HETMESH_ZE_EMPTY_TABLE(zetGetMetricProcAddrTable, zet_metric_dditable_t)
HETMESH_ZE_EMPTY_TABLE(zetGetMetricStreamerProcAddrTable, zet_metric_streamer_dditable_t)
HETMESH_ZE_EMPTY_TABLE(zetGetMetricQueryPoolProcAddrTable, zet_metric_query_pool_dditable_t)
HETMESH_ZE_EMPTY_TABLE(zetGetMetricQueryProcAddrTable, zet_metric_query_dditable_t)
HETMESH_ZE_EMPTY_TABLE(zetGetTracerExpProcAddrTable, zet_tracer_exp_dditable_t)
HETMESH_ZE_EMPTY_TABLE(zetGetDebugProcAddrTable, zet_debug_dditable_t)

HETMESH_ZE_EMPTY_TABLE(zesGetDriverProcAddrTable, zes_driver_dditable_t)
HETMESH_ZE_EMPTY_TABLE(zesGetDeviceProcAddrTable, zes_device_dditable_t)
HETMESH_ZE_EMPTY_TABLE(zesGetSchedulerProcAddrTable, zes_scheduler_dditable_t)
HETMESH_ZE_EMPTY_TABLE(zesGetPerformanceFactorProcAddrTable, zes_performance_factor_dditable_t)
HETMESH_ZE_EMPTY_TABLE(zesGetPowerProcAddrTable, zes_power_dditable_t)
HETMESH_ZE_EMPTY_TABLE(zesGetFrequencyProcAddrTable, zes_frequency_dditable_t)
HETMESH_ZE_EMPTY_TABLE(zesGetEngineProcAddrTable, zes_engine_dditable_t)
HETMESH_ZE_EMPTY_TABLE(zesGetStandbyProcAddrTable, zes_standby_dditable_t)
HETMESH_ZE_EMPTY_TABLE(zesGetFirmwareProcAddrTable, zes_firmware_dditable_t)
HETMESH_ZE_EMPTY_TABLE(zesGetMemoryProcAddrTable, zes_memory_dditable_t)
HETMESH_ZE_EMPTY_TABLE(zesGetFabricPortProcAddrTable, zes_fabric_port_dditable_t)
HETMESH_ZE_EMPTY_TABLE(zesGetTemperatureProcAddrTable, zes_temperature_dditable_t)
HETMESH_ZE_EMPTY_TABLE(zesGetPsuProcAddrTable, zes_psu_dditable_t)
HETMESH_ZE_EMPTY_TABLE(zesGetFanProcAddrTable, zes_fan_dditable_t)
HETMESH_ZE_EMPTY_TABLE(zesGetLedProcAddrTable, zes_led_dditable_t)
HETMESH_ZE_EMPTY_TABLE(zesGetRasProcAddrTable, zes_ras_dditable_t)
HETMESH_ZE_EMPTY_TABLE(zesGetDiagnosticsProcAddrTable, zes_diagnostics_dditable_t)

#undef HETMESH_ZE_EMPTY_TABLE

}  // extern "C"
