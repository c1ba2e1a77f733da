// The rocm plugin's stream memory operations for the kit's GPU layer
// (hetmesh/plugin_kit/gpu_memops.hpp has the slots): hipStreamWriteValue32 and
// hipStreamWaitValue32, with HM_WAIT_GEQ through the kit's wait relay
// (hetmesh/plugin_kit/wait_relay.hpp says why).
#include "rocm_slots.hpp"
#include "rocm_wait_relay_hip.hpp"

#include <hetmesh/plugin_kit/wait_relay.hpp>

#include <memory>
#include <mutex>

namespace hm::rocm {

namespace {

using hm::kit::gpu::WaitRelay;

WaitRelay& relay_for(Stream& s) {
  State& st = state();
  std::lock_guard lock(st.relay_mutex);
  if (!st.relay) st.relay = std::make_unique<WaitRelay>(std::make_unique<HipRelayBackend>(st.hip));
  if (s.gate == nullptr) s.gate = st.relay->acquire_gate();
  return *st.relay;
}

}  // namespace

// HIP takes the address as the host sees it: it finds the allocation and the device's mapping.
void Vendor::write_value32(Stream& s, void* address, const Memory&, uint32_t value) {
  HM_HIP(hipStreamWriteValue32, s.stream, address, value, 0);
}

void Vendor::wait_value32(Stream& s, const DeviceState&, const void* address, const Memory& m,
                          uint32_t value, int32_t condition, unsigned flags) {
  if (condition == HM_WAIT_GEQ) {
    WaitRelay::Word word{static_cast<const uint32_t*>(address), m.device, m.host};
    relay_for(s).enqueue(s.stream, s.gate, word, value, HM_WAIT_GEQ);
    return;
  }
  HM_HIP(hipStreamWaitValue32, s.stream, const_cast<void*>(address), value, flags, 0xffffffffu);
}

}  // namespace hm::rocm
