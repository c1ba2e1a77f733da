// The objects behind a GPU plugin's hm_stream and hm_event, and the checks that turn a handle back
// into one. `Native` is the runtime's stream or event type (CUstream, hipEvent_t, ...).
#pragma once

#include "gpu_state.hpp"
#include "status.hpp"

#include <hetmesh/device_plugin.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <vector>

namespace hm::kit::gpu {

template <typename Native>
struct Stream {
  static constexpr uint32_t kMagic = 0x4d525453;  // "STRM"
  uint32_t magic = kMagic;
  int32_t device = 0;
  Native stream = nullptr;
  bool borrowed = false;  // the application's stream (stream_borrow): never destroyed here
};

// A GPU event belongs to one device (a CUDA context, a HIP device), while an hm_event may be
// recorded on a stream of any device of the plugin: it holds one native event per device it was
// recorded on, created on first use there; events[device] exists from event_create.
template <typename Native>
struct Event {
  static constexpr uint32_t kMagic = 0x544e5645;  // "EVNT"
  uint32_t magic = kMagic;
  int32_t device = 0;
  unsigned flags = 0;  // the runtime's event flags
  bool timing = true;
  std::mutex mutex;  // guards creating events[d] for d != device
  std::vector<Native> events;
  std::atomic<int32_t> recorded_on{-1};  // device of the latest record, -1 if never recorded
};

// The object behind `handle`; HM_ERR_INVALID_HANDLE for NULL or a handle this plugin did not make.
template <typename T>
T& handle_of(void* handle, const char* article, const char* what) {
  if (handle == nullptr) fail(HM_ERR_INVALID_HANDLE, "%s is NULL", what);
  auto* object = static_cast<T*>(handle);
  if (object->magic != T::kMagic)
    fail(HM_ERR_INVALID_HANDLE, "%p is not %s %s of this plugin", handle, article, what);
  return *object;
}

// The checks of stream_create and event_create: the device exists, `out` is not NULL and `flags`
// has no bit but those of `known`.
template <typename State>
void check_create(State& s, int32_t device, const void* out, uint32_t flags, uint32_t known,
                  const char* what) {
  device_state(s, device);
  if (out == nullptr) fail(HM_ERR_INVALID_ARGUMENT, "%s output is NULL", what);
  if ((flags & ~known) != 0) fail(HM_ERR_INVALID_ARGUMENT, "unknown %s flags 0x%x", what, flags);
}

template <typename S>
S& stream_of(hm_stream handle) {
  return handle_of<S>(handle, "a", "stream");
}

template <typename E>
E& event_of(hm_event handle) {
  return handle_of<E>(handle, "an", "event");
}

}  // namespace hm::kit::gpu
