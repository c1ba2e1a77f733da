// The plugin's stream and event handles (the kit's, hetmesh/plugin_kit/gpu_handles.hpp), and host
// functions run in stream order.
#pragma once

#include "rocm_state.hpp"

#include <hetmesh/plugin_kit/gpu_handles.hpp>

#include <cstdint>

namespace hm::rocm {

struct Stream : hm::kit::gpu::Stream<hipStream_t> {
  uint64_t* gate = nullptr;  // the HM_WAIT_GEQ relay's gate word, on the first such wait
};

// A HIP event records only on streams of its own device: an hm_event holds one hipEvent_t per
// device it was recorded on.
using Event = hm::kit::gpu::Event<hipEvent_t>;

inline Stream& stream_of(hm_stream handle) {
  return hm::kit::gpu::stream_of<Stream>(handle);
}

// Runs fn(user_data) on a runtime thread once prior work on the stream completes; later work waits
// for it to return. The caller has made the stream's device current.
void launch_host_function(const Stream& stream, hm_host_fn fn, void* user_data);

}  // namespace hm::rocm
