// The stream slots of the cuda plugin: create, destroy, synchronize (with a timeout), query, host
// callbacks, and the stream memory operations (write_value32 / wait_value32), which are enqueued on
// a stream and gated by its device's HM_CAP_STREAM_MEMOPS.
#include "cuda_slots.hpp"
#include "cuda_state.hpp"

#include <cstdint>
#include <memory>

namespace hm::cuda {

// ---- slots: streams ----

hm_status stream_create(int32_t device, uint32_t flags, hm_stream* out) {
  return guarded("stream_create", [&] {
    device_state(device);
    if (out == nullptr) fail(HM_ERR_INVALID_ARGUMENT, "stream output is NULL");
    if ((flags & ~HM_STREAM_NON_BLOCKING) != 0)
      fail(HM_ERR_INVALID_ARGUMENT, "unknown stream flags 0x%x", flags);
    ContextScope scope(device);
    auto stream = std::make_unique<Stream>();
    stream->device = device;
    HM_CU(cuStreamCreate, &stream->stream,
          (flags & HM_STREAM_NON_BLOCKING) != 0 ? CU_STREAM_NON_BLOCKING : CU_STREAM_DEFAULT);
    *out = reinterpret_cast<hm_stream>(stream.release());
  });
}

hm_status stream_destroy(hm_stream stream) {
  return guarded("stream_destroy", [&] {
    Stream& s = stream_of(stream);
    ContextScope scope(s.device);
    // Returns at once; CUDA releases the stream after its pending work completes.
    CUresult result = drv().cuStreamDestroy(s.stream);
    s.magic = 0;
    delete &s;
    check(result, "cuStreamDestroy");
  });
}

hm_status stream_synchronize(hm_stream stream, uint64_t timeout_ns) {
  return guarded("stream_synchronize", [&] {
    Stream& s = stream_of(stream);
    ContextScope scope(s.device);
    if (timeout_ns == HM_TIMEOUT_INFINITE) {
      HM_CU(cuStreamSynchronize, s.stream);
      return;
    }
    const Driver& d = drv();
    poll_until_done([&] { return d.cuStreamQuery(s.stream); }, timeout_ns, "cuStreamQuery",
                    "stream work");
  });
}

hm_status stream_query(hm_stream stream) {
  return guarded("stream_query", [&]() -> hm_status {
    Stream& s = stream_of(stream);
    ContextScope scope(s.device);
    CUresult result = drv().cuStreamQuery(s.stream);
    if (result == CUDA_ERROR_NOT_READY) return HM_ERR_NOT_READY;
    check(result, "cuStreamQuery");
    return HM_OK;
  });
}

hm_status stream_add_callback(hm_stream stream, hm_host_fn fn, void* user_data) {
  return guarded("stream_add_callback", [&] {
    Stream& s = stream_of(stream);
    if (fn == nullptr) fail(HM_ERR_INVALID_ARGUMENT, "callback is NULL");
    ContextScope scope(s.device);
    // Runs on a driver thread once prior work completes; later work waits for it to return.
    HM_CU(cuLaunchHostFunc, s.stream, fn, user_data);
  });
}

// ---- slots: stream memory operations ----

namespace {

// The device address of a 32-bit word in device, pinned or registered memory.
CUdeviceptr memop_address(const void* address, const DeviceState& stream_device) {
  require(stream_device, HM_CAP_STREAM_MEMOPS, "stream memory operations");
  if (address == nullptr) fail(HM_ERR_INVALID_ARGUMENT, "address is NULL");
  if (reinterpret_cast<uintptr_t>(address) % 4 != 0)
    fail(HM_ERR_INVALID_ARGUMENT, "address %p is not 4-byte aligned", address);
  Memory m = classify(address);
  if (m.kind == HM_MEM_UNKNOWN)
    fail(HM_ERR_INVALID_ARGUMENT,
         "%p is not device, pinned or registered memory of this plugin (plain host memory must "
         "be registered with host_register first)",
         address);
  uint64_t offset = reinterpret_cast<uintptr_t>(address) - m.base;
  if (offset + 4 > m.size)
    fail(HM_ERR_INVALID_ARGUMENT, "the word at %p overruns its allocation", address);
  if (!m.host) return reinterpret_cast<CUdeviceptr>(address);
  CUdeviceptr base = m.device_address != 0 ? m.device_address
                                           : host_device_address(reinterpret_cast<void*>(m.base));
  return base + offset;
}

}  // namespace

hm_status stream_write_value32(hm_stream stream, void* address, uint32_t value, uint32_t flags) {
  return guarded("stream_write_value32", [&] {
    Stream& s = stream_of(stream);
    if (flags != 0) fail(HM_ERR_INVALID_ARGUMENT, "flags must be 0, got 0x%x", flags);
    ContextScope scope(s.device);
    CUdeviceptr target = memop_address(address, device_state(s.device));
    // The default write has a memory barrier first: prior work on the stream is visible (release).
    HM_CU(cuStreamWriteValue32, s.stream, target, value, CU_STREAM_WRITE_VALUE_DEFAULT);
  });
}

hm_status stream_wait_value32(hm_stream stream, const void* address, uint32_t value,
                              int32_t condition, uint32_t flags) {
  return guarded("stream_wait_value32", [&] {
    Stream& s = stream_of(stream);
    if (flags != 0) fail(HM_ERR_INVALID_ARGUMENT, "flags must be 0, got 0x%x", flags);
    unsigned cu_flags;
    switch (condition) {
      case HM_WAIT_GEQ:  // CUDA's GEQ is the cyclic (int32_t)(*addr - value) >= 0, as the ABI's
        cu_flags = CU_STREAM_WAIT_VALUE_GEQ;
        break;
      case HM_WAIT_EQ:
        cu_flags = CU_STREAM_WAIT_VALUE_EQ;
        break;
      case HM_WAIT_AND:
        cu_flags = CU_STREAM_WAIT_VALUE_AND;
        break;
      case HM_WAIT_NOR:
        cu_flags = CU_STREAM_WAIT_VALUE_NOR;
        break;
      default:
        fail(HM_ERR_INVALID_ARGUMENT, "unknown wait condition %d", condition);
    }
    ContextScope scope(s.device);
    const DeviceState& d = device_state(s.device);
    CUdeviceptr target = memop_address(address, d);
    // A NIC may have written the data before the flag: make its writes visible to later work.
    if (d.flush_remote_writes) cu_flags |= CU_STREAM_WAIT_VALUE_FLUSH;
    HM_CU(cuStreamWaitValue32, s.stream, target, value, cu_flags);
  });
}

}  // namespace hm::cuda
