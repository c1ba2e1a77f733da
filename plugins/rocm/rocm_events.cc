// The rocm plugin's event calls for the kit's GPU layer (hetmesh/plugin_kit/gpu_events.hpp has the
// slots): recording, waiting, cross-stream ordering and timing, each with its device current.
#include "rocm_slots.hpp"

namespace hm::rocm {

unsigned Vendor::event_flags(bool timing) {
  return timing ? hipEventDefault : hipEventDisableTiming;
}

void Vendor::create_event(hipEvent_t* out, unsigned flags) {
  HM_HIP(hipEventCreateWithFlags, out, flags);
}

void Vendor::destroy_event(hipEvent_t event) {
  HM_HIP(hipEventDestroy, event);
}

void Vendor::record_event(hipEvent_t event, hipStream_t stream) {
  HM_HIP(hipEventRecord, event, stream);
}

bool Vendor::event_done(hipEvent_t event) {
  return ready(hip().hipEventQuery(event), "hipEventQuery");
}

void Vendor::synchronize_event(hipEvent_t event) {
  HM_HIP(hipEventSynchronize, event);
}

// HIP orders streams across devices: the event may live on another device.
void Vendor::wait_event(hipStream_t stream, hipEvent_t event) {
  HM_HIP(hipStreamWaitEvent, stream, event, 0);
}

bool Vendor::elapsed_ms(float* milliseconds, hipEvent_t start, hipEvent_t end) {
  return ready(hip().hipEventElapsedTime(milliseconds, start, end), "hipEventElapsedTime");
}

}  // namespace hm::rocm
