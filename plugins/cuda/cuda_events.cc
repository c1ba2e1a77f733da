// The cuda plugin's event calls for the kit's GPU layer (hetmesh/plugin_kit/gpu_events.hpp has the
// slots). A CUDA event belongs to one context, so an hm_event holds one CUevent per device it was
// recorded on; each call runs with that device's context current.
#include "cuda_slots.hpp"
#include "cuda_state.hpp"

namespace hm::cuda {

unsigned Vendor::event_flags(bool timing) {
  return timing ? CU_EVENT_DEFAULT : CU_EVENT_DISABLE_TIMING;
}

void Vendor::create_event(CUevent* out, unsigned flags) {
  HM_CU(cuEventCreate, out, flags);
}

void Vendor::destroy_event(CUevent event) {
  HM_CU(cuEventDestroy, event);
}

void Vendor::record_event(CUevent event, CUstream stream) {
  HM_CU(cuEventRecord, event, stream);
}

bool Vendor::event_done(CUevent event) {
  return ready(drv().cuEventQuery(event), "cuEventQuery");
}

void Vendor::synchronize_event(CUevent event) {
  HM_CU(cuEventSynchronize, event);
}

// CUDA orders streams across contexts: the event may live on another device.
void Vendor::wait_event(CUstream stream, CUevent event) {
  HM_CU(cuStreamWaitEvent, stream, event, 0);
}

bool Vendor::elapsed_ms(float* milliseconds, CUevent start, CUevent end) {
  return ready(drv().cuEventElapsedTime(milliseconds, start, end), "cuEventElapsedTime");
}

}  // namespace hm::cuda
