// The cuda plugin's stream calls for the kit's GPU layer (gpu_streams.hpp and gpu_memops.hpp in
// hetmesh/plugin_kit have the slots): streams, host callbacks and the stream memory operations.
#include "cuda_slots.hpp"
#include "cuda_state.hpp"

#include <cstdint>

namespace hm::cuda {

// ---- streams ----

void Vendor::create_stream(CUstream* out, bool non_blocking) {
  HM_CU(cuStreamCreate, out, non_blocking ? CU_STREAM_NON_BLOCKING : CU_STREAM_DEFAULT);
}

// Returns at once; CUDA releases the stream after its pending work completes.
void Vendor::destroy_stream(Stream& s) {
  HM_CU(cuStreamDestroy, s.stream);
}

void Vendor::synchronize_stream(CUstream stream) {
  HM_CU(cuStreamSynchronize, stream);
}

bool Vendor::stream_done(CUstream stream) {
  return ready(drv().cuStreamQuery(stream), "cuStreamQuery");
}

void Vendor::launch_host_func(Stream& s, hm_host_fn fn, void* user_data) {
  HM_CU(cuLaunchHostFunc, s.stream, fn, user_data);
}

// ---- stream memory operations ----

namespace {

// CUDA takes the device's address of the word: host memory has its own.
CUdeviceptr device_address_of(const void* address, const Memory& m) {
  if (!m.host) return reinterpret_cast<CUdeviceptr>(address);
  uint64_t offset = reinterpret_cast<uintptr_t>(address) - m.base;
  CUdeviceptr base = m.device_address != 0 ? m.device_address
                                           : host_device_address(reinterpret_cast<void*>(m.base));
  return base + offset;
}

}  // namespace

// The default write has a memory barrier first: prior work on the stream is visible (release).
void Vendor::write_value32(Stream& s, void* address, const Memory& m, uint32_t value) {
  HM_CU(cuStreamWriteValue32, s.stream, device_address_of(address, m), value,
        CU_STREAM_WRITE_VALUE_DEFAULT);
}

void Vendor::wait_value32(Stream& s, const DeviceState& d, const void* address, const Memory& m,
                          uint32_t value, int32_t, unsigned flags) {
  CUdeviceptr target = device_address_of(address, m);
  // A NIC may have written the data before the flag: make its writes visible to later work.
  if (d.flush_remote_writes) flags |= CU_STREAM_WAIT_VALUE_FLUSH;
  HM_CU(cuStreamWaitValue32, s.stream, target, value, flags);
}

}  // namespace hm::cuda
