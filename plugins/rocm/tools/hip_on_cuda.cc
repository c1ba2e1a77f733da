// libamdhip64.so.5 made of the CUDA driver API: the HIP 5.2 entry points the rocm plugin resolves
// (plugins/rocm/rocm_loader.hpp), each done by its CUDA counterpart, so that the rocm plugin's own
// code (unchanged, still dlopen()ing "libamdhip64.so.5") runs on NVIDIA GPUs. A test tool for a
// project with no AMD GPU: ci/gpu/build-and-test.sh puts it first on LD_LIBRARY_PATH for one CTS
// run of the rocm plugin on the H200s, labelled as such. It says nothing about AMD hardware or the
// real HIP runtime; it does run every line of the plugin's HIP calls, its relay and the kit's GPU
// layer through a second vendor.
//
// HIP semantics kept: a current device per thread (device 0 until hipSetDevice), the primary
// context of that device made current for each call, a per-thread last error (hipGetLastError
// clears it, hipPeekAtLastError does not), HIP's struct layouts, flags and enum values (from the
// HIP headers this is compiled against). Error numbers pass through: HIP gave its errors CUDA's
// numbers. Not kept: HIP's unsigned hipStreamWaitValueGte becomes CUDA's cyclic GEQ (the same for
// the plugin's relay, whose 64-bit tickets never wrap), and masks other than all-ones are refused.
#include <hip/hip_runtime_api.h>

#include <cuda.h>

#include <cstring>
#include <mutex>
#include <vector>

namespace {

thread_local int t_device = 0;
thread_local hipError_t t_last_error = hipSuccess;

std::once_flag g_init_once;
CUresult g_init_result = CUDA_SUCCESS;
std::mutex g_contexts_mutex;
std::vector<CUcontext> g_contexts;  // [device]: its retained primary context, or null

hipError_t record(CUresult result) {
  // CUDA_ERROR_NOT_FOUND has no HIP twin of that meaning for these calls: an unknown pointer.
  auto error =
      static_cast<hipError_t>(result == CUDA_ERROR_NOT_FOUND ? CUDA_ERROR_INVALID_VALUE : result);
  if (error != hipSuccess && error != hipErrorNotReady) t_last_error = error;
  return error;
}

CUresult initialize() {
  std::call_once(g_init_once, [] {
    g_init_result = cuInit(0);
    int count = 0;
    if (g_init_result == CUDA_SUCCESS) g_init_result = cuDeviceGetCount(&count);
    g_contexts.assign(static_cast<size_t>(count), nullptr);
  });
  return g_init_result;
}

CUresult context_of(int device, CUcontext* out) {
  if (CUresult r = initialize(); r != CUDA_SUCCESS) return r;
  std::lock_guard lock(g_contexts_mutex);
  if (device < 0 || static_cast<size_t>(device) >= g_contexts.size())
    return CUDA_ERROR_INVALID_DEVICE;
  CUcontext& context = g_contexts[static_cast<size_t>(device)];
  if (context == nullptr) {
    CUdevice handle = 0;
    if (CUresult r = cuDeviceGet(&handle, device); r != CUDA_SUCCESS) return r;
    if (CUresult r = cuDevicePrimaryCtxRetain(&context, handle); r != CUDA_SUCCESS) return r;
  }
  *out = context;
  return CUDA_SUCCESS;
}

// Makes the calling thread's HIP device current, as every HIP call does implicitly.
CUresult make_current() {
  CUcontext context = nullptr;
  if (CUresult r = context_of(t_device, &context); r != CUDA_SUCCESS) return r;
  return cuCtxSetCurrent(context);
}

// Runs `call` with the thread's device current; records and returns the HIP error.
template <typename Call>
hipError_t in_context(Call call) {
  CUresult r = make_current();
  return record(r != CUDA_SUCCESS ? r : call());
}

CUdeviceptr address(const void* pointer) {
  return reinterpret_cast<CUdeviceptr>(pointer);
}

// The device's address of a host or device word (host memory: its mapped device address).
CUresult device_address(void* pointer, CUdeviceptr* out) {
  unsigned type = 0;
  CUresult r = cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, address(pointer));
  if (r == CUDA_SUCCESS && type == CU_MEMORYTYPE_HOST)
    return cuMemHostGetDevicePointer(out, pointer, 0);
  *out = address(pointer);
  return CUDA_SUCCESS;
}

// A stream memory operation on a word: runs `op(stream, device address of pointer)` in the thread's
// context.
template <typename Op>
hipError_t on_word(hipStream_t s, void* pointer, Op op) {
  return in_context([&] {
    CUdeviceptr target = 0;
    if (CUresult r = device_address(pointer, &target); r != CUDA_SUCCESS) return r;
    return op(reinterpret_cast<CUstream>(s), target);
  });
}

}  // namespace

extern "C" {

// ---- errors and versions ----

const char* hipGetErrorName(hipError_t error) {
  const char* name = nullptr;
  return cuGetErrorName(static_cast<CUresult>(error), &name) == CUDA_SUCCESS ? name
                                                                             : "hipErrorUnknown";
}

const char* hipGetErrorString(hipError_t error) {
  const char* text = nullptr;
  return cuGetErrorString(static_cast<CUresult>(error), &text) == CUDA_SUCCESS ? text
                                                                               : "unknown error";
}

hipError_t hipGetLastError() {
  hipError_t error = t_last_error;
  t_last_error = hipSuccess;
  return error;
}

hipError_t hipPeekAtLastError() {
  return t_last_error;
}

hipError_t hipRuntimeGetVersion(int* version) {
  if (version == nullptr) return record(CUDA_ERROR_INVALID_VALUE);
  *version = HIP_VERSION;  // the headers' HIP: what the plugin was built against
  return hipSuccess;
}

// ---- devices ----

hipError_t hipGetDeviceCount(int* count) {
  if (CUresult r = initialize(); r != CUDA_SUCCESS) return record(r);
  return record(cuDeviceGetCount(count));
}

hipError_t hipGetDevice(int* device) {
  if (device == nullptr) return record(CUDA_ERROR_INVALID_VALUE);
  *device = t_device;
  return hipSuccess;
}

hipError_t hipSetDevice(int device) {
  CUcontext context = nullptr;
  if (CUresult r = context_of(device, &context); r != CUDA_SUCCESS) return record(r);
  t_device = device;
  return record(cuCtxSetCurrent(context));
}

hipError_t hipDeviceGetName(char* name, int length, int device) {
  if (CUresult r = initialize(); r != CUDA_SUCCESS) return record(r);
  return record(cuDeviceGetName(name, length, device));
}

hipError_t hipDeviceTotalMem(size_t* bytes, int device) {
  if (CUresult r = initialize(); r != CUDA_SUCCESS) return record(r);
  return record(cuDeviceTotalMem(bytes, device));
}

hipError_t hipDeviceGetAttribute(int* value, hipDeviceAttribute_t attribute, int device) {
  if (CUresult r = initialize(); r != CUDA_SUCCESS) return record(r);
  switch (attribute) {
    case hipDeviceAttributeCanUseStreamWaitValue:
      return record(
          cuDeviceGetAttribute(value, CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR, device));
    default:
      return record(CUDA_ERROR_INVALID_VALUE);  // only what the plugin asks is translated
  }
}

hipError_t hipDeviceGetPCIBusId(char* bus, int length, int device) {
  if (CUresult r = initialize(); r != CUDA_SUCCESS) return record(r);
  return record(cuDeviceGetPCIBusId(bus, length, device));
}

hipError_t hipDeviceCanAccessPeer(int* can, int device, int peer) {
  if (CUresult r = initialize(); r != CUDA_SUCCESS) return record(r);
  return record(cuDeviceCanAccessPeer(can, device, peer));
}

hipError_t hipDeviceEnablePeerAccess(int peer, unsigned flags) {
  CUcontext context = nullptr;
  if (CUresult r = context_of(peer, &context); r != CUDA_SUCCESS) return record(r);
  return in_context([&] { return cuCtxEnablePeerAccess(context, flags); });
}

// ---- memory ----

hipError_t hipMalloc(void** pointer, size_t size) {
  return in_context([&] { return cuMemAlloc(reinterpret_cast<CUdeviceptr*>(pointer), size); });
}

hipError_t hipFree(void* pointer) {
  return in_context([&] { return cuMemFree(address(pointer)); });
}

hipError_t hipHostMalloc(void** pointer, size_t size, unsigned flags) {
  unsigned cuda = ((flags & hipHostMallocPortable) ? CU_MEMHOSTALLOC_PORTABLE : 0) |
                  ((flags & hipHostMallocMapped) ? CU_MEMHOSTALLOC_DEVICEMAP : 0);
  return in_context([&] { return cuMemHostAlloc(pointer, size, cuda); });
}

hipError_t hipHostFree(void* pointer) {
  return in_context([&] { return cuMemFreeHost(pointer); });
}

hipError_t hipHostRegister(void* pointer, size_t size, unsigned flags) {
  unsigned cuda = ((flags & hipHostRegisterPortable) ? CU_MEMHOSTREGISTER_PORTABLE : 0) |
                  ((flags & hipHostRegisterMapped) ? CU_MEMHOSTREGISTER_DEVICEMAP : 0);
  return in_context([&] { return cuMemHostRegister(pointer, size, cuda); });
}

hipError_t hipHostUnregister(void* pointer) {
  return in_context([&] { return cuMemHostUnregister(pointer); });
}

hipError_t hipPointerGetAttributes(hipPointerAttribute_t* attributes, const void* pointer) {
  if (attributes == nullptr) return record(CUDA_ERROR_INVALID_VALUE);
  return in_context([&] {
    unsigned type = 0;
    int ordinal = -1, managed = 0;
    void *device_pointer = nullptr, *host_pointer = nullptr;
    CUpointer_attribute names[] = {
        CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
        CU_POINTER_ATTRIBUTE_DEVICE_POINTER, CU_POINTER_ATTRIBUTE_HOST_POINTER,
        CU_POINTER_ATTRIBUTE_IS_MANAGED};
    void* values[] = {&type, &ordinal, &device_pointer, &host_pointer, &managed};
    CUresult r = cuPointerGetAttributes(5, names, values, address(pointer));
    if (r != CUDA_SUCCESS) return r;
    if (type == 0) return CUDA_ERROR_INVALID_VALUE;  // memory CUDA does not know, as HIP answers
    *attributes = hipPointerAttribute_t{};
    attributes->memoryType = type == CU_MEMORYTYPE_DEVICE ? hipMemoryTypeDevice : hipMemoryTypeHost;
    attributes->device = ordinal;
    attributes->devicePointer = device_pointer;
    attributes->hostPointer = host_pointer;
    attributes->isManaged = managed;
    return CUDA_SUCCESS;
  });
}

hipError_t hipMemGetAddressRange(hipDeviceptr_t* base, size_t* size, hipDeviceptr_t pointer) {
  return in_context([&] {
    return cuMemGetAddressRange(reinterpret_cast<CUdeviceptr*>(base), size, address(pointer));
  });
}

hipError_t hipMemcpyAsync(void* dst, const void* src, size_t size, hipMemcpyKind, hipStream_t s) {
  return in_context([&] {
    return cuMemcpyAsync(address(dst), address(src), size, reinterpret_cast<CUstream>(s));
  });
}

hipError_t hipMemsetAsync(void* dst, int value, size_t size, hipStream_t s) {
  return in_context([&] {
    return cuMemsetD8Async(address(dst), static_cast<unsigned char>(value), size,
                           reinterpret_cast<CUstream>(s));
  });
}

// ---- streams ----

hipError_t hipStreamCreateWithFlags(hipStream_t* stream, unsigned flags) {
  return in_context([&] {
    return cuStreamCreate(reinterpret_cast<CUstream*>(stream),
                          (flags & hipStreamNonBlocking) ? CU_STREAM_NON_BLOCKING : 0);
  });
}

hipError_t hipStreamDestroy(hipStream_t s) {
  return in_context([&] { return cuStreamDestroy(reinterpret_cast<CUstream>(s)); });
}

hipError_t hipStreamQuery(hipStream_t s) {
  return in_context([&] { return cuStreamQuery(reinterpret_cast<CUstream>(s)); });
}

hipError_t hipStreamSynchronize(hipStream_t s) {
  return in_context([&] { return cuStreamSynchronize(reinterpret_cast<CUstream>(s)); });
}

hipError_t hipStreamWaitEvent(hipStream_t s, hipEvent_t event, unsigned flags) {
  return in_context([&] {
    return cuStreamWaitEvent(reinterpret_cast<CUstream>(s), reinterpret_cast<CUevent>(event),
                             flags);
  });
}

hipError_t hipStreamAddCallback(hipStream_t s, hipStreamCallback_t callback, void* user,
                                unsigned flags) {
  // hipStreamCallback_t(hipStream_t, hipError_t, void*) and CUstreamCallback have one ABI.
  return in_context([&] {
    return cuStreamAddCallback(reinterpret_cast<CUstream>(s),
                               reinterpret_cast<CUstreamCallback>(callback), user, flags);
  });
}

// ---- events ----

hipError_t hipEventCreateWithFlags(hipEvent_t* event, unsigned flags) {
  unsigned cuda = (flags & hipEventDisableTiming) ? CU_EVENT_DISABLE_TIMING : CU_EVENT_DEFAULT;
  return in_context([&] { return cuEventCreate(reinterpret_cast<CUevent*>(event), cuda); });
}

hipError_t hipEventDestroy(hipEvent_t event) {
  return in_context([&] { return cuEventDestroy(reinterpret_cast<CUevent>(event)); });
}

hipError_t hipEventRecord(hipEvent_t event, hipStream_t s) {
  return in_context([&] {
    return cuEventRecord(reinterpret_cast<CUevent>(event), reinterpret_cast<CUstream>(s));
  });
}

hipError_t hipEventQuery(hipEvent_t event) {
  return in_context([&] { return cuEventQuery(reinterpret_cast<CUevent>(event)); });
}

hipError_t hipEventSynchronize(hipEvent_t event) {
  return in_context([&] { return cuEventSynchronize(reinterpret_cast<CUevent>(event)); });
}

hipError_t hipEventElapsedTime(float* ms, hipEvent_t start, hipEvent_t stop) {
  return in_context([&] {
    return cuEventElapsedTime(ms, reinterpret_cast<CUevent>(start),
                              reinterpret_cast<CUevent>(stop));
  });
}

// ---- stream memory operations (HIP's wait flags have CUDA's values: GEQ 0, EQ 1, AND 2, NOR 3) --

hipError_t hipStreamWriteValue32(hipStream_t s, void* pointer, uint32_t value, unsigned flags) {
  return on_word(s, pointer, [&](CUstream stream, CUdeviceptr target) {
    return cuStreamWriteValue32(stream, target, value, flags);
  });
}

hipError_t hipStreamWriteValue64(hipStream_t s, void* pointer, uint64_t value, unsigned flags) {
  return on_word(s, pointer, [&](CUstream stream, CUdeviceptr target) {
    return cuStreamWriteValue64(stream, target, value, flags);
  });
}

hipError_t hipStreamWaitValue32(hipStream_t s, void* pointer, uint32_t value, unsigned flags,
                                uint32_t mask) {
  if (mask != ~uint32_t{0}) return record(CUDA_ERROR_NOT_SUPPORTED);
  return on_word(s, pointer, [&](CUstream stream, CUdeviceptr target) {
    return cuStreamWaitValue32(stream, target, value, flags);
  });
}

hipError_t hipStreamWaitValue64(hipStream_t s, void* pointer, uint64_t value, unsigned flags,
                                uint64_t mask) {
  if (mask != ~uint64_t{0}) return record(CUDA_ERROR_NOT_SUPPORTED);
  return on_word(s, pointer, [&](CUstream stream, CUdeviceptr target) {
    return cuStreamWaitValue64(stream, target, value, flags);
  });
}

// ---- IPC (both runtimes' handles are 64 opaque bytes) ----

static_assert(sizeof(hipIpcMemHandle_t) == sizeof(CUipcMemHandle));

hipError_t hipIpcGetMemHandle(hipIpcMemHandle_t* handle, void* pointer) {
  return in_context([&] {
    return cuIpcGetMemHandle(reinterpret_cast<CUipcMemHandle*>(handle), address(pointer));
  });
}

hipError_t hipIpcOpenMemHandle(void** pointer, hipIpcMemHandle_t handle, unsigned) {
  return in_context([&] {
    CUipcMemHandle cuda;
    static_assert(sizeof cuda == sizeof handle);
    std::memcpy(&cuda, &handle, sizeof cuda);
    return cuIpcOpenMemHandle(reinterpret_cast<CUdeviceptr*>(pointer), cuda,
                              CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
  });
}

hipError_t hipIpcCloseMemHandle(void* pointer) {
  return in_context([&] { return cuIpcCloseMemHandle(address(pointer)); });
}

}  // extern "C"
