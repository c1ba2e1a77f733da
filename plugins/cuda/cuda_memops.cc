// The cuda plugin's stream memory operations for the kit's GPU layer
// (hetmesh/plugin_kit/gpu_memops.hpp has the slots): cuStreamWriteValue32 and cuStreamWaitValue32
// on the device's address of the word.
#include "cuda_slots.hpp"
#include "cuda_state.hpp"

#include <cstdint>

namespace hm::cuda {

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
