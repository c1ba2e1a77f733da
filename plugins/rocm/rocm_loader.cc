// Loading libamdhip64 at run time (rocm_loader.hpp says why), hipError_t -> hm_status, and the
// error texts last_error shows.
#include "rocm_loader.hpp"

#include <dlfcn.h>

#include <cstdio>
#include <cstring>

#define HM_HIP_STRINGIZE_EXPANDED(x) HM_HIP_STRINGIZE(x)
#define HM_HIP_STRINGIZE(x) #x

namespace hm::rocm {
namespace {

// The soname of the major version the headers describe first, then the development symlink.
constexpr const char* kLibraryNames[] = {
    "libamdhip64.so." HM_HIP_STRINGIZE_EXPANDED(HIP_VERSION_MAJOR), "libamdhip64.so"};

void* open_library(std::string* errors) {
  for (const char* name : kLibraryNames) {
    // RTLD_LOCAL: the runtime's symbols stay out of the global namespace of the host process.
    if (void* library = dlopen(name, RTLD_NOW | RTLD_LOCAL)) return library;
    const char* error = dlerror();
    *errors += std::string(errors->empty() ? "" : "; ") + (error != nullptr ? error : name);
  }
  return nullptr;
}

}  // namespace

std::string version_text(int version) {
  return std::to_string(version / 10000000) + "." + std::to_string(version / 100000 % 100);
}

std::string load_runtime(Runtime* runtime) {
  std::string errors;
  void* library = open_library(&errors);
  if (library == nullptr) return "no ROCm: libamdhip64 not found (" + errors + ")";
  // Never dlclose the runtime: it may have started threads.
  Runtime loaded;
  loaded.library = library;
  std::string missing;
#define HM_HIP_RESOLVE(fn)                                                \
  loaded.fn = reinterpret_cast<decltype(loaded.fn)>(dlsym(library, #fn)); \
  if (loaded.fn == nullptr) missing += missing.empty() ? #fn : ", " #fn;
#define HM_HIP_RESOLVE_OVERLOADED(fn, type) HM_HIP_RESOLVE(fn)
  HM_HIP_RUNTIME_API(HM_HIP_RESOLVE)
  HM_HIP_RUNTIME_OVERLOADED_API(HM_HIP_RESOLVE_OVERLOADED)
#undef HM_HIP_RESOLVE_OVERLOADED
#undef HM_HIP_RESOLVE
  loaded.hipLaunchHostFunc =
      reinterpret_cast<decltype(loaded.hipLaunchHostFunc)>(dlsym(library, "hipLaunchHostFunc"));

  // The version first: a runtime of another major version explains a missing symbol better.
  if (loaded.hipRuntimeGetVersion == nullptr ||
      loaded.hipRuntimeGetVersion(&loaded.version) != hipSuccess)
    return "libamdhip64 does not report its version (hipRuntimeGetVersion)";
  if (loaded.version / 10000000 != HIP_VERSION_MAJOR)
    return "libamdhip64 is HIP " + version_text(loaded.version) +
           ", this plugin was built against " + "HIP " + version_text(HIP_VERSION) +
           " headers: rebuild it against the installed ROCm";
  if (!missing.empty())
    return "libamdhip64 (HIP " + version_text(loaded.version) + ") lacks " + missing;
  *runtime = loaded;
  return {};
}

hm_status status_of(hipError_t error) {
  switch (error) {
    case hipSuccess:
      return HM_OK;
    case hipErrorNotReady:
      return HM_ERR_NOT_READY;
    case hipErrorOutOfMemory:
      return HM_ERR_OUT_OF_MEMORY;
    case hipErrorInvalidValue:
    case hipErrorInvalidDevice:
    case hipErrorInvalidDevicePointer:
    case hipErrorInvalidMemcpyDirection:
    case hipErrorHostMemoryAlreadyRegistered:
    case hipErrorHostMemoryNotRegistered:
    case hipErrorAlreadyMapped:
    case hipErrorNotMapped:
      return HM_ERR_INVALID_ARGUMENT;
    case hipErrorInvalidHandle:
    case hipErrorInvalidContext:
    case hipErrorContextIsDestroyed:
      return HM_ERR_INVALID_HANDLE;
    case hipErrorNotSupported:
    case hipErrorPeerAccessUnsupported:
      return HM_ERR_NOT_SUPPORTED;
    case hipErrorNotInitialized:
      return HM_ERR_UNINITIALIZED;
    case hipErrorLaunchTimeOut:
      return HM_ERR_TIMEOUT;
    // The device, the driver or the runtime is gone, or a fault poisoned the device.
    case hipErrorNoDevice:
    case hipErrorDeinitialized:
    case hipErrorInsufficientDriver:
    case hipErrorIllegalAddress:
    case hipErrorLaunchFailure:
    case hipErrorPriorLaunchFailure:
    case hipErrorECCNotCorrectable:
    case hipErrorAssert:
      return HM_ERR_DEVICE_LOST;
    default:
      return HM_ERR_BACKEND;
  }
}

std::string describe(const Runtime& runtime, hipError_t error) {
  const char* name = runtime.hipGetErrorName != nullptr ? runtime.hipGetErrorName(error) : nullptr;
  const char* text =
      runtime.hipGetErrorString != nullptr ? runtime.hipGetErrorString(error) : nullptr;
  char buffer[256];
  if (name == nullptr)
    std::snprintf(buffer, sizeof buffer, "hipError_t %d", static_cast<int>(error));
  else if (text == nullptr || std::strcmp(text, name) == 0)  // HIP 5.2 often repeats the name
    std::snprintf(buffer, sizeof buffer, "%s", name);
  else
    std::snprintf(buffer, sizeof buffer, "%s: %s", name, text);
  return buffer;
}

}  // namespace hm::rocm
