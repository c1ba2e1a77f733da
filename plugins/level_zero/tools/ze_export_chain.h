// The external-memory extension structures both stand-in drivers take, read the same way: the
// pNext chain of a device allocation (only a dma-buf export request is accepted) and of
// zeMemGetAllocProperties (where the export fd is asked for).
#pragma once

#include <level_zero/ze_api.h>

namespace hetmesh_ze {

// Whether a device allocation's pNext asks for dma-buf export (the only extension taken); any
// other structure is refused, as a driver refuses what it does not know.
inline ze_result_t export_request(const void* pNext, bool* exportable) {
  for (auto* next = static_cast<const ze_base_desc_t*>(pNext); next != nullptr;
       next = static_cast<const ze_base_desc_t*>(next->pNext)) {
    if (next->stype != ZE_STRUCTURE_TYPE_EXTERNAL_MEMORY_EXPORT_DESC)
      return ZE_RESULT_ERROR_UNSUPPORTED_FEATURE;
    if (reinterpret_cast<const ze_external_memory_export_desc_t*>(next)->flags !=
        ZE_EXTERNAL_MEMORY_TYPE_FLAG_DMA_BUF)
      return ZE_RESULT_ERROR_UNSUPPORTED_ENUMERATION;
    *exportable = true;
  }
  return ZE_RESULT_SUCCESS;
}

// The export-fd structure in zeMemGetAllocProperties' pNext (*out, nullptr if none): a dma-buf's
// fd is the only kind handed out.
inline ze_result_t export_fd_request(ze_memory_allocation_properties_t* p,
                                     ze_external_memory_export_fd_t** out) {
  *out = nullptr;
  for (auto* next = static_cast<ze_base_properties_t*>(p->pNext); next != nullptr;
       next = static_cast<ze_base_properties_t*>(next->pNext)) {
    if (next->stype != ZE_STRUCTURE_TYPE_EXTERNAL_MEMORY_EXPORT_FD) continue;
    *out = reinterpret_cast<ze_external_memory_export_fd_t*>(next);
    if ((*out)->flags != ZE_EXTERNAL_MEMORY_TYPE_FLAG_DMA_BUF)
      return ZE_RESULT_ERROR_INVALID_ENUMERATION;
  }
  return ZE_RESULT_SUCCESS;
}

}  // namespace hetmesh_ze
