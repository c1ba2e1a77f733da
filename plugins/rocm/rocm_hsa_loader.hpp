// dma-buf export of device memory through the HSA runtime, resolved at run time.
//
// hsa_amd_portable_export_dmabuf appeared in ROCm 5.6's libhsa-runtime64; Debian's 5.2 headers do
// not declare it, so its prototype is spelled out here from the ROCm API. libhsa-runtime64 is the
// library HIP itself runs on: opening it again returns the instance HIP already initialised.
#pragma once

#include <hsa/hsa.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace hm::rocm {

struct HsaDmabuf {
  // hsa_amd_portable_export_dmabuf: a dma-buf fd for the allocation holding [ptr, ptr + size), and
  // ptr's offset inside it.
  using ExportFn = hsa_status_t (*)(const void* ptr, size_t size, int* dmabuf, uint64_t* offset);
  // hsa_amd_portable_close_dmabuf: closes an fd from ExportFn.
  using CloseFn = hsa_status_t (*)(int dmabuf);
  using StatusStringFn = decltype(&::hsa_status_string);

  ExportFn export_dmabuf = nullptr;
  CloseFn close_dmabuf = nullptr;
  StatusStringFn status_string = nullptr;
};

// Resolves the dma-buf entry points. Returns "" on success, else why export is unavailable.
std::string load_hsa_dmabuf(HsaDmabuf* hsa);

// "HSA_STATUS_ERROR_INVALID_ARGUMENT: ..." from hsa_status_string, or the number.
std::string describe(const HsaDmabuf& hsa, hsa_status_t status);

}  // namespace hm::rocm
