// Loading libcuda.so.1 at run time (cuda_loader.hpp says why), CUresult -> hm_status, and the
// error texts last_error shows.
#include "cuda_loader.hpp"

#include <dlfcn.h>

#include <cstdio>

#define HM_CUDA_STRINGIZE_EXPANDED(x) HM_CUDA_STRINGIZE(x)
#define HM_CUDA_STRINGIZE(x) #x

namespace hm::cuda {
namespace {

using GetProcAddress = decltype(&::cuGetProcAddress);

// Resolves one entry point: cuGetProcAddress(name, CUDA_VERSION) first, which picks the variant
// matching our headers, else the exact versioned symbol from the headers through dlsym.
bool resolve(void* library, GetProcAddress get_proc_address, const char* name,
             const char* versioned_symbol, void** out) {
  *out = nullptr;
  if (get_proc_address != nullptr) {
    CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    if (get_proc_address(name, out, CUDA_VERSION, CU_GET_PROC_ADDRESS_DEFAULT, &found) ==
            CUDA_SUCCESS &&
        found == CU_GET_PROC_ADDRESS_SUCCESS && *out != nullptr)
      return true;
    *out = nullptr;
  }
  *out = dlsym(library, versioned_symbol);
  return *out != nullptr;
}

}  // namespace

std::string load_driver(Driver* driver) {
  // RTLD_LOCAL: the driver's symbols stay out of the global namespace of the host process.
  void* library = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    const char* error = dlerror();
    return std::string("no NVIDIA driver: libcuda.so.1 not found (") +
           (error != nullptr ? error : "dlopen failed") + ")";
  }
  auto get_proc_address = reinterpret_cast<GetProcAddress>(
      dlsym(library, HM_CUDA_STRINGIZE_EXPANDED(cuGetProcAddress)));
  Driver loaded;
  std::string missing;
#define HM_CUDA_RESOLVE(fn)                                                    \
  if (!resolve(library, get_proc_address, #fn, HM_CUDA_STRINGIZE_EXPANDED(fn), \
               reinterpret_cast<void**>(&loaded.fn)))                          \
    missing += missing.empty() ? #fn : ", " #fn;
  HM_CUDA_DRIVER_API(HM_CUDA_RESOLVE)
#undef HM_CUDA_RESOLVE
  if (!missing.empty()) {
    // Never dlclose the driver: it may have started threads. Name what is missing and the version.
    int version = 0;
    if (loaded.cuDriverGetVersion != nullptr) loaded.cuDriverGetVersion(&version);
    char text[160];
    std::snprintf(text, sizeof text,
                  "the NVIDIA driver (CUDA %d.%d) is older than this plugin's CUDA %d.%d headers: ",
                  version / 1000, version % 1000 / 10, CUDA_VERSION / 1000,
                  CUDA_VERSION % 1000 / 10);
    return text + missing + " not found in libcuda.so.1";
  }
  *driver = loaded;
  return {};
}

hm_status status_of(CUresult result) {
  switch (result) {
    case CUDA_SUCCESS:
      return HM_OK;
    case CUDA_ERROR_NOT_READY:
      return HM_ERR_NOT_READY;
    case CUDA_ERROR_OUT_OF_MEMORY:
      return HM_ERR_OUT_OF_MEMORY;
    case CUDA_ERROR_INVALID_VALUE:
    case CUDA_ERROR_INVALID_DEVICE:
    case CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED:
    case CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED:
    case CUDA_ERROR_ALREADY_MAPPED:
    case CUDA_ERROR_NOT_MAPPED:
      return HM_ERR_INVALID_ARGUMENT;
    case CUDA_ERROR_INVALID_HANDLE:
    case CUDA_ERROR_INVALID_CONTEXT:
    case CUDA_ERROR_CONTEXT_IS_DESTROYED:
      return HM_ERR_INVALID_HANDLE;
    case CUDA_ERROR_NOT_SUPPORTED:
    case CUDA_ERROR_NOT_PERMITTED:
    case CUDA_ERROR_PEER_ACCESS_UNSUPPORTED:
    case CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER:
      return HM_ERR_NOT_SUPPORTED;
    case CUDA_ERROR_NOT_INITIALIZED:
      return HM_ERR_UNINITIALIZED;
    case CUDA_ERROR_TIMEOUT:
    case CUDA_ERROR_LAUNCH_TIMEOUT:
      return HM_ERR_TIMEOUT;
    // Sticky errors corrupt the context; the rest mean the device or driver is gone.
    case CUDA_ERROR_DEINITIALIZED:
    case CUDA_ERROR_NO_DEVICE:
    case CUDA_ERROR_DEVICE_UNAVAILABLE:
    case CUDA_ERROR_DEVICE_NOT_LICENSED:
    case CUDA_ERROR_ECC_UNCORRECTABLE:
    case CUDA_ERROR_NVLINK_UNCORRECTABLE:
    case CUDA_ERROR_CONTAINED:
    case CUDA_ERROR_ILLEGAL_ADDRESS:
    case CUDA_ERROR_ASSERT:
    case CUDA_ERROR_HARDWARE_STACK_ERROR:
    case CUDA_ERROR_ILLEGAL_INSTRUCTION:
    case CUDA_ERROR_MISALIGNED_ADDRESS:
    case CUDA_ERROR_INVALID_ADDRESS_SPACE:
    case CUDA_ERROR_INVALID_PC:
    case CUDA_ERROR_LAUNCH_FAILED:
    case CUDA_ERROR_SYSTEM_NOT_READY:
    case CUDA_ERROR_SYSTEM_DRIVER_MISMATCH:
    case CUDA_ERROR_EXTERNAL_DEVICE:
      return HM_ERR_DEVICE_LOST;
    default:
      return HM_ERR_BACKEND;
  }
}

namespace {

// Names for the errors a broken or missing driver gives, for when cuGetErrorName cannot answer
// (the toolkit's stub libcuda answers nothing).
const char* fallback_name(CUresult result, const char** text) {
  switch (result) {
    case CUDA_ERROR_NOT_INITIALIZED:
      *text = "initialization error";
      return "CUDA_ERROR_NOT_INITIALIZED";
    case CUDA_ERROR_STUB_LIBRARY:
      *text = "the CUDA driver loaded is a stub library, not a real driver";
      return "CUDA_ERROR_STUB_LIBRARY";
    case CUDA_ERROR_NO_DEVICE:
      *text = "no CUDA-capable device is detected";
      return "CUDA_ERROR_NO_DEVICE";
    case CUDA_ERROR_SYSTEM_DRIVER_MISMATCH:
      *text = "system has unsupported display driver / cuda driver combination";
      return "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH";
    case CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE:
      *text = "forward compatibility was attempted on non supported HW";
      return "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE";
    case CUDA_ERROR_OPERATING_SYSTEM:
      *text = "OS call failed or operation not supported on this OS";
      return "CUDA_ERROR_OPERATING_SYSTEM";
    default:
      return nullptr;
  }
}

}  // namespace

std::string describe(const Driver& driver, CUresult result) {
  const char* name = nullptr;
  const char* text = nullptr;
  if (driver.cuGetErrorName == nullptr || driver.cuGetErrorName(result, &name) != CUDA_SUCCESS)
    name = nullptr;
  if (driver.cuGetErrorString == nullptr || driver.cuGetErrorString(result, &text) != CUDA_SUCCESS)
    text = nullptr;
  if (name == nullptr) name = fallback_name(result, &text);
  char buffer[256];
  if (name == nullptr)
    std::snprintf(buffer, sizeof buffer, "CUresult %d", static_cast<int>(result));
  else
    std::snprintf(buffer, sizeof buffer, "%s: %s", name, text != nullptr ? text : "(no text)");
  return buffer;
}

}  // namespace hm::cuda
