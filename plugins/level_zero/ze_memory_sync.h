/* Intel's experimental memory-sync calls for Level Zero command lists (extension
 * "ZE_intel_experimental_command_list_memory_sync", reached through
 * zeDriverGetExtensionFunctionAddress): the types, flag values and signatures of
 * intel/compute-runtime's public driver_experimental/zex_common.h and zex_cmdlist.h, declared here
 * because Debian's libze-dev does not ship them. One copy, for the level_zero plugin and the
 * driver stand-ins in tools/.
 *
 * What Intel's driver does (compute-runtime, level_zero/core/source/cmdlist/cmdlist_hw.inl):
 * - WaitOnMemory compares the 32-bit word at ptr, WaitOnMemory64 the 64-bit one, as
 *   `*ptr OP data`, unsigned; the action flag is exactly one of the six conditions.
 * - WriteToMemory always writes 8 bytes, whatever the value (a post-sync "write immediate data").
 */
#ifndef HETMESH_ZE_MEMORY_SYNC_H
#define HETMESH_ZE_MEMORY_SYNC_H

#include <level_zero/ze_api.h>

#include <stdint.h>

#define HETMESH_ZE_MEMORY_SYNC_EXTENSION "ZE_intel_experimental_command_list_memory_sync"

typedef ze_command_list_handle_t zex_command_list_handle_t;
typedef ze_event_handle_t zex_event_handle_t;

typedef uint32_t zex_mem_action_scope_flags_t;
enum {
  ZEX_MEM_ACTION_SCOPE_FLAG_SUBDEVICE = 1u << 0,
  ZEX_MEM_ACTION_SCOPE_FLAG_DEVICE = 1u << 1,
  ZEX_MEM_ACTION_SCOPE_FLAG_HOST = 1u << 2
};

typedef uint32_t zex_wait_on_mem_action_flags_t;
enum {
  ZEX_WAIT_ON_MEMORY_FLAG_EQUAL = 1u << 0,
  ZEX_WAIT_ON_MEMORY_FLAG_NOT_EQUAL = 1u << 1,
  ZEX_WAIT_ON_MEMORY_FLAG_GREATER_THAN = 1u << 2,
  ZEX_WAIT_ON_MEMORY_FLAG_GREATER_THAN_EQUAL = 1u << 3,
  ZEX_WAIT_ON_MEMORY_FLAG_LESSER_THAN = 1u << 4,
  ZEX_WAIT_ON_MEMORY_FLAG_LESSER_THAN_EQUAL = 1u << 5
};

typedef struct _zex_wait_on_mem_desc_t {
  zex_wait_on_mem_action_flags_t actionFlag;
  zex_mem_action_scope_flags_t waitScope;
} zex_wait_on_mem_desc_t;

typedef struct _zex_write_to_mem_desc_t {
  zex_mem_action_scope_flags_t writeScope;
} zex_write_to_mem_desc_t;

typedef ze_result_t(ZE_APICALL* zex_pfnCommandListAppendWaitOnMemory_t)(
    ze_command_list_handle_t list, zex_wait_on_mem_desc_t* desc, void* ptr, uint32_t data,
    ze_event_handle_t signal);
typedef ze_result_t(ZE_APICALL* zex_pfnCommandListAppendWaitOnMemory64_t)(
    ze_command_list_handle_t list, zex_wait_on_mem_desc_t* desc, void* ptr, uint64_t data,
    ze_event_handle_t signal);
typedef ze_result_t(ZE_APICALL* zex_pfnCommandListAppendWriteToMemory_t)(
    ze_command_list_handle_t list, zex_write_to_mem_desc_t* desc, void* ptr, uint64_t data);

#endif /* HETMESH_ZE_MEMORY_SYNC_H */
