// What a GPU plugin supplies to the kit's GPU layer (gpu_slots.hpp): a policy struct of static
// members, written once per runtime (plugins/cuda and plugins/rocm are complete examples),
//
//   struct Vendor : hm::kit::gpu::VendorBase<State, Stream, Event, Scope, IpcHandle> {
//     static constexpr hm::kit::gpu::VendorInfo kInfo = {...};
//     HM_KIT_GPU_VENDOR_CALLS
//   };
//
// and a definition of each call HM_KIT_GPU_VENDOR_CALLS declares, in the plugin's own files. The
// macro declares the calls once for every plugin, so the list cannot drift between them.
#pragma once

#include "gpu_address.hpp"
#include "gpu_state.hpp"

#include <hetmesh/device_plugin.h>

#include <cstdint>
#include <string>

namespace hm::kit::gpu {

struct VendorInfo {
  const char* name;        // the plugin's: IPC handle checks, memfd names, the log prefix
  const char* runtime;     // "CUDA", "HIP": messages
  const char* vendor;      // hm_device_properties.vendor
  int32_t dlpack;          // hm_device_properties.dlpack_device_type
  uint32_t ipc_magic;      // the first word of the plugin's IPC handles
  unsigned wait_flags[4];  // the runtime's stream wait flags, in HM_WAIT_* order
};

// The plugin's types: its State (derived from gpu::State), stream and event objects (gpu::Stream
// and gpu::Event, or derived), a Scope that makes a device current on the calling thread for one
// slot (constructed with the device index), and the runtime's IPC handle.
template <typename StateT, typename StreamT, typename EventT, typename ScopeT, typename IpcNativeT>
struct VendorBase {
  using State = StateT;
  using DeviceState = typename StateT::DeviceState;
  using Stream = StreamT;
  using NativeStream = decltype(StreamT::stream);
  using Event = EventT;
  using NativeEvent = typename decltype(EventT::events)::value_type;
  using Scope = ScopeT;
  using IpcNative = IpcNativeT;
  using Allocation = gpu::Allocation;
  using Memory = gpu::Memory;

  static State& state() { return gpu::state<State>(); }
};

}  // namespace hm::kit::gpu

// The vendor calls, declared in the plugin's Vendor struct. Each throws hm::kit::Failure (fail())
// on an error; stream_done, event_done and elapsed_ms answer false while the work is pending. The
// slots make the right device current (Scope) before each call, except where noted.
#define HM_KIT_GPU_VENDOR_CALLS                                                                   \
  /* initialize: "" or why the runtime is unusable; find the devices; e.g. "HIP 6.2" */           \
  static std::string load(State& s);                                                              \
  static void discover(State& s);                                                                 \
  static std::string runtime_text(const State& s);                                                \
  /* streams */                                                                                   \
  static void create_stream(NativeStream* out, bool non_blocking);                                \
  static void destroy_stream(Stream& s);                                                          \
  static void synchronize_stream(NativeStream stream);                                            \
  static bool stream_done(NativeStream stream);                                                   \
  static void launch_host_func(Stream& s, hm_host_fn fn, void* user_data);                        \
  /* events: event_flags gives the runtime's flags for an event with or without timing */         \
  static unsigned event_flags(bool timing);                                                       \
  static void create_event(NativeEvent* out, unsigned flags);                                     \
  static void destroy_event(NativeEvent event);                                                   \
  static void record_event(NativeEvent event, NativeStream stream);                               \
  static bool event_done(NativeEvent event);                                                      \
  static void synchronize_event(NativeEvent event);                                               \
  static void wait_event(NativeStream stream, NativeEvent event);                                 \
  static bool elapsed_ms(float* milliseconds, NativeEvent start, NativeEvent end);                \
  /* stream memops, on a checked word; `flags` is kInfo.wait_flags[condition] */                  \
  static void write_value32(Stream& s, void* address, const Memory& m, uint32_t value);           \
  static void wait_value32(Stream& s, const DeviceState& d, const void* address, const Memory& m, \
                           uint32_t value, int32_t condition, unsigned flags);                    \
  /* memory: alloc_pinned and register_host make their device current themselves;                 \
     register_host answers the device's address of the range, or 0 */                             \
  static void* alloc_device(uint64_t size, Allocation* a);                                        \
  static void free_device(void* ptr);                                                             \
  static void* alloc_pinned(int32_t device, uint64_t size, Allocation* a);                        \
  static void free_pinned(void* ptr, const Allocation& a);                                        \
  static uint64_t register_host(int32_t device, void* ptr, uint64_t size);                        \
  static void unregister_host(void* ptr);                                                         \
  static Memory classify_foreign(const void* ptr);                                                \
  static void copy_async(void* dst, const void* src, uint64_t size, NativeStream stream);         \
  static void fill_async(void* dst, uint8_t value, uint64_t size, NativeStream stream);           \
  /* IPC of device memory */                                                                      \
  static void ipc_get(IpcNative* handle, void* base);                                             \
  static void* ipc_open(const IpcNative& handle, Allocation* a);                                  \
  static void ipc_close(void* ptr);
