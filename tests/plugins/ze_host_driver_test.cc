// The Level Zero host stand-in driver (plugins/level_zero/tools), driven through Debian's real
// loader (libze_loader.so.1) with ZE_ENABLE_ALT_DRIVERS naming the built driver: what the
// level_zero plugin's conformance runs rely on. Device memory must not be host-addressable, copies
// must move the right bytes, events and the zex memory operations must order work, and IPC must
// reach another process. Helpers that need a fresh process (IPC, zero devices) re-run this binary
// with HETMESH_ZE_TEST_CHILD set; it does its part before main() and exits with a code.
#include <level_zero/ze_api.h>

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace {

// From intel/compute-runtime's zex_common.h / zex_cmdlist.h (declared, not copied).
struct ZexWaitOnMemDesc {
  uint32_t actionFlag;
  uint32_t waitScope;
};
struct ZexWriteToMemDesc {
  uint32_t writeScope;
};
constexpr uint32_t kZexEqual = 1u << 0;
constexpr uint32_t kZexGreaterEqual = 1u << 3;
constexpr uint32_t kZexScopeHost = 1u << 2;
using WaitOnMemoryFn = ze_result_t(ZE_APICALL*)(ze_command_list_handle_t, ZexWaitOnMemDesc*, void*,
                                                uint32_t, ze_event_handle_t);
using WaitOnMemory64Fn = ze_result_t(ZE_APICALL*)(ze_command_list_handle_t, ZexWaitOnMemDesc*,
                                                  void*, uint64_t, ze_event_handle_t);
using WriteToMemoryFn = ze_result_t(ZE_APICALL*)(ze_command_list_handle_t, ZexWriteToMemDesc*,
                                                 void*, uint64_t);

constexpr uint64_t kForever = UINT64_MAX;
constexpr uint64_t kFiveSeconds = 5'000'000'000ull;

uint8_t pattern_byte(size_t i) {
  return static_cast<uint8_t>(i * 7 + 3);
}

// Points the loader at the built driver; 3 devices, to see the variable obeyed.
void set_driver_environment() {
  setenv("ZE_ENABLE_ALT_DRIVERS", HETMESH_ZE_HOST_DRIVER, 1);
  unsetenv("ZE_ENABLE_LOADER_INTERCEPT");
  unsetenv("HETMESH_ZE_HOST_NO_MEMORY_SYNC");
  if (getenv("HETMESH_ZE_TEST_CHILD") == nullptr) setenv("HETMESH_ZE_HOST_DEVICES", "3", 1);
}

struct Ze {
  ze_result_t init = ZE_RESULT_ERROR_UNINITIALIZED;
  ze_driver_handle_t driver = nullptr;
  std::vector<ze_device_handle_t> devices;
  ze_context_handle_t context = nullptr;
};

Ze start() {
  Ze ze;
  set_driver_environment();
  ze.init = zeInit(ZE_INIT_FLAG_GPU_ONLY);
  if (ze.init != ZE_RESULT_SUCCESS) return ze;
  uint32_t count = 1;
  if (zeDriverGet(&count, &ze.driver) != ZE_RESULT_SUCCESS || count != 1) return ze;
  count = 0;
  zeDeviceGet(ze.driver, &count, nullptr);
  ze.devices.resize(count);
  if (count > 0) zeDeviceGet(ze.driver, &count, ze.devices.data());
  ze_context_desc_t desc{ZE_STRUCTURE_TYPE_CONTEXT_DESC, nullptr, 0};
  zeContextCreate(ze.driver, &desc, &ze.context);
  return ze;
}

ze_command_list_handle_t make_list(const Ze& ze, ze_device_handle_t device, uint32_t ordinal = 0) {
  ze_command_queue_desc_t desc{};
  desc.stype = ZE_STRUCTURE_TYPE_COMMAND_QUEUE_DESC;
  desc.ordinal = ordinal;
  desc.index = 0;
  desc.mode = ZE_COMMAND_QUEUE_MODE_ASYNCHRONOUS;
  ze_command_list_handle_t list = nullptr;
  EXPECT_EQ(zeCommandListCreateImmediate(ze.context, device, &desc, &list), ZE_RESULT_SUCCESS);
  return list;
}

void* device_alloc(const Ze& ze, size_t size, ze_device_handle_t device) {
  ze_device_mem_alloc_desc_t desc{ZE_STRUCTURE_TYPE_DEVICE_MEM_ALLOC_DESC, nullptr, 0, 0};
  void* p = nullptr;
  EXPECT_EQ(zeMemAllocDevice(ze.context, &desc, size, 0, device, &p), ZE_RESULT_SUCCESS);
  return p;
}

void* host_alloc(const Ze& ze, size_t size) {
  ze_host_mem_alloc_desc_t desc{ZE_STRUCTURE_TYPE_HOST_MEM_ALLOC_DESC, nullptr, 0};
  void* p = nullptr;
  EXPECT_EQ(zeMemAllocHost(ze.context, &desc, size, 0, &p), ZE_RESULT_SUCCESS);
  return p;
}

struct Pool {
  ze_event_pool_handle_t pool = nullptr;
  uint32_t next = 0;
};

Pool make_pool(const Ze& ze, uint32_t count = 16) {
  ze_event_pool_desc_t desc{ZE_STRUCTURE_TYPE_EVENT_POOL_DESC, nullptr,
                            ZE_EVENT_POOL_FLAG_HOST_VISIBLE, count};
  Pool pool;
  EXPECT_EQ(zeEventPoolCreate(ze.context, &desc, 0, nullptr, &pool.pool), ZE_RESULT_SUCCESS);
  return pool;
}

ze_event_handle_t make_event(Pool& pool) {
  ze_event_desc_t desc{ZE_STRUCTURE_TYPE_EVENT_DESC, nullptr, pool.next++, ZE_EVENT_SCOPE_FLAG_HOST,
                       ZE_EVENT_SCOPE_FLAG_HOST};
  ze_event_handle_t event = nullptr;
  EXPECT_EQ(zeEventCreate(pool.pool, &desc, &event), ZE_RESULT_SUCCESS);
  return event;
}

template <class Fn>
Fn extension_function(const Ze& ze, const char* name) {
  void* f = nullptr;
  if (zeDriverGetExtensionFunctionAddress(ze.driver, name, &f) != ZE_RESULT_SUCCESS) return nullptr;
  return reinterpret_cast<Fn>(f);
}

std::string to_hex(const void* data, size_t size) {
  std::string out;
  char byte[3];
  for (size_t i = 0; i < size; ++i) {
    std::snprintf(byte, sizeof(byte), "%02x", static_cast<const uint8_t*>(data)[i]);
    out += byte;
  }
  return out;
}

bool from_hex(const char* text, void* data, size_t size) {
  if (text == nullptr || std::strlen(text) != size * 2) return false;
  for (size_t i = 0; i < size; ++i) {
    unsigned value = 0;
    if (std::sscanf(text + 2 * i, "%2x", &value) != 1) return false;
    static_cast<uint8_t*>(data)[i] = static_cast<uint8_t>(value);
  }
  return true;
}

// ---- the child process's parts (run before main, exit with a code)
// -------------------------------

// Opens the parent's IPC handle, checks the parent's bytes, writes its marker after them.
int child_ipc() {
  Ze ze = start();
  if (ze.init != ZE_RESULT_SUCCESS || ze.devices.empty()) return 10;
  ze_ipc_mem_handle_t handle{};
  if (!from_hex(getenv("HETMESH_ZE_TEST_IPC_HANDLE"), handle.data, sizeof(handle.data))) return 11;
  const size_t size = std::strtoull(getenv("HETMESH_ZE_TEST_IPC_SIZE"), nullptr, 10);
  // As with Intel's driver, the handle's first 4 bytes are the exporter's descriptor: bring it
  // here (the parent's memfd can be opened again through /proc) and put ours in its place.
  int32_t theirs = -1;
  std::memcpy(&theirs, handle.data, sizeof theirs);
  const std::string path = "/proc/" + std::to_string(getppid()) + "/fd/" + std::to_string(theirs);
  const int32_t ours = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (ours < 0) return 16;
  std::memcpy(handle.data, &ours, sizeof ours);
  void* mapped = nullptr;
  const ze_result_t opened = zeMemOpenIpcHandle(ze.context, ze.devices[0], handle, 0, &mapped);
  close(ours);  // the driver keeps its own
  if (opened != ZE_RESULT_SUCCESS) return 12;
  std::vector<uint8_t> seen(size + 8);
  auto list = make_list(ze, ze.devices[0], 1);
  Pool pool = make_pool(ze);
  auto done = make_event(pool);
  const uint64_t marker = 0x0123456789abcdefull;
  zeCommandListAppendMemoryCopy(list, seen.data(), mapped, size, nullptr, 0, nullptr);
  zeCommandListAppendMemoryCopy(list, static_cast<uint8_t*>(mapped) + size, &marker, 8, done, 0,
                                nullptr);
  if (zeEventHostSynchronize(done, kFiveSeconds) != ZE_RESULT_SUCCESS) return 13;
  for (size_t i = 0; i < size; ++i) {
    if (seen[i] != pattern_byte(i)) return 14;
  }
  if (zeMemCloseIpcHandle(ze.context, mapped) != ZE_RESULT_SUCCESS) return 15;
  zeCommandListDestroy(list);
  return 0;
}

// Zero devices: the driver is found, zeDeviceGet gives 0.
int child_no_devices() {
  Ze ze = start();
  if (ze.init != ZE_RESULT_SUCCESS) return 20;
  if (ze.driver == nullptr) return 21;
  return ze.devices.empty() ? 0 : 22;
}

[[maybe_unused]] const int kChildRan = [] {
  const char* mode = getenv("HETMESH_ZE_TEST_CHILD");
  if (mode == nullptr) return 0;
  int code = 99;
  if (std::strcmp(mode, "ipc") == 0) code = child_ipc();
  if (std::strcmp(mode, "no_devices") == 0) code = child_no_devices();
  std::fflush(nullptr);
  _exit(code);
}();

// Runs this binary in `mode` with extra environment; returns its wait status.
int run_child(const char* mode, std::vector<std::string> extra) {
  extra.push_back(std::string("HETMESH_ZE_TEST_CHILD=") + mode);
  std::vector<std::string> env(extra);
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry(*e);
    bool replaced = false;
    for (const auto& x : extra)
      replaced |= entry.compare(0, x.find('=') + 1, x, 0, x.find('=') + 1) == 0;
    if (!replaced) env.push_back(entry);
  }
  std::vector<char*> envp;
  for (auto& s : env)
    envp.push_back(s.data());
  envp.push_back(nullptr);
  std::string exe = "/proc/self/exe";
  char* argv[] = {exe.data(), nullptr};
  pid_t pid = 0;
  if (posix_spawn(&pid, exe.c_str(), nullptr, nullptr, argv, envp.data()) != 0) return -1;
  int status = 0;
  waitpid(pid, &status, 0);
  return status;
}

class ZeHostDriver : public ::testing::Test {
 protected:
  static Ze& ze() {
    static Ze instance = start();
    return instance;
  }
  void SetUp() override {
    ASSERT_EQ(ze().init, ZE_RESULT_SUCCESS)
        << "zeInit through the loader, driver " << HETMESH_ZE_HOST_DRIVER;
    ASSERT_NE(ze().driver, nullptr);
    ASSERT_EQ(ze().devices.size(), 3u) << "HETMESH_ZE_HOST_DEVICES=3";
    ASSERT_NE(ze().context, nullptr);
  }
  ze_device_handle_t dev(size_t i) { return ze().devices.at(i); }
};

TEST_F(ZeHostDriver, LoaderFindsDriverAndDescribesDevices) {
  ze_api_version_t version{};
  ASSERT_EQ(zeDriverGetApiVersion(ze().driver, &version), ZE_RESULT_SUCCESS);
  EXPECT_EQ(version, ZE_API_VERSION_1_4);
  std::vector<uint8_t> buses;
  for (size_t i = 0; i < 3; ++i) {
    ze_device_properties_t p{};
    p.stype = ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES;
    ASSERT_EQ(zeDeviceGetProperties(dev(i), &p), ZE_RESULT_SUCCESS);
    EXPECT_EQ(std::string(p.name), "hetmesh Level Zero host stand-in " + std::to_string(i));
    EXPECT_EQ(p.vendorId, 0x8086u);
    EXPECT_EQ(p.type, ZE_DEVICE_TYPE_GPU);
    EXPECT_EQ(p.timerResolution, 1u);
    EXPECT_EQ(p.timestampValidBits, 64u);

    uint32_t count = 0;
    ASSERT_EQ(zeDeviceGetMemoryProperties(dev(i), &count, nullptr), ZE_RESULT_SUCCESS);
    ASSERT_EQ(count, 1u);
    ze_device_memory_properties_t memory{};
    memory.stype = ZE_STRUCTURE_TYPE_DEVICE_MEMORY_PROPERTIES;
    ASSERT_EQ(zeDeviceGetMemoryProperties(dev(i), &count, &memory), ZE_RESULT_SUCCESS);
    EXPECT_EQ(memory.totalSize, 16ull << 30);

    count = 0;
    ASSERT_EQ(zeDeviceGetCommandQueueGroupProperties(dev(i), &count, nullptr), ZE_RESULT_SUCCESS);
    ASSERT_EQ(count, 2u);
    ze_command_queue_group_properties_t groups[2]{};
    ASSERT_EQ(zeDeviceGetCommandQueueGroupProperties(dev(i), &count, groups), ZE_RESULT_SUCCESS);
    EXPECT_TRUE(groups[0].flags & ZE_COMMAND_QUEUE_GROUP_PROPERTY_FLAG_COMPUTE);
    EXPECT_TRUE(groups[1].flags & ZE_COMMAND_QUEUE_GROUP_PROPERTY_FLAG_COPY);
    EXPECT_FALSE(groups[1].flags & ZE_COMMAND_QUEUE_GROUP_PROPERTY_FLAG_COMPUTE);

    ze_pci_ext_properties_t pci{};
    pci.stype = ZE_STRUCTURE_TYPE_PCI_EXT_PROPERTIES;
    ASSERT_EQ(zeDevicePciGetPropertiesExt(dev(i), &pci), ZE_RESULT_SUCCESS);
    buses.push_back(static_cast<uint8_t>(pci.address.bus));
    ze_bool_t peer = 0;
    ASSERT_EQ(zeDeviceCanAccessPeer(dev(i), dev((i + 1) % 3), &peer), ZE_RESULT_SUCCESS);
    EXPECT_TRUE(peer);
  }
  EXPECT_NE(buses[0], buses[1]);
  EXPECT_NE(buses[1], buses[2]);

  uint32_t count = 0;
  ASSERT_EQ(zeDriverGetExtensionProperties(ze().driver, &count, nullptr), ZE_RESULT_SUCCESS);
  std::vector<ze_driver_extension_properties_t> extensions(count);
  ASSERT_EQ(zeDriverGetExtensionProperties(ze().driver, &count, extensions.data()),
            ZE_RESULT_SUCCESS);
  std::vector<std::string> names;
  for (auto& e : extensions)
    names.emplace_back(e.name);
  EXPECT_NE(std::find(names.begin(), names.end(), "ZE_extension_pci_properties"), names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), "ZE_intel_experimental_command_list_memory_sync"),
            names.end());
  EXPECT_NE(extension_function<WaitOnMemoryFn>(ze(), "zexCommandListAppendWaitOnMemory"), nullptr);
  EXPECT_NE(extension_function<WaitOnMemory64Fn>(ze(), "zexCommandListAppendWaitOnMemory64"),
            nullptr);
  EXPECT_NE(extension_function<WriteToMemoryFn>(ze(), "zexCommandListAppendWriteToMemory"),
            nullptr);
  EXPECT_EQ(extension_function<WriteToMemoryFn>(ze(), "zexNoSuchFunction"), nullptr);
}

TEST_F(ZeHostDriver, NoMemorySyncWhenAskedNotTo) {
  setenv("HETMESH_ZE_HOST_NO_MEMORY_SYNC", "1", 1);
  uint32_t count = 0;
  ASSERT_EQ(zeDriverGetExtensionProperties(ze().driver, &count, nullptr), ZE_RESULT_SUCCESS);
  std::vector<ze_driver_extension_properties_t> extensions(count);
  ASSERT_EQ(zeDriverGetExtensionProperties(ze().driver, &count, extensions.data()),
            ZE_RESULT_SUCCESS);
  auto write = extension_function<WriteToMemoryFn>(ze(), "zexCommandListAppendWriteToMemory");
  unsetenv("HETMESH_ZE_HOST_NO_MEMORY_SYNC");
  for (auto& e : extensions) {
    EXPECT_STRNE(e.name, "ZE_intel_experimental_command_list_memory_sync");
  }
  EXPECT_EQ(count, 1u);
  EXPECT_EQ(write, nullptr);
}

TEST_F(ZeHostDriver, ZeroDevicesAllowed) {
  int status = run_child("no_devices", {"HETMESH_ZE_HOST_DEVICES=0"});
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST_F(ZeHostDriver, DeviceMemoryIsNotHostAddressable) {
  auto* p = static_cast<volatile uint8_t*>(device_alloc(ze(), 4096, dev(0)));
  ASSERT_NE(p, nullptr);
  // Its mapping is PROT_NONE ("---s") in /proc/self/maps.
  std::ifstream maps("/proc/self/maps");
  std::string line;
  bool found = false;
  const auto address = reinterpret_cast<uintptr_t>(p);
  while (std::getline(maps, line)) {
    uintptr_t lo = 0;
    uintptr_t hi = 0;
    char perms[5] = {};
    if (std::sscanf(line.c_str(), "%lx-%lx %4s", &lo, &hi, perms) != 3) continue;
    if (address >= lo && address < hi) {
      found = true;
      EXPECT_STREQ(perms, "---s") << line;
    }
  }
  EXPECT_TRUE(found);
  // And reading it kills the reader.
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    signal(SIGSEGV, SIG_DFL);  // not a sanitizer's report: the plain fault
    volatile uint8_t value = p[17];
    (void)value;
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV) << status;
  // Host memory is plain memory.
  auto* h = static_cast<uint8_t*>(host_alloc(ze(), 100));
  h[99] = 5;
  EXPECT_EQ(h[99], 5);
  EXPECT_EQ(zeMemFree(ze().context, const_cast<uint8_t*>(p)), ZE_RESULT_SUCCESS);
  EXPECT_EQ(zeMemFree(ze().context, h), ZE_RESULT_SUCCESS);
}

TEST_F(ZeHostDriver, AllocationPropertiesAndRanges) {
  const size_t size = 10007;
  auto* d = static_cast<uint8_t*>(device_alloc(ze(), size, dev(1)));
  auto* h = static_cast<uint8_t*>(host_alloc(ze(), 333));
  ze_memory_allocation_properties_t props{};
  props.stype = ZE_STRUCTURE_TYPE_MEMORY_ALLOCATION_PROPERTIES;
  ze_device_handle_t owner = nullptr;
  ASSERT_EQ(zeMemGetAllocProperties(ze().context, d + 5000, &props, &owner), ZE_RESULT_SUCCESS);
  EXPECT_EQ(props.type, ZE_MEMORY_TYPE_DEVICE);
  EXPECT_EQ(owner, dev(1));
  ASSERT_EQ(zeMemGetAllocProperties(ze().context, h + 1, &props, &owner), ZE_RESULT_SUCCESS);
  EXPECT_EQ(props.type, ZE_MEMORY_TYPE_HOST);
  int plain = 0;
  ASSERT_EQ(zeMemGetAllocProperties(ze().context, &plain, &props, &owner), ZE_RESULT_SUCCESS);
  EXPECT_EQ(props.type, ZE_MEMORY_TYPE_UNKNOWN);
  void* base = nullptr;
  size_t range = 0;
  ASSERT_EQ(zeMemGetAddressRange(ze().context, d + size - 1, &base, &range), ZE_RESULT_SUCCESS);
  EXPECT_EQ(base, d);
  EXPECT_EQ(range, size);
  EXPECT_EQ(zeMemGetAddressRange(ze().context, &plain, &base, &range),
            ZE_RESULT_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(zeMemFree(ze().context, d + 1), ZE_RESULT_ERROR_INVALID_ARGUMENT);  // not the base
  EXPECT_EQ(zeMemFree(ze().context, d), ZE_RESULT_SUCCESS);
  EXPECT_EQ(zeMemFree(ze().context, d), ZE_RESULT_ERROR_INVALID_ARGUMENT);  // twice
  EXPECT_EQ(zeMemFree(ze().context, h), ZE_RESULT_SUCCESS);
}

TEST_F(ZeHostDriver, CopyRoundTripWithOddSizesAndOffsets) {
  const size_t size = 100003;
  std::vector<uint8_t> source(size + 64);
  for (size_t i = 0; i < source.size(); ++i)
    source[i] = pattern_byte(i);
  auto* d0 = static_cast<uint8_t*>(device_alloc(ze(), size + 13, dev(0)));
  auto* d1 = static_cast<uint8_t*>(device_alloc(ze(), size + 29, dev(1)));
  auto* back = static_cast<uint8_t*>(host_alloc(ze(), size + 5));
  std::memset(back, 0xee, size + 5);
  auto copy = make_list(ze(), dev(0), 1);
  auto compute = make_list(ze(), dev(1), 0);
  Pool pool = make_pool(ze());
  auto first = make_event(pool);
  auto done = make_event(pool);
  // plain host -> device 0 (offset 7) on the copy engine; device 0 -> device 1 (offset 5), then
  // device 1 -> a host allocation (offset 3) on device 1's compute list, after `first`.
  ASSERT_EQ(
      zeCommandListAppendMemoryCopy(copy, d0 + 7, source.data() + 1, size, nullptr, 0, nullptr),
      ZE_RESULT_SUCCESS);
  ASSERT_EQ(zeCommandListAppendMemoryCopy(copy, d1 + 5, d0 + 7, size, first, 0, nullptr),
            ZE_RESULT_SUCCESS);
  ASSERT_EQ(zeCommandListAppendMemoryCopy(compute, back + 3, d1 + 5, size - 2, done, 1, &first),
            ZE_RESULT_SUCCESS);
  ASSERT_EQ(zeEventHostSynchronize(done, kFiveSeconds), ZE_RESULT_SUCCESS);
  for (size_t i = 0; i < size - 2; ++i) {
    ASSERT_EQ(back[3 + i], pattern_byte(i + 1)) << "at " << i;
  }
  EXPECT_EQ(back[2], 0xee);
  EXPECT_EQ(back[3 + size - 2], 0xee);
  // A range that runs past its allocation is refused at append time.
  EXPECT_EQ(zeCommandListAppendMemoryCopy(copy, d0 + 14, source.data(), size, nullptr, 0, nullptr),
            ZE_RESULT_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(zeCommandListDestroy(copy), ZE_RESULT_SUCCESS);
  EXPECT_EQ(zeCommandListDestroy(compute), ZE_RESULT_SUCCESS);
  EXPECT_EQ(zeEventDestroy(first), ZE_RESULT_SUCCESS);
  EXPECT_EQ(zeEventDestroy(done), ZE_RESULT_SUCCESS);
  EXPECT_EQ(zeEventPoolDestroy(pool.pool), ZE_RESULT_SUCCESS);
  zeMemFree(ze().context, d0);
  zeMemFree(ze().context, d1);
  zeMemFree(ze().context, back);
}

TEST_F(ZeHostDriver, FillWritesThePatternAndNothingElse) {
  const size_t size = 3 * 4096 + 1;
  auto* d = static_cast<uint8_t*>(device_alloc(ze(), size, dev(2)));
  std::vector<uint8_t> back(size, 0x11);
  auto list = make_list(ze(), dev(2));
  Pool pool = make_pool(ze());
  auto done = make_event(pool);
  const uint8_t zero = 0;
  const uint8_t ab = 0xab;
  const uint32_t word = 0x04030201;
  ASSERT_EQ(zeCommandListAppendMemoryFill(list, d, &zero, 1, size, nullptr, 0, nullptr),
            ZE_RESULT_SUCCESS);
  ASSERT_EQ(zeCommandListAppendMemoryFill(list, d + 11, &ab, 1, 4097, nullptr, 0, nullptr),
            ZE_RESULT_SUCCESS);
  ASSERT_EQ(zeCommandListAppendMemoryFill(list, d + 8192, &word, 4, 12, nullptr, 0, nullptr),
            ZE_RESULT_SUCCESS);
  ASSERT_EQ(zeCommandListAppendMemoryCopy(list, back.data(), d, size, done, 0, nullptr),
            ZE_RESULT_SUCCESS);
  ASSERT_EQ(zeEventHostSynchronize(done, kFiveSeconds), ZE_RESULT_SUCCESS);
  for (size_t i = 0; i < 8192; ++i) {
    ASSERT_EQ(back[i], (i >= 11 && i < 11 + 4097) ? 0xab : 0) << "at " << i;
  }
  for (size_t i = 0; i < 12; ++i)
    EXPECT_EQ(back[8192 + i], (i % 4) + 1);
  EXPECT_EQ(back[8192 + 12], 0);
  EXPECT_EQ(zeCommandListAppendMemoryFill(list, d, &word, 3, 12, nullptr, 0, nullptr),
            ZE_RESULT_ERROR_INVALID_SIZE);
  zeCommandListDestroy(list);
  zeEventDestroy(done);
  zeEventPoolDestroy(pool.pool);
  zeMemFree(ze().context, d);
}

TEST_F(ZeHostDriver, EventsSignalWaitAndTimeOut) {
  Pool pool = make_pool(ze());
  auto gate = make_event(pool);
  auto copied = make_event(pool);
  auto other = make_event(pool);
  EXPECT_EQ(zeEventQueryStatus(gate), ZE_RESULT_NOT_READY);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(zeEventHostSynchronize(gate, 20'000'000), ZE_RESULT_NOT_READY);  // 20 ms
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(19));
  EXPECT_EQ(zeEventHostSynchronize(gate, 0), ZE_RESULT_NOT_READY);

  // Device 0's list waits on `gate`, which a list of device 1 signals after the host's go.
  auto waiter = make_list(ze(), dev(0));
  auto signaler = make_list(ze(), dev(1), 1);
  uint32_t value = 0;
  const uint32_t seven = 7;
  ASSERT_EQ(zeCommandListAppendMemoryCopy(waiter, &value, &seven, 4, copied, 1, &gate),
            ZE_RESULT_SUCCESS);
  ASSERT_EQ(zeCommandListAppendWaitOnEvents(signaler, 1, &other), ZE_RESULT_SUCCESS);
  ASSERT_EQ(zeCommandListAppendSignalEvent(signaler, gate), ZE_RESULT_SUCCESS);
  EXPECT_EQ(zeEventHostSynchronize(copied, 50'000'000), ZE_RESULT_NOT_READY);
  EXPECT_EQ(value, 0u);
  ASSERT_EQ(zeEventHostSignal(other), ZE_RESULT_SUCCESS);
  ASSERT_EQ(zeEventHostSynchronize(copied, kFiveSeconds), ZE_RESULT_SUCCESS);
  EXPECT_EQ(value, 7u);
  EXPECT_EQ(zeEventQueryStatus(gate), ZE_RESULT_SUCCESS);

  // Reset from the host and from a list; a barrier signals after its waits.
  ASSERT_EQ(zeEventHostReset(gate), ZE_RESULT_SUCCESS);
  EXPECT_EQ(zeEventQueryStatus(gate), ZE_RESULT_NOT_READY);
  ASSERT_EQ(zeCommandListAppendEventReset(waiter, copied), ZE_RESULT_SUCCESS);
  ASSERT_EQ(zeCommandListAppendBarrier(waiter, gate, 1, &other), ZE_RESULT_SUCCESS);
  ASSERT_EQ(zeEventHostSynchronize(gate, kFiveSeconds), ZE_RESULT_SUCCESS);
  EXPECT_EQ(zeEventQueryStatus(copied), ZE_RESULT_NOT_READY);

  // One live event per index; a pool with live events cannot go.
  ze_event_desc_t same{ZE_STRUCTURE_TYPE_EVENT_DESC, nullptr, 0, 0, 0};
  ze_event_handle_t dup = nullptr;
  EXPECT_EQ(zeEventCreate(pool.pool, &same, &dup), ZE_RESULT_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(zeEventPoolDestroy(pool.pool), ZE_RESULT_ERROR_HANDLE_OBJECT_IN_USE);

  // Destroying a list whose work is still pending waits for that work.
  auto late = make_list(ze(), dev(2));
  ASSERT_EQ(zeEventHostReset(other), ZE_RESULT_SUCCESS);
  value = 0;
  ASSERT_EQ(zeCommandListAppendMemoryCopy(late, &value, &seven, 4, nullptr, 1, &other),
            ZE_RESULT_SUCCESS);
  std::thread releaser([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    zeEventHostSignal(other);
  });
  EXPECT_EQ(zeCommandListDestroy(late), ZE_RESULT_SUCCESS);
  EXPECT_EQ(value, 7u);
  releaser.join();

  zeCommandListDestroy(waiter);
  zeCommandListDestroy(signaler);
  for (auto e : {gate, copied, other})
    EXPECT_EQ(zeEventDestroy(e), ZE_RESULT_SUCCESS);
  EXPECT_EQ(zeEventPoolDestroy(pool.pool), ZE_RESULT_SUCCESS);
}

TEST_F(ZeHostDriver, WaitOnMemoryReleasedByAHostThread) {
  auto wait32 = extension_function<WaitOnMemoryFn>(ze(), "zexCommandListAppendWaitOnMemory");
  auto wait64 = extension_function<WaitOnMemory64Fn>(ze(), "zexCommandListAppendWaitOnMemory64");
  ASSERT_NE(wait32, nullptr);
  ASSERT_NE(wait64, nullptr);
  auto* words = static_cast<uint64_t*>(host_alloc(ze(), 64));
  std::memset(words, 0, 64);
  auto* flag = reinterpret_cast<uint32_t*>(words);
  auto list = make_list(ze(), dev(0));
  auto other = make_list(ze(), dev(0), 1);
  Pool pool = make_pool(ze());
  auto released = make_event(pool);
  auto copied = make_event(pool);
  auto released64 = make_event(pool);

  ZexWaitOnMemDesc geq{kZexGreaterEqual, kZexScopeHost};
  ASSERT_EQ(wait32(list, &geq, flag, 5, released), ZE_RESULT_SUCCESS);
  // The waiting list blocks nobody else.
  uint32_t value = 0;
  const uint32_t nine = 9;
  ASSERT_EQ(zeCommandListAppendMemoryCopy(other, &value, &nine, 4, copied, 0, nullptr),
            ZE_RESULT_SUCCESS);
  ASSERT_EQ(zeEventHostSynchronize(copied, kFiveSeconds), ZE_RESULT_SUCCESS);
  EXPECT_EQ(value, 9u);
  std::atomic_ref<uint32_t>(*flag).store(4);
  EXPECT_EQ(zeEventHostSynchronize(released, 50'000'000), ZE_RESULT_NOT_READY);
  std::thread host([flag] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    std::atomic_ref<uint32_t>(*flag).store(5);
  });
  EXPECT_EQ(zeEventHostSynchronize(released, kFiveSeconds), ZE_RESULT_SUCCESS);
  host.join();

  // 64-bit: on a word in device memory, released by a copy from another list.
  auto* d = static_cast<uint64_t*>(device_alloc(ze(), 4096, dev(0)));
  const uint64_t zero = 0;
  const uint64_t big = 0x100000000ull;
  ASSERT_EQ(zeCommandListAppendMemoryCopy(other, d + 3, &zero, 8, copied, 0, nullptr),
            ZE_RESULT_SUCCESS);
  ASSERT_EQ(zeEventHostSynchronize(copied, kFiveSeconds), ZE_RESULT_SUCCESS);
  ZexWaitOnMemDesc eq{kZexEqual, kZexScopeHost};
  ASSERT_EQ(wait64(list, &eq, d + 3, big, released64), ZE_RESULT_SUCCESS);
  EXPECT_EQ(zeEventHostSynchronize(released64, 30'000'000), ZE_RESULT_NOT_READY);
  ASSERT_EQ(zeCommandListAppendMemoryCopy(other, d + 3, &big, 8, nullptr, 0, nullptr),
            ZE_RESULT_SUCCESS);
  EXPECT_EQ(zeEventHostSynchronize(released64, kFiveSeconds), ZE_RESULT_SUCCESS);

  // Bad condition, misaligned word, null list.
  ZexWaitOnMemDesc bad{kZexEqual | kZexGreaterEqual, 0};
  EXPECT_EQ(wait32(list, &bad, flag, 1, nullptr), ZE_RESULT_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(wait32(list, &eq, reinterpret_cast<uint8_t*>(flag) + 1, 1, nullptr),
            ZE_RESULT_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(wait32(nullptr, &eq, flag, 1, nullptr), ZE_RESULT_ERROR_INVALID_ARGUMENT);

  zeCommandListDestroy(list);
  zeCommandListDestroy(other);
  for (auto e : {released, copied, released64})
    zeEventDestroy(e);
  zeEventPoolDestroy(pool.pool);
  zeMemFree(ze().context, d);
  zeMemFree(ze().context, words);
}

TEST_F(ZeHostDriver, WriteToMemoryWritesEightBytes) {
  auto write = extension_function<WriteToMemoryFn>(ze(), "zexCommandListAppendWriteToMemory");
  ASSERT_NE(write, nullptr);
  auto* words = static_cast<uint64_t*>(host_alloc(ze(), 64));
  for (int i = 0; i < 8; ++i)
    words[i] = ~0ull;
  auto* d = static_cast<uint64_t*>(device_alloc(ze(), 64, dev(1)));
  auto list = make_list(ze(), dev(1), 1);
  Pool pool = make_pool(ze());
  auto done = make_event(pool);
  ZexWriteToMemDesc desc{kZexScopeHost};
  // A value that fits 32 bits still writes all 8 bytes (as compute-runtime's QWord post-sync).
  ASSERT_EQ(write(list, &desc, &words[1], 0x1234), ZE_RESULT_SUCCESS);
  ASSERT_EQ(write(list, &desc, d + 2, 0xfedcba9876543210ull), ZE_RESULT_SUCCESS);
  uint64_t back = 0;
  ASSERT_EQ(zeCommandListAppendMemoryCopy(list, &back, d + 2, 8, done, 0, nullptr),
            ZE_RESULT_SUCCESS);
  ASSERT_EQ(zeEventHostSynchronize(done, kFiveSeconds), ZE_RESULT_SUCCESS);
  EXPECT_EQ(words[1], 0x1234u);
  EXPECT_EQ(words[0], ~0ull);
  EXPECT_EQ(words[2], ~0ull);
  EXPECT_EQ(back, 0xfedcba9876543210ull);
  EXPECT_EQ(write(list, &desc, reinterpret_cast<uint8_t*>(words) + 4, 1),
            ZE_RESULT_ERROR_INVALID_ARGUMENT);
  zeCommandListDestroy(list);
  zeEventDestroy(done);
  zeEventPoolDestroy(pool.pool);
  zeMemFree(ze().context, d);
  zeMemFree(ze().context, words);
}

TEST_F(ZeHostDriver, GlobalTimestampsFollowTheHostClockAndIncrease) {
  auto list = make_list(ze(), dev(0));
  Pool pool = make_pool(ze());
  auto gate = make_event(pool);
  auto done = make_event(pool);
  auto* stamps = static_cast<uint64_t*>(device_alloc(ze(), 16, dev(0)));
  uint64_t back[2] = {};
  auto ns = [] {
    return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                     std::chrono::steady_clock::now().time_since_epoch())
                                     .count());
  };
  const uint64_t before = ns();
  ASSERT_EQ(zeCommandListAppendWriteGlobalTimestamp(list, stamps, nullptr, 0, nullptr),
            ZE_RESULT_SUCCESS);
  ASSERT_EQ(zeCommandListAppendWriteGlobalTimestamp(list, stamps + 1, nullptr, 1, &gate),
            ZE_RESULT_SUCCESS);
  ASSERT_EQ(zeCommandListAppendMemoryCopy(list, back, stamps, 16, done, 0, nullptr),
            ZE_RESULT_SUCCESS);
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  const uint64_t signaled = ns();  // the second stamp waits for the gate: it is taken after this
  ASSERT_EQ(zeEventHostSignal(gate), ZE_RESULT_SUCCESS);
  ASSERT_EQ(zeEventHostSynchronize(done, kFiveSeconds), ZE_RESULT_SUCCESS);
  const uint64_t after = ns();
  EXPECT_LE(before, back[0]);
  EXPECT_LE(back[0], back[1]);
  EXPECT_GE(back[1], signaled);
  EXPECT_LE(back[1], after);
  zeCommandListDestroy(list);
  zeEventDestroy(gate);
  zeEventDestroy(done);
  zeEventPoolDestroy(pool.pool);
  zeMemFree(ze().context, stamps);
}

TEST_F(ZeHostDriver, IpcHandleOpenedInAnotherProcessSeesTheBytes) {
  const size_t size = 5000;
  auto* d = static_cast<uint8_t*>(device_alloc(ze(), size + 8, dev(0)));
  std::vector<uint8_t> source(size);
  for (size_t i = 0; i < size; ++i)
    source[i] = pattern_byte(i);
  auto list = make_list(ze(), dev(0));
  Pool pool = make_pool(ze());
  auto done = make_event(pool);
  const uint64_t zero = 0;
  ASSERT_EQ(zeCommandListAppendMemoryCopy(list, d, source.data(), size, nullptr, 0, nullptr),
            ZE_RESULT_SUCCESS);
  ASSERT_EQ(zeCommandListAppendMemoryCopy(list, d + size, &zero, 8, done, 0, nullptr),
            ZE_RESULT_SUCCESS);
  ASSERT_EQ(zeEventHostSynchronize(done, kFiveSeconds), ZE_RESULT_SUCCESS);
  ze_ipc_mem_handle_t handle{};
  ASSERT_EQ(zeMemGetIpcHandle(ze().context, d, &handle), ZE_RESULT_SUCCESS);
  int status = run_child("ipc", {"HETMESH_ZE_TEST_IPC_HANDLE=" + to_hex(handle.data, 64),
                                 "HETMESH_ZE_TEST_IPC_SIZE=" + std::to_string(size)});
  ASSERT_TRUE(WIFEXITED(status)) << status;
  ASSERT_EQ(WEXITSTATUS(status), 0) << "the child's step that failed (see child_ipc)";
  // The child's write, after the parent's bytes, is visible here.
  uint64_t marker = 0;
  ASSERT_EQ(zeEventHostReset(done), ZE_RESULT_SUCCESS);
  ASSERT_EQ(zeCommandListAppendMemoryCopy(list, &marker, d + size, 8, done, 0, nullptr),
            ZE_RESULT_SUCCESS);
  ASSERT_EQ(zeEventHostSynchronize(done, kFiveSeconds), ZE_RESULT_SUCCESS);
  EXPECT_EQ(marker, 0x0123456789abcdefull);
  zeCommandListDestroy(list);
  zeEventDestroy(done);
  zeEventPoolDestroy(pool.pool);
  zeMemFree(ze().context, d);
}

TEST_F(ZeHostDriver, MalformedIpcHandlesAreRefused) {
  auto* d = static_cast<uint8_t*>(device_alloc(ze(), 4096, dev(0)));
  ze_ipc_mem_handle_t good{};
  ASSERT_EQ(zeMemGetIpcHandle(ze().context, d, &good), ZE_RESULT_SUCCESS);
  void* mapped = nullptr;
  auto refused = [&](ze_ipc_mem_handle_t h) {
    mapped = nullptr;
    return zeMemOpenIpcHandle(ze().context, dev(0), h, 0, &mapped) ==
               ZE_RESULT_ERROR_INVALID_ARGUMENT &&
           mapped == nullptr;
  };
  ze_ipc_mem_handle_t h{};
  EXPECT_TRUE(refused(h)) << "all zeros";
  for (int round = 0; round < 64; ++round) {
    for (auto& b : h.data)
      b = static_cast<char>(std::rand());
    EXPECT_TRUE(refused(h)) << "random bytes";
  }
  // Flip each byte of a good handle in turn (offsets: fd, version, magic, size, nonce, serial,
  // padding): every one must be caught.
  for (size_t i = 0; i < sizeof(h.data); ++i) {
    h = good;
    h.data[i] = static_cast<char>(h.data[i] ^ 0x40);
    EXPECT_TRUE(refused(h)) << "byte " << i;
  }
  // fd 0 of this process (not a memfd), same everything else.
  h = good;
  const int32_t stdin_fd = 0;
  std::memcpy(h.data, &stdin_fd, 4);
  EXPECT_TRUE(refused(h)) << "fd 0";
  // The good one opens (here, in the same process: a second view of the same memory).
  ASSERT_EQ(zeMemOpenIpcHandle(ze().context, dev(1), good, 0, &mapped), ZE_RESULT_SUCCESS);
  EXPECT_NE(mapped, d);
  EXPECT_EQ(zeMemFree(ze().context, mapped), ZE_RESULT_ERROR_INVALID_ARGUMENT);       // close it
  EXPECT_EQ(zeMemCloseIpcHandle(ze().context, d), ZE_RESULT_ERROR_INVALID_ARGUMENT);  // not opened
  EXPECT_EQ(zeMemCloseIpcHandle(ze().context, mapped), ZE_RESULT_SUCCESS);
  // Once freed, its handle no longer opens.
  ASSERT_EQ(zeMemFree(ze().context, d), ZE_RESULT_SUCCESS);
  EXPECT_TRUE(refused(good)) << "freed";
}

TEST_F(ZeHostDriver, InvalidHandlesAreRefusedNotDereferenced) {
  int junk[16] = {};
  auto* bogus_list = reinterpret_cast<ze_command_list_handle_t>(junk);
  auto* bogus_event = reinterpret_cast<ze_event_handle_t>(junk);
  auto* bogus_context = reinterpret_cast<ze_context_handle_t>(junk);
  auto* bogus_device = reinterpret_cast<ze_device_handle_t>(junk);
  uint32_t x = 0;
  EXPECT_EQ(zeCommandListAppendMemoryCopy(nullptr, &x, &x, 4, nullptr, 0, nullptr),
            ZE_RESULT_ERROR_INVALID_NULL_HANDLE);
  EXPECT_EQ(zeCommandListAppendMemoryCopy(bogus_list, &x, &x, 4, nullptr, 0, nullptr),
            ZE_RESULT_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(zeEventQueryStatus(bogus_event), ZE_RESULT_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(zeEventHostSynchronize(nullptr, 0), ZE_RESULT_ERROR_INVALID_NULL_HANDLE);
  EXPECT_EQ(zeCommandListDestroy(bogus_list), ZE_RESULT_ERROR_INVALID_ARGUMENT);
  ze_device_properties_t p{};
  p.stype = ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES;
  EXPECT_EQ(zeDeviceGetProperties(bogus_device, &p), ZE_RESULT_ERROR_INVALID_ARGUMENT);
  void* ptr = nullptr;
  ze_host_mem_alloc_desc_t desc{ZE_STRUCTURE_TYPE_HOST_MEM_ALLOC_DESC, nullptr, 0};
  EXPECT_EQ(zeMemAllocHost(bogus_context, &desc, 64, 0, &ptr), ZE_RESULT_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(zeMemFree(ze().context, junk), ZE_RESULT_ERROR_INVALID_ARGUMENT);
  auto list = make_list(ze(), dev(0));
  EXPECT_EQ(zeCommandListAppendSignalEvent(list, bogus_event), ZE_RESULT_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(zeCommandListAppendWaitOnEvents(list, 1, &bogus_event),
            ZE_RESULT_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(zeCommandListDestroy(list), ZE_RESULT_SUCCESS);
  EXPECT_EQ(zeCommandListDestroy(list), ZE_RESULT_ERROR_INVALID_ARGUMENT);  // already gone
}

}  // namespace
