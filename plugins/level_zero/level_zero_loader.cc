// Loading libze_loader.so.1 at run time, Intel's experimental memory-sync calls, and the
// ze_result_t names and hm_status mapping that every error message uses.
#include "level_zero_loader.hpp"

#include <dlfcn.h>

#include <cstdio>

namespace hm::level_zero {

std::string load_loader(Loader* loader) {
  // RTLD_LOCAL: the loader's symbols stay out of the global namespace of the host process.
  void* library = dlopen("libze_loader.so.1", RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    const char* error = dlerror();
    return std::string("no Level Zero: libze_loader.so.1 not found (") +
           (error != nullptr ? error : "dlopen failed") + ")";
  }
  // Never dlclose the loader: the drivers it loaded may have started threads.
  Loader loaded;
  loaded.library = library;
  std::string missing;
#define HM_ZE_RESOLVE(fn)                                                 \
  loaded.fn = reinterpret_cast<decltype(loaded.fn)>(dlsym(library, #fn)); \
  if (loaded.fn == nullptr) missing += missing.empty() ? #fn : ", " #fn;
  HM_ZE_API(HM_ZE_RESOLVE)
#undef HM_ZE_RESOLVE
  if (!missing.empty())
    return "libze_loader.so.1 lacks " + missing + " (a loader older than Level Zero 1.4?)";
  *loader = loaded;
  return {};
}

std::string load_memory_sync(const Loader& ze, ze_driver_handle_t driver, MemorySync* out) {
  MemorySync sync;
  std::string missing;
  auto resolve = [&](const char* name, auto* member) {
    void* address = nullptr;
    ze_result_t result = ze.zeDriverGetExtensionFunctionAddress(driver, name, &address);
    if (result != ZE_RESULT_SUCCESS || address == nullptr) {
      missing += std::string(missing.empty() ? "" : ", ") + name;
      return;
    }
    *member = reinterpret_cast<std::remove_reference_t<decltype(*member)>>(address);
  };
  resolve("zexCommandListAppendWaitOnMemory", &sync.wait_on_memory);
  resolve("zexCommandListAppendWaitOnMemory64", &sync.wait_on_memory64);
  if (!missing.empty())
    return "the driver does not give " + missing +
           " (extension " HETMESH_ZE_MEMORY_SYNC_EXTENSION ")";
  *out = sync;
  return {};
}

std::string result_name(ze_result_t result) {
  switch (result) {
#define HM_ZE_RESULT_CASE(name) \
  case name:                    \
    return #name;
    HM_ZE_RESULTS(HM_ZE_RESULT_CASE)
#undef HM_ZE_RESULT_CASE
    default:
      break;
  }
  char buffer[48];
  std::snprintf(buffer, sizeof buffer, "ze_result_t 0x%08x", static_cast<unsigned>(result));
  return buffer;
}

hm_status status_of(ze_result_t result) {
  switch (result) {
    case ZE_RESULT_SUCCESS:
      return HM_OK;
    case ZE_RESULT_NOT_READY:
      return HM_ERR_NOT_READY;
    case ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY:
    case ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY:
      return HM_ERR_OUT_OF_MEMORY;
    case ZE_RESULT_ERROR_INVALID_ARGUMENT:
    case ZE_RESULT_ERROR_INVALID_NULL_POINTER:
    case ZE_RESULT_ERROR_INVALID_SIZE:
    case ZE_RESULT_ERROR_UNSUPPORTED_SIZE:
    case ZE_RESULT_ERROR_UNSUPPORTED_ALIGNMENT:
    case ZE_RESULT_ERROR_INVALID_ENUMERATION:
    case ZE_RESULT_ERROR_OVERLAPPING_REGIONS:
      return HM_ERR_INVALID_ARGUMENT;
    case ZE_RESULT_ERROR_INVALID_NULL_HANDLE:
    case ZE_RESULT_ERROR_INVALID_SYNCHRONIZATION_OBJECT:
      return HM_ERR_INVALID_HANDLE;
    case ZE_RESULT_ERROR_UNSUPPORTED_VERSION:
    case ZE_RESULT_ERROR_UNSUPPORTED_FEATURE:
    case ZE_RESULT_ERROR_UNSUPPORTED_ENUMERATION:
      return HM_ERR_NOT_SUPPORTED;
    case ZE_RESULT_ERROR_UNINITIALIZED:
      return HM_ERR_UNINITIALIZED;
    // The device was lost, must be reset, or the driver changed under the process.
    case ZE_RESULT_ERROR_DEVICE_LOST:
    case ZE_RESULT_ERROR_DEVICE_REQUIRES_RESET:
    case ZE_RESULT_ERROR_DEVICE_IN_LOW_POWER_STATE:
      return HM_ERR_DEVICE_LOST;
    default:
      return HM_ERR_BACKEND;
  }
}

}  // namespace hm::level_zero
