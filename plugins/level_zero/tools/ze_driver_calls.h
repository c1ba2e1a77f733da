// The entry points a Level Zero driver stand-in defines (namespace hetmesh_ze), which
// ze_driver_tables.cc hands to the loader: the calls the level_zero plugin makes
// (plugins/level_zero/README.md) and the few the loader and tests ask for. Each stand-in
// (ze_host_driver/ on host memory, ze_on_cuda.cc on the CUDA driver API) defines every one.
#pragma once

#include <level_zero/ze_api.h>

#include <cstddef>
#include <cstdint>

namespace hetmesh_ze {

// driver and devices
ze_result_t ZE_APICALL Init(ze_init_flags_t flags);
ze_result_t ZE_APICALL DriverGet(uint32_t* count, ze_driver_handle_t* drivers);
ze_result_t ZE_APICALL DriverGetApiVersion(ze_driver_handle_t driver, ze_api_version_t* version);
ze_result_t ZE_APICALL DriverGetProperties(ze_driver_handle_t driver,
                                           ze_driver_properties_t* properties);
ze_result_t ZE_APICALL DriverGetIpcProperties(ze_driver_handle_t driver,
                                              ze_driver_ipc_properties_t* properties);
ze_result_t ZE_APICALL DeviceGet(ze_driver_handle_t driver, uint32_t* count,
                                 ze_device_handle_t* devices);
ze_result_t ZE_APICALL DeviceGetSubDevices(ze_device_handle_t device, uint32_t* count,
                                           ze_device_handle_t* sub_devices);
ze_result_t ZE_APICALL DeviceGetProperties(ze_device_handle_t device,
                                           ze_device_properties_t* properties);
ze_result_t ZE_APICALL DeviceGetCommandQueueGroupProperties(
    ze_device_handle_t device, uint32_t* count, ze_command_queue_group_properties_t* properties);
ze_result_t ZE_APICALL DeviceGetMemoryProperties(ze_device_handle_t device, uint32_t* count,
                                                 ze_device_memory_properties_t* properties);
ze_result_t ZE_APICALL DeviceCanAccessPeer(ze_device_handle_t device, ze_device_handle_t peer,
                                           ze_bool_t* value);
ze_result_t ZE_APICALL DeviceGetStatus(ze_device_handle_t device);
ze_result_t ZE_APICALL DeviceGetGlobalTimestamps(ze_device_handle_t device, uint64_t* host,
                                                 uint64_t* device_ts);
ze_result_t ZE_APICALL DevicePciGetPropertiesExt(ze_device_handle_t device,
                                                 ze_pci_ext_properties_t* properties);
ze_result_t ZE_APICALL ContextCreate(ze_driver_handle_t driver, const ze_context_desc_t* desc,
                                     ze_context_handle_t* context);
ze_result_t ZE_APICALL ContextDestroy(ze_context_handle_t context);
ze_result_t ZE_APICALL ContextGetStatus(ze_context_handle_t context);

// extensions: the list, and Intel's experimental functions by name (ze_memory_sync.h)
ze_result_t ZE_APICALL DriverGetExtensionProperties(ze_driver_handle_t driver, uint32_t* count,
                                                    ze_driver_extension_properties_t* properties);
ze_result_t ZE_APICALL DriverGetExtensionFunctionAddress(ze_driver_handle_t driver,
                                                         const char* name, void** function);

// memory
ze_result_t ZE_APICALL MemAllocDevice(ze_context_handle_t context,
                                      const ze_device_mem_alloc_desc_t* desc, size_t size,
                                      size_t alignment, ze_device_handle_t device, void** ptr);
ze_result_t ZE_APICALL MemAllocHost(ze_context_handle_t context,
                                    const ze_host_mem_alloc_desc_t* desc, size_t size,
                                    size_t alignment, void** ptr);
ze_result_t ZE_APICALL MemFree(ze_context_handle_t context, void* ptr);
ze_result_t ZE_APICALL MemGetAllocProperties(ze_context_handle_t context, const void* ptr,
                                             ze_memory_allocation_properties_t* properties,
                                             ze_device_handle_t* device);
ze_result_t ZE_APICALL MemGetAddressRange(ze_context_handle_t context, const void* ptr, void** base,
                                          size_t* size);

// IPC
ze_result_t ZE_APICALL MemGetIpcHandle(ze_context_handle_t context, const void* ptr,
                                       ze_ipc_mem_handle_t* handle);
ze_result_t ZE_APICALL MemOpenIpcHandle(ze_context_handle_t context, ze_device_handle_t device,
                                        ze_ipc_mem_handle_t handle, ze_ipc_memory_flags_t flags,
                                        void** ptr);
ze_result_t ZE_APICALL MemCloseIpcHandle(ze_context_handle_t context, const void* ptr);

// events
ze_result_t ZE_APICALL EventPoolCreate(ze_context_handle_t context,
                                       const ze_event_pool_desc_t* desc, uint32_t num_devices,
                                       ze_device_handle_t* devices, ze_event_pool_handle_t* pool);
ze_result_t ZE_APICALL EventPoolDestroy(ze_event_pool_handle_t pool);
ze_result_t ZE_APICALL EventCreate(ze_event_pool_handle_t pool, const ze_event_desc_t* desc,
                                   ze_event_handle_t* event);
ze_result_t ZE_APICALL EventDestroy(ze_event_handle_t event);
ze_result_t ZE_APICALL EventHostSignal(ze_event_handle_t event);
ze_result_t ZE_APICALL EventHostSynchronize(ze_event_handle_t event, uint64_t timeout_ns);
ze_result_t ZE_APICALL EventQueryStatus(ze_event_handle_t event);
ze_result_t ZE_APICALL EventHostReset(ze_event_handle_t event);

// immediate command lists
ze_result_t ZE_APICALL CommandListCreateImmediate(ze_context_handle_t context,
                                                  ze_device_handle_t device,
                                                  const ze_command_queue_desc_t* desc,
                                                  ze_command_list_handle_t* list);
ze_result_t ZE_APICALL CommandListDestroy(ze_command_list_handle_t list);
ze_result_t ZE_APICALL CommandListAppendWriteGlobalTimestamp(ze_command_list_handle_t list,
                                                             uint64_t* dst,
                                                             ze_event_handle_t signal,
                                                             uint32_t num_waits,
                                                             ze_event_handle_t* waits);
ze_result_t ZE_APICALL CommandListAppendBarrier(ze_command_list_handle_t list,
                                                ze_event_handle_t signal, uint32_t num_waits,
                                                ze_event_handle_t* waits);
ze_result_t ZE_APICALL CommandListAppendMemoryCopy(ze_command_list_handle_t list, void* dst,
                                                   const void* src, size_t size,
                                                   ze_event_handle_t signal, uint32_t num_waits,
                                                   ze_event_handle_t* waits);
ze_result_t ZE_APICALL CommandListAppendMemoryFill(ze_command_list_handle_t list, void* ptr,
                                                   const void* pattern, size_t pattern_size,
                                                   size_t size, ze_event_handle_t signal,
                                                   uint32_t num_waits, ze_event_handle_t* waits);
ze_result_t ZE_APICALL CommandListAppendSignalEvent(ze_command_list_handle_t list,
                                                    ze_event_handle_t event);
ze_result_t ZE_APICALL CommandListAppendWaitOnEvents(ze_command_list_handle_t list,
                                                     uint32_t num_events,
                                                     ze_event_handle_t* events);
ze_result_t ZE_APICALL CommandListAppendEventReset(ze_command_list_handle_t list,
                                                   ze_event_handle_t event);

}  // namespace hetmesh_ze
