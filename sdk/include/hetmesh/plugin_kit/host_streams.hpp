// Streams, events, host callbacks and stream memory operations run by host threads.
//
// For devices without hardware queues (the cpu plugin), simulators (asic_stub) and new plugins
// starting from sdk/template. install_host_streams() fills the stream, event and memop slots of a
// plugin table; the plugin supplies two hooks: how many devices exist, and how to turn a device
// address into one the host can touch. Plugins with real queues (CUDA, HIP) do not use this.
#pragma once

#include "host_event.hpp"
#include "status.hpp"
#include "stream_worker.hpp"

#include <atomic>
#include <memory>
#include <thread>

namespace hm::kit {

struct HostStreamHooks {
  int32_t (*device_count)();
  // Host-accessible address for [address, address+size) of this plugin's memory; fails (throws
  // Failure) if the range is not inside one allocation of this plugin.
  void* (*host_view)(const void* address, uint64_t size);
};

struct HostStream {
  int32_t device;
  StreamWorker worker;
};

// Streams hold the event's state by shared_ptr, so destroying an event with a record or wait
// still queued is safe (as in CUDA).
struct HostEventObject {
  int32_t device;
  std::shared_ptr<HostEvent> event;
};

inline HostStreamHooks& host_stream_hooks() {
  static HostStreamHooks hooks{};
  return hooks;
}

inline void check_device(int32_t device) {
  int32_t count = host_stream_hooks().device_count();
  if (device < 0 || device >= count)
    fail(HM_ERR_INVALID_ARGUMENT, "device %d does not exist (%d devices)", device, count);
}

inline HostStream* host_stream(hm_stream stream) {
  if (stream == nullptr) fail(HM_ERR_INVALID_HANDLE, "stream is NULL");
  return reinterpret_cast<HostStream*>(stream);
}

inline HostEventObject* host_event(hm_event event) {
  if (event == nullptr) fail(HM_ERR_INVALID_HANDLE, "event is NULL");
  return reinterpret_cast<HostEventObject*>(event);
}

// Sleeps in growing steps while `done` is false: cheap for short waits, idle for long ones.
template <typename Done>
bool poll_until(Done done, const StreamWorker& worker) {
  for (unsigned spins = 0; !done(); ++spins) {
    if (worker.cancelled()) return false;
    if (spins < 64) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(spins < 1024 ? 5 : 100));
    }
  }
  return true;
}

namespace host_streams_detail {

inline hm_status stream_create(int32_t device, uint32_t flags, hm_stream* out) {
  return guarded("stream_create", [&] {
    check_device(device);
    if (out == nullptr) fail(HM_ERR_INVALID_ARGUMENT, "stream output is NULL");
    if ((flags & ~HM_STREAM_NON_BLOCKING) != 0)
      fail(HM_ERR_INVALID_ARGUMENT, "unknown stream flags 0x%x", flags);
    *out = reinterpret_cast<hm_stream>(new HostStream{device, {}});
  });
}

inline hm_status stream_destroy(hm_stream stream) {
  return guarded("stream_destroy", [&] { delete host_stream(stream); });
}

inline hm_status stream_synchronize(hm_stream stream, uint64_t timeout_ns) {
  return guarded("stream_synchronize", [&] {
    if (!host_stream(stream)->worker.wait_idle(to_timeout(timeout_ns)))
      fail(HM_ERR_TIMEOUT, "stream work still pending after %llu ns",
           static_cast<unsigned long long>(timeout_ns));
  });
}

inline hm_status stream_query(hm_stream stream) {
  hm_status status = HM_OK;
  hm_status call = guarded("stream_query", [&] {
    if (!host_stream(stream)->worker.idle()) status = HM_ERR_NOT_READY;
  });
  return call != HM_OK ? call : status;
}

inline hm_status event_create(int32_t device, uint32_t flags, hm_event* out) {
  return guarded("event_create", [&] {
    check_device(device);
    if (out == nullptr) fail(HM_ERR_INVALID_ARGUMENT, "event output is NULL");
    if ((flags & ~HM_EVENT_DISABLE_TIMING) != 0)
      fail(HM_ERR_INVALID_ARGUMENT, "unknown event flags 0x%x", flags);
    bool timing = (flags & HM_EVENT_DISABLE_TIMING) == 0;
    auto* object = new HostEventObject{device, std::make_shared<HostEvent>(timing)};
    *out = reinterpret_cast<hm_event>(object);
  });
}

inline hm_status event_destroy(hm_event event) {
  return guarded("event_destroy", [&] { delete host_event(event); });
}

inline hm_status event_record(hm_event event, hm_stream stream) {
  return guarded("event_record", [&] {
    std::shared_ptr<HostEvent> e = host_event(event)->event;
    HostStream* s = host_stream(stream);
    uint64_t generation = e->record();
    s->worker.submit([e, generation] { e->complete(generation); });
  });
}

inline hm_status event_query(hm_event event) {
  hm_status status = HM_OK;
  hm_status call = guarded("event_query", [&] {
    if (!host_event(event)->event->is_complete()) status = HM_ERR_NOT_READY;
  });
  return call != HM_OK ? call : status;
}

inline hm_status event_synchronize(hm_event event, uint64_t timeout_ns) {
  return guarded("event_synchronize", [&] {
    if (!host_event(event)->event->wait_current(to_timeout(timeout_ns)))
      fail(HM_ERR_TIMEOUT, "event not complete after %llu ns",
           static_cast<unsigned long long>(timeout_ns));
  });
}

inline hm_status stream_wait_event(hm_stream stream, hm_event event) {
  return guarded("stream_wait_event", [&] {
    HostStream* s = host_stream(stream);
    std::shared_ptr<HostEvent> e = host_event(event)->event;
    uint64_t generation = e->current_capture();
    StreamWorker* worker = &s->worker;
    s->worker.submit([e, generation, worker] {
      while (!e->wait(generation, std::chrono::milliseconds(10)) && !worker->cancelled()) {
      }
    });
  });
}

inline hm_status stream_add_callback(hm_stream stream, hm_host_fn fn, void* user_data) {
  return guarded("stream_add_callback", [&] {
    if (fn == nullptr) fail(HM_ERR_INVALID_ARGUMENT, "callback is NULL");
    host_stream(stream)->worker.submit([fn, user_data] { fn(user_data); });
  });
}

inline hm_status event_elapsed_ms(hm_event start, hm_event end, float* milliseconds) {
  hm_status status = HM_OK;
  hm_status call = guarded("event_elapsed_ms", [&] {
    if (milliseconds == nullptr) fail(HM_ERR_INVALID_ARGUMENT, "milliseconds is NULL");
    HostEvent& a = *host_event(start)->event;
    HostEvent& b = *host_event(end)->event;
    if (!a.timing() || !b.timing())
      fail(HM_ERR_INVALID_ARGUMENT, "an event was created with HM_EVENT_DISABLE_TIMING");
    HostEvent::Clock::time_point ta, tb;
    if (!a.completion_time(&ta) || !b.completion_time(&tb)) {
      status = HM_ERR_NOT_READY;
      return;
    }
    *milliseconds = std::chrono::duration<float, std::milli>(tb - ta).count();
  });
  return call != HM_OK ? call : status;
}

inline std::atomic_ref<uint32_t> word_at(const void* address) {
  if (reinterpret_cast<uintptr_t>(address) % 4 != 0)
    fail(HM_ERR_INVALID_ARGUMENT, "address %p is not 4-byte aligned", address);
  auto* word = static_cast<uint32_t*>(host_stream_hooks().host_view(address, 4));
  return std::atomic_ref<uint32_t>(*word);
}

inline hm_status stream_write_value32(hm_stream stream, void* address, uint32_t value,
                                      uint32_t flags) {
  return guarded("stream_write_value32", [&] {
    HostStream* s = host_stream(stream);
    if (flags != 0) fail(HM_ERR_INVALID_ARGUMENT, "flags must be 0, got 0x%x", flags);
    auto word = word_at(address);
    s->worker.submit([word, value]() mutable { word.store(value, std::memory_order_release); });
  });
}

inline hm_status stream_wait_value32(hm_stream stream, const void* address, uint32_t value,
                                     int32_t condition, uint32_t flags) {
  return guarded("stream_wait_value32", [&] {
    HostStream* s = host_stream(stream);
    if (flags != 0) fail(HM_ERR_INVALID_ARGUMENT, "flags must be 0, got 0x%x", flags);
    if (condition < HM_WAIT_GEQ || condition > HM_WAIT_NOR)
      fail(HM_ERR_INVALID_ARGUMENT, "unknown wait condition %d", condition);
    auto word = word_at(address);
    StreamWorker* worker = &s->worker;
    s->worker.submit([word, value, condition, worker] {
      poll_until(
          [&] {
            return wait_condition_met(word.load(std::memory_order_acquire), value, condition);
          },
          *worker);
    });
  });
}

}  // namespace host_streams_detail

// Fills every stream, event, callback and stream-memop slot of `api`.
inline void install_host_streams(hm_device_plugin_api* api, HostStreamHooks hooks) {
  namespace d = host_streams_detail;
  host_stream_hooks() = hooks;
  api->stream_create = d::stream_create;
  api->stream_destroy = d::stream_destroy;
  api->stream_synchronize = d::stream_synchronize;
  api->stream_query = d::stream_query;
  api->event_create = d::event_create;
  api->event_destroy = d::event_destroy;
  api->event_record = d::event_record;
  api->event_query = d::event_query;
  api->event_synchronize = d::event_synchronize;
  api->stream_wait_event = d::stream_wait_event;
  api->stream_add_callback = d::stream_add_callback;
  api->event_elapsed_ms = d::event_elapsed_ms;
  api->stream_write_value32 = d::stream_write_value32;
  api->stream_wait_value32 = d::stream_wait_value32;
}

// Capability bits that install_host_streams() makes true.
constexpr hm_capabilities kHostStreamCapabilities =
    HM_CAP_STREAM_MEMOPS | HM_CAP_HOST_CALLBACK | HM_CAP_EVENT_TIMING;

}  // namespace hm::kit
