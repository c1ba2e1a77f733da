// The stream memory operation slots of a GPU plugin (stream_write_value32, stream_wait_value32):
// the argument checks, with the enqueueing left to V::write_value32 / V::wait_value32, which
// differ by runtime (the address CUDA wants, HIP's non-cyclic GEQ).
#pragma once

#include "gpu_address.hpp"
#include "gpu_handles.hpp"
#include "gpu_state.hpp"
#include "status.hpp"

#include <cstdint>

namespace hm::kit::gpu {

// The 32-bit word of a stream memory operation: 4-byte aligned, inside device, pinned or
// registered memory of the plugin, and the stream's device has HM_CAP_STREAM_MEMOPS.
template <typename V>
Memory memop_word(const void* address, const Device& stream_device) {
  require(stream_device, HM_CAP_STREAM_MEMOPS, "stream memory operations");
  if (address == nullptr) fail(HM_ERR_INVALID_ARGUMENT, "address is NULL");
  if (reinterpret_cast<uintptr_t>(address) % 4 != 0)
    fail(HM_ERR_INVALID_ARGUMENT, "address %p is not 4-byte aligned", address);
  Memory m = classify<V>(address);
  if (m.kind == HM_MEM_UNKNOWN)
    fail(HM_ERR_INVALID_ARGUMENT,
         "%p is not device, pinned or registered memory of this plugin (plain host memory must "
         "be registered with host_register first)",
         address);
  if (reinterpret_cast<uintptr_t>(address) - m.base + 4 > m.size)
    fail(HM_ERR_INVALID_ARGUMENT, "the word at %p overruns its allocation", address);
  return m;
}

template <typename V>
hm_status stream_write_value32(hm_stream stream, void* address, uint32_t value, uint32_t flags) {
  return guarded("stream_write_value32", [&] {
    auto& s = stream_of<typename V::Stream>(stream);
    if (flags != 0) fail(HM_ERR_INVALID_ARGUMENT, "flags must be 0, got 0x%x", flags);
    typename V::Scope scope(s.device);
    Memory m = memop_word<V>(address, device_state(V::state(), s.device));
    // In stream order after all prior work, whose writes are visible first (release).
    V::write_value32(s, address, m, value);
  });
}

template <typename V>
hm_status stream_wait_value32(hm_stream stream, const void* address, uint32_t value,
                              int32_t condition, uint32_t flags) {
  return guarded("stream_wait_value32", [&] {
    auto& s = stream_of<typename V::Stream>(stream);
    if (flags != 0) fail(HM_ERR_INVALID_ARGUMENT, "flags must be 0, got 0x%x", flags);
    if (condition < HM_WAIT_GEQ || condition > HM_WAIT_NOR)
      fail(HM_ERR_INVALID_ARGUMENT, "unknown wait condition %d", condition);
    typename V::Scope scope(s.device);
    auto& d = device_state(V::state(), s.device);
    Memory m = memop_word<V>(address, d);
    V::wait_value32(s, d, address, m, value, condition, V::kInfo.wait_flags[condition]);
  });
}

}  // namespace hm::kit::gpu
