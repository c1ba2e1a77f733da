// zeInit, the driver, its devices (HETMESH_ZE_HOST_DEVICES of them, default 2) and contexts.
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "state.h"

namespace hetmesh_ze {
namespace {

constexpr uint32_t kDefaultDevices = 2;
constexpr uint32_t kMaxDevices = 64;

struct Driver {
  std::once_flag once;
  ze_result_t init_result = ZE_RESULT_ERROR_UNINITIALIZED;
  std::atomic<bool> initialized{false};
  std::vector<std::unique_ptr<Device>> devices;
};

// Never destroyed: worker threads of lists nobody destroyed may outlive static destructors.
Driver& driver() {
  static Driver* d = new Driver;
  return *d;
}

// HETMESH_ZE_HOST_DEVICES: a decimal count 0..64. Anything else refuses zeInit, loudly, rather
// than guessing.
ze_result_t read_device_count(uint32_t& count) {
  const char* text = std::getenv("HETMESH_ZE_HOST_DEVICES");
  if (text == nullptr || *text == '\0') {
    count = kDefaultDevices;
    return ZE_RESULT_SUCCESS;
  }
  char* end = nullptr;
  errno = 0;
  unsigned long value = std::strtoul(text, &end, 10);
  if (errno != 0 || *end != '\0' || text[0] == '-' || value > kMaxDevices) {
    std::fprintf(stderr,
                 "libze_hetmesh_host: HETMESH_ZE_HOST_DEVICES=\"%s\" is not a count 0..%u; "
                 "zeInit refused\n",
                 text, kMaxDevices);
    return ZE_RESULT_ERROR_INVALID_ARGUMENT;
  }
  count = static_cast<uint32_t>(value);
  return ZE_RESULT_SUCCESS;
}

void copy_name(char* dst, size_t capacity, const std::string& name) {
  std::snprintf(dst, capacity, "%s", name.c_str());
}

ze_result_t initialized_driver(ze_driver_handle_t handle) {
  if (handle == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  if (!driver().initialized.load()) return ZE_RESULT_ERROR_UNINITIALIZED;
  return is_driver(handle) ? ZE_RESULT_SUCCESS : ZE_RESULT_ERROR_INVALID_ARGUMENT;
}

}  // namespace

uint64_t now_ns() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

ze_driver_handle_t driver_handle() {
  return driver().initialized.load() ? reinterpret_cast<ze_driver_handle_t>(&driver()) : nullptr;
}

bool is_driver(ze_driver_handle_t handle) {
  return handle != nullptr && handle == driver_handle();
}

Device* to_device(ze_device_handle_t handle) {
  if (handle == nullptr || !driver().initialized.load()) return nullptr;
  for (auto& device : driver().devices) {
    if (reinterpret_cast<ze_device_handle_t>(device.get()) == handle) return device.get();
  }
  return nullptr;
}

ze_result_t check_device(ze_device_handle_t handle, Device*& out) {
  if (handle == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
  out = to_device(handle);
  return out != nullptr ? ZE_RESULT_SUCCESS : ZE_RESULT_ERROR_INVALID_ARGUMENT;
}

Registry<Context>& contexts() {
  static auto* registry = new Registry<Context>;
  return *registry;
}

ze_result_t check_context(ze_context_handle_t handle) {
  std::shared_ptr<Context> context;
  return lookup(contexts(), handle, context);
}

ze_result_t ZE_APICALL Init(ze_init_flags_t flags) {
  return guarded([&] {
    // Only GPUs here: a request for VPUs alone finds none.
    if (flags != 0 && (flags & ZE_INIT_FLAG_GPU_ONLY) == 0) return ZE_RESULT_ERROR_UNINITIALIZED;
    Driver& d = driver();
    std::call_once(d.once, [&d] {
      uint32_t count = 0;
      d.init_result = read_device_count(count);
      if (d.init_result != ZE_RESULT_SUCCESS) return;
      for (uint32_t i = 0; i < count; ++i) {
        auto device = std::make_unique<Device>();
        device->index = i;
        device->name = "hetmesh Level Zero host stand-in " + std::to_string(i);
        d.devices.push_back(std::move(device));
      }
      d.initialized.store(true);
    });
    return d.init_result;
  });
}

ze_result_t ZE_APICALL DriverGet(uint32_t* count, ze_driver_handle_t* drivers) {
  return guarded([&] {
    if (count == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    if (!driver().initialized.load()) return ZE_RESULT_ERROR_UNINITIALIZED;
    if (*count == 0 || drivers == nullptr) {
      *count = 1;
      return ZE_RESULT_SUCCESS;
    }
    drivers[0] = driver_handle();
    *count = 1;
    return ZE_RESULT_SUCCESS;
  });
}

ze_result_t ZE_APICALL DriverGetApiVersion(ze_driver_handle_t handle, ze_api_version_t* version) {
  return guarded([&] {
    if (auto r = initialized_driver(handle); r != ZE_RESULT_SUCCESS) return r;
    if (version == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    *version = ZE_API_VERSION_1_4;
    return ZE_RESULT_SUCCESS;
  });
}

ze_result_t ZE_APICALL DriverGetProperties(ze_driver_handle_t handle,
                                           ze_driver_properties_t* properties) {
  return guarded([&] {
    if (auto r = initialized_driver(handle); r != ZE_RESULT_SUCCESS) return r;
    if (properties == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    std::memset(properties->uuid.id, 0, sizeof(properties->uuid.id));
    std::memcpy(properties->uuid.id, "hetmesh-ze-host", 15);
    properties->driverVersion = ZE_MAKE_VERSION(0, 1);
    return ZE_RESULT_SUCCESS;
  });
}

ze_result_t ZE_APICALL DriverGetIpcProperties(ze_driver_handle_t handle,
                                              ze_driver_ipc_properties_t* properties) {
  return guarded([&] {
    if (auto r = initialized_driver(handle); r != ZE_RESULT_SUCCESS) return r;
    if (properties == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    properties->flags = ZE_IPC_PROPERTY_FLAG_MEMORY;  // memory only; no IPC event pools
    return ZE_RESULT_SUCCESS;
  });
}

ze_result_t ZE_APICALL DeviceGet(ze_driver_handle_t handle, uint32_t* count,
                                 ze_device_handle_t* devices) {
  return guarded([&] {
    if (auto r = initialized_driver(handle); r != ZE_RESULT_SUCCESS) return r;
    if (count == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    auto& all = driver().devices;
    const auto total = static_cast<uint32_t>(all.size());
    if (*count == 0 || devices == nullptr) {
      *count = total;
      return ZE_RESULT_SUCCESS;
    }
    const uint32_t n = *count < total ? *count : total;
    for (uint32_t i = 0; i < n; ++i)
      devices[i] = reinterpret_cast<ze_device_handle_t>(all[i].get());
    *count = n;
    return ZE_RESULT_SUCCESS;
  });
}

ze_result_t ZE_APICALL DeviceGetSubDevices(ze_device_handle_t handle, uint32_t* count,
                                           ze_device_handle_t*) {
  return guarded([&] {
    Device* device = nullptr;
    if (auto r = check_device(handle, device); r != ZE_RESULT_SUCCESS) return r;
    if (count == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    *count = 0;
    return ZE_RESULT_SUCCESS;
  });
}

ze_result_t ZE_APICALL DeviceGetProperties(ze_device_handle_t handle,
                                           ze_device_properties_t* properties) {
  return guarded([&] {
    Device* device = nullptr;
    if (auto r = check_device(handle, device); r != ZE_RESULT_SUCCESS) return r;
    if (properties == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    properties->type = ZE_DEVICE_TYPE_GPU;
    properties->vendorId = 0x8086;
    properties->deviceId = 0x4d48;  // not a real Intel device id ("HM")
    properties->flags = 0;          // discrete: not integrated, not a sub-device, no ECC
    properties->subdeviceId = 0;
    properties->coreClockRate = 1000;
    properties->maxMemAllocSize = kDeviceMemoryBytes;
    properties->maxHardwareContexts = 64;
    properties->maxCommandQueuePriority = 0;
    properties->numThreadsPerEU = 1;
    properties->physicalEUSimdWidth = 1;
    properties->numEUsPerSubslice = 1;
    properties->numSubslicesPerSlice = 1;
    properties->numSlices = 1;
    // The timer ticks in nanoseconds: 1 ns per tick for DEVICE_PROPERTIES, and (the 1.2 meaning)
    // 1e9 ticks per second for DEVICE_PROPERTIES_1_2.
    properties->timerResolution =
        properties->stype == ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES_1_2 ? 1000000000ull : 1ull;
    properties->timestampValidBits = 64;
    properties->kernelTimestampValidBits = 64;
    std::memset(properties->uuid.id, 0, sizeof(properties->uuid.id));
    std::memcpy(properties->uuid.id, "hetmesh-ze", 10);
    properties->uuid.id[12] = static_cast<uint8_t>(device->index);
    copy_name(properties->name, sizeof(properties->name), device->name);
    return ZE_RESULT_SUCCESS;
  });
}

ze_result_t ZE_APICALL DeviceGetCommandQueueGroupProperties(
    ze_device_handle_t handle, uint32_t* count, ze_command_queue_group_properties_t* properties) {
  return guarded([&] {
    Device* device = nullptr;
    if (auto r = check_device(handle, device); r != ZE_RESULT_SUCCESS) return r;
    if (count == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    if (*count == 0 || properties == nullptr) {
      *count = kQueueGroupCount;
      return ZE_RESULT_SUCCESS;
    }
    const uint32_t n = *count < kQueueGroupCount ? *count : kQueueGroupCount;
    for (uint32_t i = 0; i < n; ++i) {
      auto& group = properties[i];
      group.flags = i == kComputeOrdinal ? (ZE_COMMAND_QUEUE_GROUP_PROPERTY_FLAG_COMPUTE |
                                            ZE_COMMAND_QUEUE_GROUP_PROPERTY_FLAG_COPY)
                                         : ZE_COMMAND_QUEUE_GROUP_PROPERTY_FLAG_COPY;
      group.maxMemoryFillPatternSize = kMaxFillPatternSize;
      group.numQueues = 1;
    }
    *count = n;
    return ZE_RESULT_SUCCESS;
  });
}

ze_result_t ZE_APICALL DeviceGetMemoryProperties(ze_device_handle_t handle, uint32_t* count,
                                                 ze_device_memory_properties_t* properties) {
  return guarded([&] {
    Device* device = nullptr;
    if (auto r = check_device(handle, device); r != ZE_RESULT_SUCCESS) return r;
    if (count == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    if (*count == 0 || properties == nullptr) {
      *count = 1;
      return ZE_RESULT_SUCCESS;
    }
    properties[0].flags = 0;
    properties[0].maxClockRate = 1000;
    properties[0].maxBusWidth = 64;
    properties[0].totalSize = kDeviceMemoryBytes;
    copy_name(properties[0].name, sizeof(properties[0].name), "host memfd");
    *count = 1;
    return ZE_RESULT_SUCCESS;
  });
}

ze_result_t ZE_APICALL DeviceCanAccessPeer(ze_device_handle_t handle, ze_device_handle_t peer,
                                           ze_bool_t* value) {
  return guarded([&] {
    Device* device = nullptr;
    Device* other = nullptr;
    if (auto r = check_device(handle, device); r != ZE_RESULT_SUCCESS) return r;
    if (auto r = check_device(peer, other); r != ZE_RESULT_SUCCESS) return r;
    if (value == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    *value = 1;  // every device reaches every other one's memory (it is all host memory)
    return ZE_RESULT_SUCCESS;
  });
}

ze_result_t ZE_APICALL DeviceGetStatus(ze_device_handle_t handle) {
  return guarded([&] {
    Device* device = nullptr;
    return check_device(handle, device);
  });
}

ze_result_t ZE_APICALL DeviceGetGlobalTimestamps(ze_device_handle_t handle, uint64_t* host,
                                                 uint64_t* device_ts) {
  return guarded([&] {
    Device* device = nullptr;
    if (auto r = check_device(handle, device); r != ZE_RESULT_SUCCESS) return r;
    if (host == nullptr || device_ts == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    *device_ts = now_ns();
    *host = *device_ts;
    return ZE_RESULT_SUCCESS;
  });
}

ze_result_t ZE_APICALL DevicePciGetPropertiesExt(ze_device_handle_t handle,
                                                 ze_pci_ext_properties_t* properties) {
  return guarded([&] {
    Device* device = nullptr;
    if (auto r = check_device(handle, device); r != ZE_RESULT_SUCCESS) return r;
    if (properties == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    // Fake but stable: 0000:a0+i:00.0 (not a bus this host has).
    properties->address.domain = 0;
    properties->address.bus = 0xa0 + device->index;
    properties->address.device = 0;
    properties->address.function = 0;
    properties->maxSpeed.genVersion = 4;
    properties->maxSpeed.width = 16;
    properties->maxSpeed.maxBandwidth = 32000000000ll;
    return ZE_RESULT_SUCCESS;
  });
}

ze_result_t ZE_APICALL ContextCreate(ze_driver_handle_t handle, const ze_context_desc_t* desc,
                                     ze_context_handle_t* out) {
  return guarded([&] {
    if (auto r = initialized_driver(handle); r != ZE_RESULT_SUCCESS) return r;
    if (desc == nullptr || out == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    auto context = std::make_shared<Context>();
    context->serial = next_serial();
    *out = static_cast<ze_context_handle_t>(contexts().add(std::move(context)));
    return ZE_RESULT_SUCCESS;
  });
}

ze_result_t ZE_APICALL ContextDestroy(ze_context_handle_t handle) {
  return guarded([&] {
    if (handle == nullptr) return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
    // Allocations, pools and lists made in it are not freed here: the application frees them
    // (a real driver tears them down; this stand-in leaves them, which only leaks).
    return contexts().remove(handle) ? ZE_RESULT_SUCCESS : ZE_RESULT_ERROR_INVALID_ARGUMENT;
  });
}

ze_result_t ZE_APICALL ContextGetStatus(ze_context_handle_t handle) {
  return guarded([&] { return check_context(handle); });
}

}  // namespace hetmesh_ze
