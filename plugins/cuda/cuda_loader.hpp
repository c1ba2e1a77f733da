// The CUDA driver API, loaded at run time.
//
// The plugin never links libcuda: initialize() dlopen()s libcuda.so.1 and resolves each entry point
// through cuGetProcAddress (falling back to dlsym of the versioned symbol the headers name), so the
// plugin loads on a machine without any NVIDIA driver and then reports zero devices with a reason.
// Function pointer types come from the CUDA headers the plugin was compiled against
// (decltype(&::cuMemAlloc) is the type of cuMemAlloc_v2 in CUDA 13), and cuGetProcAddress is asked
// for the version of each symbol that matches those headers (CUDA_VERSION).
#pragma once

#include <hetmesh/device_plugin.h>

#include <cuda.h>

#include <string>

namespace hm::cuda {

// Every driver entry point the plugin calls. The names are the unversioned API names; cuda.h maps
// them to the versioned symbols (cuMemAlloc -> cuMemAlloc_v2) both here and at the call sites.
#define HM_CUDA_DRIVER_API(X)  \
  X(cuGetErrorName)            \
  X(cuGetErrorString)          \
  X(cuInit)                    \
  X(cuDriverGetVersion)        \
  X(cuDeviceGetCount)          \
  X(cuDeviceGet)               \
  X(cuDeviceGetName)           \
  X(cuDeviceTotalMem)          \
  X(cuDeviceGetAttribute)      \
  X(cuDeviceGetPCIBusId)       \
  X(cuDeviceCanAccessPeer)     \
  X(cuDevicePrimaryCtxRetain)  \
  X(cuDevicePrimaryCtxRelease) \
  X(cuCtxGetCurrent)           \
  X(cuCtxSetCurrent)           \
  X(cuCtxEnablePeerAccess)     \
  X(cuMemAlloc)                \
  X(cuMemFree)                 \
  X(cuMemHostAlloc)            \
  X(cuMemFreeHost)             \
  X(cuMemHostRegister)         \
  X(cuMemHostUnregister)       \
  X(cuMemHostGetDevicePointer) \
  X(cuPointerGetAttributes)    \
  X(cuMemGetAddressRange)      \
  X(cuMemcpyAsync)             \
  X(cuMemsetD8Async)           \
  X(cuStreamCreate)            \
  X(cuStreamDestroy)           \
  X(cuStreamQuery)             \
  X(cuStreamSynchronize)       \
  X(cuStreamWaitEvent)         \
  X(cuLaunchHostFunc)          \
  X(cuEventCreate)             \
  X(cuEventDestroy)            \
  X(cuEventRecord)             \
  X(cuEventQuery)              \
  X(cuEventSynchronize)        \
  X(cuEventElapsedTime)        \
  X(cuStreamWriteValue32)      \
  X(cuStreamWaitValue32)       \
  X(cuIpcGetMemHandle)         \
  X(cuIpcOpenMemHandle)        \
  X(cuIpcCloseMemHandle)       \
  X(cuMemGetHandleForAddressRange)

struct Driver {
#define HM_CUDA_DRIVER_MEMBER(fn) decltype(&::fn) fn = nullptr;
  HM_CUDA_DRIVER_API(HM_CUDA_DRIVER_MEMBER)
#undef HM_CUDA_DRIVER_MEMBER
};

// Loads libcuda.so.1 into `driver`. Returns "" on success, else why the driver is unusable (no
// library, or an entry point missing because the driver is older than the headers).
std::string load_driver(Driver* driver);

// The hm_status for a CUDA error: NOT_READY, OUT_OF_MEMORY, INVALID_ARGUMENT, INVALID_HANDLE,
// NOT_SUPPORTED, TIMEOUT, DEVICE_LOST for sticky and fatal errors, else HM_ERR_BACKEND.
hm_status status_of(CUresult result);

// "CUDA_ERROR_OUT_OF_MEMORY: out of memory" (names from the driver when it is loaded).
std::string describe(const Driver& driver, CUresult result);

}  // namespace hm::cuda
