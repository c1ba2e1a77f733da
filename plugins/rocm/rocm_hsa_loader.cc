// Resolving HSA's dma-buf export from libhsa-runtime64 at run time, and HSA's error texts.
#include "rocm_hsa_loader.hpp"

#include <dlfcn.h>

#include <cstdio>

namespace hm::rocm {

std::string load_hsa_dmabuf(HsaDmabuf* hsa) {
  void* library = dlopen("libhsa-runtime64.so.1", RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    const char* error = dlerror();
    return std::string("libhsa-runtime64.so.1 not found (") +
           (error != nullptr ? error : "dlopen failed") + ")";
  }
  // Never dlclose: HIP holds the same instance.
  HsaDmabuf loaded;
  loaded.export_dmabuf =
      reinterpret_cast<HsaDmabuf::ExportFn>(dlsym(library, "hsa_amd_portable_export_dmabuf"));
  loaded.close_dmabuf =
      reinterpret_cast<HsaDmabuf::CloseFn>(dlsym(library, "hsa_amd_portable_close_dmabuf"));
  loaded.status_string =
      reinterpret_cast<HsaDmabuf::StatusStringFn>(dlsym(library, "hsa_status_string"));
  if (loaded.export_dmabuf == nullptr || loaded.close_dmabuf == nullptr)
    return "libhsa-runtime64 has no hsa_amd_portable_export_dmabuf (it needs ROCm 5.6 or later)";
  *hsa = loaded;
  return {};
}

std::string describe(const HsaDmabuf& hsa, hsa_status_t status) {
  const char* text = nullptr;
  if (hsa.status_string == nullptr || hsa.status_string(status, &text) != HSA_STATUS_SUCCESS)
    text = nullptr;
  char buffer[256];
  if (text == nullptr)
    std::snprintf(buffer, sizeof buffer, "hsa_status_t 0x%x", static_cast<unsigned>(status));
  else
    std::snprintf(buffer, sizeof buffer, "hsa_status_t 0x%x: %s", static_cast<unsigned>(status),
                  text);
  return buffer;
}

}  // namespace hm::rocm
