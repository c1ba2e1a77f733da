// The extensions the driver lists, and Intel's experimental memory-sync functions
// (ZE_intel_experimental_command_list_memory_sync), reached through
// zeDriverGetExtensionFunctionAddress. Signatures and values: plugins/level_zero/ze_memory_sync.h.
//
// Behaviour taken from compute-runtime (level_zero/core/source/cmdlist/cmdlist_hw.inl):
// - WriteToMemory always writes 8 bytes, whatever the value: it is a post-sync "write immediate
//   data" (PIPE_CONTROL, or MI_FLUSH_DW on a copy engine), a QWord write, sized sizeof(uint64_t).
// - WaitOnMemory compares the 32-bit word at ptr, WaitOnMemory64 the 64-bit one, as `*ptr OP data`
//   (MI_SEMAPHORE_WAIT's "semaphore address data OP semaphore data"), unsigned; an action flag
//   that is not exactly one of the six conditions is INVALID_ARGUMENT; a null list is
//   INVALID_ARGUMENT.
// Set HETMESH_ZE_HOST_NO_MEMORY_SYNC=1 and the driver neither lists the extension nor hands out
// the functions (read on each query).
#include <cstdlib>
#include <cstring>
#include <thread>

#include "state.h"
#include "ze_memory_sync.h"

namespace hetmesh_ze {
namespace {

constexpr const char* kPciExtension = "ZE_extension_pci_properties";
constexpr const char* kMemorySyncExtension = HETMESH_ZE_MEMORY_SYNC_EXTENSION;

enum : uint32_t {
  kWaitEqual = ZEX_WAIT_ON_MEMORY_FLAG_EQUAL,
  kWaitNotEqual = ZEX_WAIT_ON_MEMORY_FLAG_NOT_EQUAL,
  kWaitGreater = ZEX_WAIT_ON_MEMORY_FLAG_GREATER_THAN,
  kWaitGreaterEqual = ZEX_WAIT_ON_MEMORY_FLAG_GREATER_THAN_EQUAL,
  kWaitLess = ZEX_WAIT_ON_MEMORY_FLAG_LESSER_THAN,
  kWaitLessEqual = ZEX_WAIT_ON_MEMORY_FLAG_LESSER_THAN_EQUAL,
};

bool memory_sync_offered() {
  const char* off = std::getenv("HETMESH_ZE_HOST_NO_MEMORY_SYNC");
  return off == nullptr || std::strcmp(off, "1") != 0;
}

template <class T>
bool holds(uint32_t condition, T value, T data) {
  switch (condition) {
    case kWaitEqual:
      return value == data;
    case kWaitNotEqual:
      return value != data;
    case kWaitGreater:
      return value > data;
    case kWaitGreaterEqual:
      return value >= data;
    case kWaitLess:
      return value < data;
    case kWaitLessEqual:
      return value <= data;
    default:
      return false;
  }
}

bool valid_condition(uint32_t condition) {
  switch (condition) {
    case kWaitEqual:
    case kWaitNotEqual:
    case kWaitGreater:
    case kWaitGreaterEqual:
    case kWaitLess:
    case kWaitLessEqual:
      return true;
    default:
      return false;
  }
}

// Polls the word until the condition holds: a few yields, then short sleeps (no core is burnt
// while waiting for a host thread or a peer). Gives up when the list is being abandoned.
template <class T>
bool poll(std::byte* word, uint32_t condition, T data, const std::atomic<bool>& stop) {
  std::atomic_ref<T> ref(*reinterpret_cast<T*>(word));
  for (uint32_t spins = 0;; ++spins) {
    if (holds(condition, ref.load(std::memory_order_acquire), data)) return true;
    if (stop.load()) return false;
    if (spins < 64) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(spins < 1024 ? 10 : 100));
    }
  }
}

template <class T>
ze_result_t wait_on_memory(zex_command_list_handle_t list, zex_wait_on_mem_desc_t* desc, void* ptr,
                           T data, zex_event_handle_t signal) {
  return guarded([&] {
    if (list == nullptr) return ZE_RESULT_ERROR_INVALID_ARGUMENT;  // as compute-runtime
    std::shared_ptr<CommandList> target;
    if (auto r = check_list(list, target); r != ZE_RESULT_SUCCESS) return r;
    if (desc == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    const uint32_t condition = desc->actionFlag;
    if (!valid_condition(condition)) return ZE_RESULT_ERROR_INVALID_ARGUMENT;
    Span span;
    if (auto r = resolve(ptr, sizeof(T), span); r != ZE_RESULT_SUCCESS) return r;
    if (reinterpret_cast<uintptr_t>(ptr) % sizeof(T) != 0) return ZE_RESULT_ERROR_INVALID_ARGUMENT;
    Command command;
    if (signal != nullptr) {
      command.signal = events().get(signal);
      if (!command.signal) return ZE_RESULT_ERROR_INVALID_ARGUMENT;
    }
    command.op = [span, condition, data](const std::atomic<bool>& stop) {
      return poll<T>(span.rw, condition, data, stop);
    };
    return target->submit(std::move(command));
  });
}

ze_result_t ZE_APICALL WaitOnMemory(zex_command_list_handle_t list, zex_wait_on_mem_desc_t* desc,
                                    void* ptr, uint32_t data, zex_event_handle_t signal) {
  return wait_on_memory<uint32_t>(list, desc, ptr, data, signal);
}

ze_result_t ZE_APICALL WaitOnMemory64(zex_command_list_handle_t list, zex_wait_on_mem_desc_t* desc,
                                      void* ptr, uint64_t data, zex_event_handle_t signal) {
  return wait_on_memory<uint64_t>(list, desc, ptr, data, signal);
}

ze_result_t ZE_APICALL WriteToMemory(zex_command_list_handle_t list, zex_write_to_mem_desc_t* desc,
                                     void* ptr, uint64_t data) {
  return guarded([&] {
    if (list == nullptr) return ZE_RESULT_ERROR_INVALID_ARGUMENT;  // as compute-runtime
    std::shared_ptr<CommandList> target;
    if (auto r = check_list(list, target); r != ZE_RESULT_SUCCESS) return r;
    if (desc == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    // Always 8 bytes, 8-aligned (the hardware's QWord write ignores the low address bits; here a
    // misaligned address is refused instead of silently written elsewhere).
    Span span;
    if (auto r = resolve(ptr, sizeof(uint64_t), span); r != ZE_RESULT_SUCCESS) return r;
    if (reinterpret_cast<uintptr_t>(ptr) % sizeof(uint64_t) != 0) {
      return ZE_RESULT_ERROR_INVALID_ARGUMENT;
    }
    Command command;
    command.op = [span, data](const std::atomic<bool>&) {
      std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(span.rw))
          .store(data, std::memory_order_release);
      return true;
    };
    return target->submit(std::move(command));
  });
}

}  // namespace

ze_result_t ZE_APICALL DriverGetExtensionProperties(ze_driver_handle_t driver, uint32_t* count,
                                                    ze_driver_extension_properties_t* properties) {
  return guarded([&] {
    if (driver == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
    if (!is_driver(driver)) return ZE_RESULT_ERROR_INVALID_ARGUMENT;
    if (count == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    struct Listed {
      const char* name;
      uint32_t version;
    };
    Listed listed[2] = {{kPciExtension, ZE_PCI_PROPERTIES_EXT_VERSION_1_0}, {nullptr, 0}};
    uint32_t total = 1;
    if (memory_sync_offered()) listed[total++] = {kMemorySyncExtension, ZE_MAKE_VERSION(1, 0)};
    if (*count == 0 || properties == nullptr) {
      *count = total;
      return ZE_RESULT_SUCCESS;
    }
    const uint32_t n = *count < total ? *count : total;
    for (uint32_t i = 0; i < n; ++i) {
      std::memset(properties[i].name, 0, sizeof(properties[i].name));
      std::strncpy(properties[i].name, listed[i].name, sizeof(properties[i].name) - 1);
      properties[i].version = listed[i].version;
    }
    *count = n;
    return ZE_RESULT_SUCCESS;
  });
}

ze_result_t ZE_APICALL DriverGetExtensionFunctionAddress(ze_driver_handle_t driver,
                                                         const char* name, void** function) {
  return guarded([&] {
    if (driver == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
    if (!is_driver(driver)) return ZE_RESULT_ERROR_INVALID_ARGUMENT;
    if (name == nullptr || function == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    *function = nullptr;
    if (!memory_sync_offered()) return ZE_RESULT_ERROR_INVALID_ARGUMENT;
    if (std::strcmp(name, "zexCommandListAppendWaitOnMemory") == 0) {
      *function = reinterpret_cast<void*>(&WaitOnMemory);
    } else if (std::strcmp(name, "zexCommandListAppendWaitOnMemory64") == 0) {
      *function = reinterpret_cast<void*>(&WaitOnMemory64);
    } else if (std::strcmp(name, "zexCommandListAppendWriteToMemory") == 0) {
      *function = reinterpret_cast<void*>(&WriteToMemory);
    } else {
      return ZE_RESULT_ERROR_INVALID_ARGUMENT;
    }
    return ZE_RESULT_SUCCESS;
  });
}

}  // namespace hetmesh_ze
