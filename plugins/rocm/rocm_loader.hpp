// The HIP runtime, loaded at run time.
//
// The plugin never links libamdhip64: initialize() dlopen()s it and resolves each entry point with
// dlsym, so the plugin loads on a machine without ROCm and then reports zero devices with a reason.
// Function pointer types come from the HIP headers the plugin was compiled against (g++ with
// -D__HIP_PLATFORM_AMD__, no hipcc). Struct layouts and enum values of the HIP API changed between
// major versions, so a runtime whose major version differs from the headers' is refused.
#pragma once

#include <hetmesh/device_plugin.h>

#include <hip/hip_runtime_api.h>

#include <string>
#include <type_traits>

namespace hm::rocm {

// Every HIP entry point the plugin requires, by its exported name.
#define HM_HIP_RUNTIME_API(X)  \
  X(hipGetErrorName)           \
  X(hipGetErrorString)         \
  X(hipGetLastError)           \
  X(hipPeekAtLastError)        \
  X(hipRuntimeGetVersion)      \
  X(hipGetDeviceCount)         \
  X(hipGetDevice)              \
  X(hipSetDevice)              \
  X(hipDeviceGetName)          \
  X(hipDeviceTotalMem)         \
  X(hipDeviceGetAttribute)     \
  X(hipDeviceGetPCIBusId)      \
  X(hipDeviceCanAccessPeer)    \
  X(hipDeviceEnablePeerAccess) \
  X(hipFree)                   \
  X(hipHostFree)               \
  X(hipHostRegister)           \
  X(hipHostUnregister)         \
  X(hipPointerGetAttributes)   \
  X(hipMemGetAddressRange)     \
  X(hipMemcpyAsync)            \
  X(hipMemsetAsync)            \
  X(hipStreamCreateWithFlags)  \
  X(hipStreamDestroy)          \
  X(hipStreamQuery)            \
  X(hipStreamSynchronize)      \
  X(hipStreamWaitEvent)        \
  X(hipStreamAddCallback)      \
  X(hipEventCreateWithFlags)   \
  X(hipEventDestroy)           \
  X(hipEventRecord)            \
  X(hipEventQuery)             \
  X(hipEventSynchronize)       \
  X(hipEventElapsedTime)       \
  X(hipStreamWriteValue32)     \
  X(hipStreamWriteValue64)     \
  X(hipStreamWaitValue32)      \
  X(hipStreamWaitValue64)      \
  X(hipIpcGetMemHandle)        \
  X(hipIpcOpenMemHandle)       \
  X(hipIpcCloseMemHandle)

// Entry points the headers overload with C++ templates, so decltype cannot name them: their C
// signatures, spelled out.
#define HM_HIP_RUNTIME_OVERLOADED_API(X)       \
  X(hipMalloc, hipError_t (*)(void**, size_t)) \
  X(hipHostMalloc, hipError_t (*)(void**, size_t, unsigned))

struct Runtime {
#define HM_HIP_MEMBER(fn) decltype(&::fn) fn = nullptr;
#define HM_HIP_OVERLOADED_MEMBER(fn, type) std::type_identity_t<type> fn = nullptr;
  HM_HIP_RUNTIME_API(HM_HIP_MEMBER)
  HM_HIP_RUNTIME_OVERLOADED_API(HM_HIP_OVERLOADED_MEMBER)
#undef HM_HIP_MEMBER
#undef HM_HIP_OVERLOADED_MEMBER
  // Optional: declared by the 5.2 headers but not exported by every libamdhip64 5.x (Debian's
  // 5.2.3 lacks it). NULL means host callbacks go through hipStreamAddCallback.
  decltype(&::hipLaunchHostFunc) hipLaunchHostFunc = nullptr;
  void* library = nullptr;  // the dlopen() handle, never closed
  int version = 0;          // hipRuntimeGetVersion: major * 10000000 + minor * 100000 + patch
};

// Loads libamdhip64 into `runtime`. Returns "" on success, else why HIP is unusable (no library,
// a runtime of another major version than the headers, or an entry point missing).
std::string load_runtime(Runtime* runtime);

// "5.2" from a HIP_VERSION-style number.
std::string version_text(int version);

// The hm_status for a HIP error: NOT_READY, OUT_OF_MEMORY, INVALID_ARGUMENT, INVALID_HANDLE,
// NOT_SUPPORTED, UNINITIALIZED, TIMEOUT, DEVICE_LOST for fatal errors, else HM_ERR_BACKEND.
hm_status status_of(hipError_t error);

// "hipErrorOutOfMemory: out of memory" (texts from the runtime when it is loaded).
std::string describe(const Runtime& runtime, hipError_t error);

}  // namespace hm::rocm
