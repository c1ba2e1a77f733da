// Stream memory operations: hipStreamWriteValue32 and hipStreamWaitValue32, with HM_WAIT_GEQ
// through the cyclic-wait relay (cyclic_wait.hpp says why).
#include "cyclic_wait.hpp"
#include "hip_relay_backend.hpp"
#include "rocm_memory.hpp"
#include "rocm_streams.hpp"
#include "slots.hpp"

namespace hm::rocm {

using hm::kit::fail;
using hm::kit::guarded;

namespace {

// Checks a 32-bit word in device, pinned or registered memory of this plugin. HIP takes the
// address as the host sees it: it finds the allocation and the device's mapping itself.
Memory memop_word(const void* address, const DeviceState& stream_device) {
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
  if (reinterpret_cast<uintptr_t>(address) - m.base + 4 > m.size)
    fail(HM_ERR_INVALID_ARGUMENT, "the word at %p overruns its allocation", address);
  return m;
}

CyclicWaitRelay& relay_for(Stream& s) {
  State& st = state();
  std::lock_guard lock(st.relay_mutex);
  if (!st.relay)
    st.relay = std::make_unique<CyclicWaitRelay>(std::make_unique<HipRelayBackend>(st.hip));
  if (s.gate == nullptr) s.gate = st.relay->acquire_gate();
  return *st.relay;
}

}  // namespace

hm_status stream_write_value32(hm_stream stream, void* address, uint32_t value, uint32_t flags) {
  return guarded("stream_write_value32", [&] {
    Stream& s = stream_of(stream);
    if (flags != 0) fail(HM_ERR_INVALID_ARGUMENT, "flags must be 0, got 0x%x", flags);
    DeviceScope scope(s.device);
    memop_word(address, device_state(s.device));
    // In stream order after all prior work, whose writes are visible first (release).
    HM_HIP(hipStreamWriteValue32, s.stream, address, value, 0);
  });
}

hm_status stream_wait_value32(hm_stream stream, const void* address, uint32_t value,
                              int32_t condition, uint32_t flags) {
  return guarded("stream_wait_value32", [&] {
    Stream& s = stream_of(stream);
    if (flags != 0) fail(HM_ERR_INVALID_ARGUMENT, "flags must be 0, got 0x%x", flags);
    unsigned hip_flags;
    switch (condition) {
      case HM_WAIT_GEQ:  // cyclic: the relay, below
        hip_flags = hipStreamWaitValueGte;
        break;
      case HM_WAIT_EQ:
        hip_flags = hipStreamWaitValueEq;
        break;
      case HM_WAIT_AND:
        hip_flags = hipStreamWaitValueAnd;
        break;
      case HM_WAIT_NOR:
        hip_flags = hipStreamWaitValueNor;
        break;
      default:
        fail(HM_ERR_INVALID_ARGUMENT, "unknown wait condition %d", condition);
    }
    DeviceScope scope(s.device);
    Memory m = memop_word(address, device_state(s.device));
    if (condition == HM_WAIT_GEQ) {
      CyclicWaitRelay::Word word{static_cast<const uint32_t*>(address), m.device, m.host};
      relay_for(s).enqueue(s.stream, s.gate, word, value);
      return;
    }
    // EQ, AND and NOR with a full mask are exactly the ABI's conditions.
    HM_HIP(hipStreamWaitValue32, s.stream, const_cast<void*>(address), value, hip_flags,
           0xffffffffu);
  });
}

}  // namespace hm::rocm
