// Properties, argument checking and memory: allocation, pointer queries, copies and fills.
#include "cts.hpp"

#include <hetmesh/core/subprocess.hpp>

#include <unistd.h>

#include <cstring>
#include <functional>
#include <thread>
#include <utility>

namespace hetmesh::cts {
namespace {

constexpr hm_capabilities kKnownCapabilities = (HM_CAP_PEER_COPY << 1) - 1;

TEST_P(DeviceTest, PropertiesAreComplete) {
  HM_RULE("HM-R15");
  const hm_device_properties& p = device().properties();
  EXPECT_GT(std::strlen(p.name), 0u) << "name is empty";
  EXPECT_GT(std::strlen(p.vendor), 0u) << "vendor is empty";
  EXPECT_TRUE(p.dlpack_device_type == HM_DLPACK_CPU || p.dlpack_device_type == HM_DLPACK_CUDA ||
              p.dlpack_device_type == HM_DLPACK_ROCM || p.dlpack_device_type == HM_DLPACK_EXT_DEV ||
              p.dlpack_device_type == HM_DLPACK_ONEAPI ||
              p.dlpack_device_type == HM_DLPACK_CUDA_HOST ||
              p.dlpack_device_type == HM_DLPACK_ROCM_HOST)
      << "unknown DLPack device type " << p.dlpack_device_type;
  EXPECT_GE(p.numa_node, -1);
  EXPECT_NE(p.memory_alignment, 0u);
  EXPECT_EQ(p.memory_alignment & (p.memory_alignment - 1), 0u) << "alignment is not a power of 2";
  EXPECT_EQ(p.capabilities & ~kKnownCapabilities, 0u) << "capability bits this ABI does not define";
  if (p.pci_bus_id[0] != '\0') {
    unsigned domain, bus, dev, fn;
    EXPECT_EQ(std::sscanf(p.pci_bus_id, "%x:%x:%x.%x", &domain, &bus, &dev, &fn), 4)
        << "pci_bus_id '" << p.pci_bus_id << "' is not DDDD:BB:DD.F";
  }
}

TEST_P(DeviceTest, RejectsTooSmallStructSize) {
  HM_RULE("HM-R6");
  hm_device_properties props{};
  props.struct_size = sizeof(size_t);
  HM_EXPECT_STATUS(device(), HM_ERR_INVALID_ARGUMENT, api().device_properties(index(), &props));
  HM_RULE("HM-R11");
  EXPECT_STRNE(api().last_error(), "") << "a failure must leave a last_error message";
  HM_RULE("HM-R6");
  hm_pointer_info info{};
  info.struct_size = sizeof(size_t);
  HM_EXPECT_STATUS(device(), HM_ERR_INVALID_ARGUMENT, api().pointer_query(&info, &info));
}

TEST_P(DeviceTest, AcceptsLargerStructSize) {
  HM_RULE("HM-R6");
  // A newer host passes bigger structs; the plugin must fill what it knows and accept the rest.
  struct {
    hm_device_properties props;
    char future[64];
  } bigger{};
  bigger.props.struct_size = sizeof bigger;
  HM_EXPECT_STATUS(device(), HM_OK, api().device_properties(index(), &bigger.props));
  EXPECT_STREQ(bigger.props.name, device().properties().name);
}

// Every slot that takes a device index refuses the count itself (what an off-by-one `device >
// count` lets through) and a negative index. (ipc_open's are checked with a real handle in
// IpcSlotsRejectBadArguments.)
TEST_P(DeviceTest, RejectsInvalidDeviceIndex) {
  HM_RULE("HM-R12");
  const int32_t count = device().plugin().device_count();
  for (int32_t bad : {count, -1}) {
    SCOPED_TRACE("device index " + std::to_string(bad) + " of " + std::to_string(count) +
                 " devices");
    hm_device_properties props{};
    props.struct_size = sizeof props;
    HM_EXPECT_STATUS(device(), HM_ERR_INVALID_ARGUMENT, api().device_properties(bad, &props));
    for (int32_t kind : {HM_MEM_DEVICE, HM_MEM_PINNED_HOST}) {
      void* ptr = nullptr;
      HM_EXPECT_STATUS(device(), HM_ERR_INVALID_ARGUMENT, api().mem_alloc(bad, 64, kind, &ptr));
      if (ptr != nullptr) api().mem_free(ptr);
    }
    hm_stream stream = nullptr;
    HM_EXPECT_STATUS(device(), HM_ERR_INVALID_ARGUMENT, api().stream_create(bad, 0, &stream));
    if (stream != nullptr) api().stream_destroy(stream);
    hm_event event = nullptr;
    HM_EXPECT_STATUS(device(), HM_ERR_INVALID_ARGUMENT, api().event_create(bad, 0, &event));
    if (event != nullptr) api().event_destroy(event);
  }
}

TEST_P(DeviceTest, DeviceMemoryAllocFree) {
  HM_RULE("HM-R21");
  HM_REQUIRE(HM_CAP_DEVICE_MEMORY, "device memory");
  for (uint64_t size : {1ull, 4096ull, 3ull << 20}) {
    void* ptr = nullptr;
    HM_ASSERT_OK(device(), api().mem_alloc(index(), size, HM_MEM_DEVICE, &ptr));
    ASSERT_NE(ptr, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(ptr) % device().properties().memory_alignment, 0u);
    HM_EXPECT_STATUS(device(), HM_OK, api().mem_free(ptr));
  }
}

TEST_P(DeviceTest, DeviceMemoryNotSupportedWithoutCapability) {
  HM_RULE("HM-R17");
  if (has(HM_CAP_DEVICE_MEMORY)) GTEST_SKIP() << "device has device memory";
  void* ptr = nullptr;
  HM_EXPECT_STATUS(device(), HM_ERR_NOT_SUPPORTED,
                   api().mem_alloc(index(), 64, HM_MEM_DEVICE, &ptr));
}

TEST_P(DeviceTest, PinnedMemoryIsHostAccessible) {
  HM_RULE("HM-R22");
  HM_REQUIRE(HM_CAP_PINNED_HOST_MEMORY, "pinned host memory");
  void* ptr = nullptr;
  HM_ASSERT_OK(device(), api().mem_alloc(index(), 8192, HM_MEM_PINNED_HOST, &ptr));
  std::memset(ptr, 0x5a, 8192);  // must not crash
  EXPECT_EQ(static_cast<uint8_t*>(ptr)[8191], 0x5a);
  HM_EXPECT_STATUS(device(), HM_OK, api().mem_free(ptr));
}

TEST_P(DeviceTest, PinnedMemoryNotSupportedWithoutCapability) {
  HM_RULE("HM-R17");
  if (has(HM_CAP_PINNED_HOST_MEMORY)) GTEST_SKIP() << "device has pinned memory";
  void* ptr = nullptr;
  HM_EXPECT_STATUS(device(), HM_ERR_NOT_SUPPORTED,
                   api().mem_alloc(index(), 64, HM_MEM_PINNED_HOST, &ptr));
}

TEST_P(DeviceTest, AllocRejectsBadArguments) {
  HM_RULE("HM-R12");
  void* ptr = nullptr;
  HM_EXPECT_STATUS(device(), HM_ERR_INVALID_ARGUMENT,
                   api().mem_alloc(index(), 0, HM_MEM_DEVICE, &ptr));
  HM_EXPECT_STATUS(device(), HM_ERR_INVALID_ARGUMENT, api().mem_alloc(index(), 64, 77, &ptr));
  HM_EXPECT_STATUS(device(), HM_ERR_INVALID_ARGUMENT,
                   api().mem_alloc(index(), 64, HM_MEM_DEVICE, nullptr));
}

TEST_P(DeviceTest, AllocBeyondCapacityIsOutOfMemory) {
  HM_RULE("HM-R21");
  HM_REQUIRE(HM_CAP_DEVICE_MEMORY, "device memory");
  uint64_t total = device().properties().total_memory;
  if (total == 0) GTEST_SKIP() << "device reports no memory size";
  void* ptr = nullptr;
  HM_EXPECT_STATUS(device(), HM_ERR_OUT_OF_MEMORY,
                   api().mem_alloc(index(), total * 2, HM_MEM_DEVICE, &ptr));
}

TEST_P(DeviceTest, FreeRejectsInteriorPointerAndAcceptsNull) {
  HM_RULE("HM-R23");
  HM_REQUIRE(HM_CAP_DEVICE_MEMORY, "device memory");
  Buffer buffer = device().allocate(4096);
  HM_EXPECT_STATUS(device(), HM_ERR_INVALID_ARGUMENT,
                   api().mem_free(static_cast<char*>(buffer.data()) + 64));
  HM_EXPECT_STATUS(device(), HM_OK, api().mem_free(nullptr));
}

TEST_P(DeviceTest, PointerQueryFindsInteriorPointers) {
  HM_RULE("HM-R24");
  for (MemoryKind kind : {MemoryKind::device, MemoryKind::pinned_host}) {
    hm_capabilities cap =
        kind == MemoryKind::device ? HM_CAP_DEVICE_MEMORY : HM_CAP_PINNED_HOST_MEMORY;
    if (!has(cap)) continue;
    const uint64_t size = 3 * 4096 + 100;
    Buffer buffer = device().allocate(size, kind);
    auto* base = static_cast<char*>(buffer.data());
    for (uint64_t offset : {uint64_t{0}, uint64_t{1}, size / 2, size - 1}) {
      hm_pointer_info info{};
      info.struct_size = sizeof info;
      HM_ASSERT_OK(device(), api().pointer_query(base + offset, &info));
      EXPECT_EQ(info.kind, static_cast<int32_t>(kind)) << "offset " << offset;
      EXPECT_EQ(info.device, index()) << "offset " << offset;
      EXPECT_EQ(info.base, base) << "offset " << offset;
      EXPECT_EQ(info.size, size) << "offset " << offset;
    }
  }
}

TEST_P(DeviceTest, PointerQueryOfForeignMemoryIsUnknown) {
  HM_RULE("HM-R24");
  std::vector<uint8_t> heap(256);
  int on_stack = 0;
  for (const void* ptr :
       {static_cast<const void*>(heap.data()), static_cast<const void*>(&on_stack)}) {
    hm_pointer_info info{};
    info.struct_size = sizeof info;
    HM_ASSERT_OK(device(), api().pointer_query(ptr, &info));
    EXPECT_EQ(info.kind, HM_MEM_UNKNOWN);
    EXPECT_EQ(info.device, -1);
  }
}

// Plain heap memory is not this plugin's: every slot that needs memory of the plugin refuses it as
// an invalid argument (not as an invalid handle, which is for streams and events).
TEST_P(DeviceTest, ForeignPointersAreInvalidArguments) {
  HM_RULE("HM-R12");
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  std::vector<uint8_t> heap(3 * page);
  auto* foreign = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(heap.data()) + page - 1) /
                                             page * page);  // page-aligned
  HM_EXPECT_STATUS(device(), HM_ERR_INVALID_ARGUMENT, api().mem_free(foreign));
  // A NULL slot under a set bit fails its own gated test; here only the answers count.
  if (has(HM_CAP_HOST_REGISTER) && api().host_unregister)
    HM_EXPECT_STATUS(device(), HM_ERR_INVALID_ARGUMENT, api().host_unregister(foreign));
  if (has(HM_CAP_IPC) && api().ipc_export) {
    hm_ipc_handle handle{};
    HM_EXPECT_STATUS(device(), HM_ERR_INVALID_ARGUMENT, api().ipc_export(foreign, &handle));
  }
  if (has(HM_CAP_IPC) && api().ipc_close)
    HM_EXPECT_STATUS(device(), HM_ERR_INVALID_ARGUMENT, api().ipc_close(foreign));
  if (has(HM_CAP_DMABUF_EXPORT) && api().dmabuf_export) {
    hm_dmabuf dmabuf{};
    dmabuf.struct_size = sizeof dmabuf;
    HM_EXPECT_STATUS(device(), HM_ERR_INVALID_ARGUMENT,
                     api().dmabuf_export(foreign, page, &dmabuf));
  }
  if (has(HM_CAP_STREAM_MEMOPS) && api().stream_write_value32 && api().stream_wait_value32) {
    Stream stream = device().create_stream();
    HM_EXPECT_STATUS(device(), HM_ERR_INVALID_ARGUMENT,
                     api().stream_write_value32(stream.native(), foreign, 1, 0));
    HM_EXPECT_STATUS(device(), HM_ERR_INVALID_ARGUMENT,
                     api().stream_wait_value32(stream.native(), foreign, 0, HM_WAIT_GEQ, 0));
    stream.synchronize();
  }
}

// Copies host -> device -> device -> host with odd sizes and offsets and checks every byte.
TEST_P(DeviceTest, CopyRoundTripsAtOddSizesAndOffsets) {
  HM_RULE("HM-R25");
  HM_REQUIRE(HM_CAP_DEVICE_MEMORY, "device memory");
  Stream stream = device().create_stream();
  for (uint64_t size : {uint64_t{1}, uint64_t{3}, uint64_t{4096 + 7}, uint64_t{(1 << 20) + 13}}) {
    const uint64_t offset = 5;
    Buffer first = device().allocate(size + 2 * offset);
    Buffer second = device().allocate(size + 2 * offset);
    auto* source = static_cast<uint8_t*>(host_buffer(size));
    auto* result = static_cast<uint8_t*>(host_buffer(size + offset));
    fill_pattern(source, size, static_cast<uint32_t>(size));
    std::memset(result, 0, size + offset);
    auto* d1 = static_cast<uint8_t*>(first.data()) + offset;
    auto* d2 = static_cast<uint8_t*>(second.data()) + 2 * offset - 1;
    HM_ASSERT_OK(device(), api().memcpy_async(stream.native(), d1, source, size));
    HM_ASSERT_OK(device(), api().memcpy_async(stream.native(), d2, d1, size));
    HM_ASSERT_OK(device(), api().memcpy_async(stream.native(), result + offset, d2, size));
    HM_ASSERT_OK(device(), api().stream_synchronize(stream.native(), HM_TIMEOUT_INFINITE));
    EXPECT_EQ(find_mismatch(result + offset, size, static_cast<uint32_t>(size)), -1)
        << "size " << size;
    for (uint64_t i = 0; i < offset; ++i)
      EXPECT_EQ(result[i], 0) << "copy wrote before dst";
  }
}

TEST_P(DeviceTest, CopyOfZeroBytesIsANoOp) {
  HM_RULE("HM-R25");
  Stream stream = device().create_stream();
  uint8_t a = 1, b = 2;
  HM_EXPECT_STATUS(device(), HM_OK, api().memcpy_async(stream.native(), &a, &b, 0));
  HM_EXPECT_STATUS(device(), HM_OK, api().memset_async(stream.native(), &a, 9, 0));
  stream.synchronize();
  EXPECT_EQ(a, 1);
}

TEST_P(DeviceTest, FillSetsExactlyTheRange) {
  HM_RULE("HM-R25");
  HM_REQUIRE(HM_CAP_DEVICE_MEMORY, "device memory");
  Stream stream = device().create_stream();
  const uint64_t size = 10000;
  Buffer buffer = device().allocate(size);
  auto* host = static_cast<uint8_t*>(host_buffer(size));
  stream.fill(buffer.data(), 0x11, size);
  HM_ASSERT_OK(device(), api().memset_async(stream.native(), static_cast<char*>(buffer.data()) + 3,
                                            0x1ab, size - 6));  // only the low byte counts
  stream.copy(host, buffer.data(), size);
  stream.synchronize();
  for (uint64_t i = 0; i < size; ++i) {
    uint8_t want = (i < 3 || i >= size - 3) ? 0x11 : 0xab;
    ASSERT_EQ(host[i], want) << "byte " << i;
  }
}

TEST_P(DeviceTest, HostAddressableDeviceMemoryIsReadableByTheHost) {
  HM_RULE("HM-R18");
  HM_REQUIRE(HM_CAP_DEVICE_MEMORY | HM_CAP_HOST_ADDRESSABLE_DEVICE_MEMORY, "host access");
  Stream stream = device().create_stream();
  Buffer buffer = device().allocate(4096);
  stream.fill(buffer.data(), 0x77, 4096);
  stream.synchronize();
  EXPECT_EQ(static_cast<volatile uint8_t*>(buffer.data())[4095], 0x77);
  static_cast<uint8_t*>(buffer.data())[0] = 0x12;
  auto* host = static_cast<uint8_t*>(host_buffer(1));
  stream.copy(host, buffer.data(), 1);
  stream.synchronize();
  EXPECT_EQ(host[0], 0x12);
}

TEST_P(DeviceTest, HostRegisterMakesMemoryKnown) {
  HM_RULE("HM-R16");
  HM_REQUIRE(HM_CAP_HOST_REGISTER, "host_register");
  ASSERT_NE(api().host_register, nullptr) << "capability set but slot is NULL";
  HM_RULE("HM-R26");
  std::vector<uint8_t> memory(1 << 16);
  HM_ASSERT_OK(device(), api().host_register(memory.data(), memory.size()));
  hm_pointer_info info{};
  info.struct_size = sizeof info;
  HM_EXPECT_STATUS(device(), HM_OK, api().pointer_query(memory.data() + 100, &info));
  EXPECT_EQ(info.kind, HM_MEM_REGISTERED_HOST);
  HM_EXPECT_STATUS(device(), HM_OK, api().host_unregister(memory.data()));
}

TEST_P(DeviceTest, HostRegisterNotSupportedWithoutCapability) {
  HM_RULE("HM-R17");
  if (has(HM_CAP_HOST_REGISTER)) GTEST_SKIP() << "device can register host memory";
  if (api().host_register == nullptr)
    SUCCEED() << "slot is NULL";
  else {
    std::vector<uint8_t> memory(4096);
    HM_EXPECT_STATUS(device(), HM_ERR_NOT_SUPPORTED,
                     api().host_register(memory.data(), memory.size()));
  }
}

TEST_P(DeviceTest, UnknownExtensionIsNotSupported) {
  HM_RULE("HM-R41");
  if (api().get_extension == nullptr) GTEST_SKIP() << "plugin has no extensions";
  const void* table = nullptr;
  HM_EXPECT_STATUS(device(), HM_ERR_NOT_SUPPORTED,
                   api().get_extension("hm.cts.no_such_extension", 1, &table));
}

// The tables of named extensions a plugin answers: each begins with a header of its version, is
// the same table every time, and is refused for a version above its own.
TEST_P(DeviceTest, NamedExtensionsHonourTheirVersion) {
  HM_RULE("HM-R41");
  if (api().get_extension == nullptr) GTEST_SKIP() << "plugin has no extensions";
  const void* table = nullptr;
  HM_EXPECT_STATUS(device(), HM_ERR_INVALID_ARGUMENT, api().get_extension(nullptr, 1, &table));
  int answered = 0;
  for (const std::string& name : env().extensions) {
    HM_EXPECT_STATUS(device(), HM_ERR_INVALID_ARGUMENT,
                     api().get_extension(name.c_str(), 1, nullptr));
    if (api().get_extension(name.c_str(), 1, &table) != HM_OK) continue;
    ++answered;
    ASSERT_NE(table, nullptr) << name << ": HM_OK with no table";
    const auto* header = static_cast<const hm_extension_header*>(table);
    EXPECT_GE(header->struct_size, sizeof(hm_extension_header)) << name;
    EXPECT_GE(header->version, 1u) << name;
    const void* again = nullptr;
    HM_EXPECT_STATUS(device(), HM_OK, api().get_extension(name.c_str(), header->version, &again));
    EXPECT_EQ(again, table) << name << ": another table the second time";
    EXPECT_EQ(api().get_extension(name.c_str(), header->version + 1, &again), HM_ERR_NOT_SUPPORTED)
        << name << " v" << header->version << " answered a request for v" << header->version + 1;
  }
  if (answered == 0) SUCCEED() << "the plugin answers none of the names the kit knows";
}

// The entry point starts no thread and answers the same table each time, checked in a fresh
// process so nothing the kit did counts (a driver started there would be a thread here).
TEST_P(DeviceTest, EntryPointStartsNoThreadAndIsIdempotent) {
  HM_RULE("HM-R2");
  if (index() != 0) GTEST_SKIP() << "checked once per plugin, on its device 0";
  ProcessResult r = run_process({env().self, "--cts-entry-probe", device().plugin().path()},
                                std::chrono::seconds(60));
  ASSERT_FALSE(r.timed_out) << "the entry point hung";
  EXPECT_EQ(r.exit_code, 0) << "hm_device_plugin_v1 (" << r.describe() << "): " << r.out << r.err;
}

// initialize() runs once per process, so a fresh one, the loader's probe, offers the option.
TEST_P(DeviceTest, UnknownOptionFailsInitialize) {
  HM_RULE("HM-R8");
  if (index() != 0) GTEST_SKIP() << "checked once per plugin, on its device 0";
  const std::string key = "hm_cts_no_such_option";
  ProcessResult r = run_process({plugin_probe_path(), device().plugin().path(), key + "=1"},
                                std::chrono::seconds(60));
  ASSERT_FALSE(r.timed_out) << "the probe hung";
  EXPECT_EQ(r.exit_code, 1) << "initialize accepted the unknown option " << key << " ("
                            << r.describe() << "): " << r.out << r.err;
  EXPECT_NE(r.out.find("HM_ERR_INVALID_ARGUMENT"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(key), std::string::npos) << "the refusal does not name the key: " << r.out;
}

// Several threads allocate, touch and free concurrently; every pointer stays distinct and
// queryable, and nothing fails.
TEST_P(DeviceTest, AllocFreeStormFromManyThreads) {
  HM_RULE("HM-R19");
  HM_REQUIRE(HM_CAP_DEVICE_MEMORY, "device memory");
  constexpr int kThreads = 8, kRounds = 40, kLive = 6;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      try {
        Stream stream = device().create_stream();
        for (int round = 0; round < kRounds; ++round) {
          std::vector<Buffer> live;
          for (int i = 0; i < kLive; ++i) {
            uint64_t size =
                1 + static_cast<uint64_t>((t * 7919 + round * 104729 + i * 31) % 200000);
            live.push_back(device().allocate(size, i % 2 == 0 || !has(HM_CAP_PINNED_HOST_MEMORY)
                                                       ? MemoryKind::device
                                                       : MemoryKind::pinned_host));
            stream.fill(live.back().data(), static_cast<uint8_t>(t), size);
            PointerInfo info = device().query(static_cast<char*>(live.back().data()) + size - 1);
            if (info.base != live.back().data() || info.size != size) ++failures;
          }
          stream.synchronize();
        }
      } catch (const std::exception& e) {
        ADD_FAILURE() << "thread " << t << ": " << e.what();
        ++failures;
      }
    });
  }
  for (auto& thread : threads)
    thread.join();
  EXPECT_EQ(failures.load(), 0);
}

GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(DeviceTest);
INSTANTIATE_TEST_SUITE_P(Device, DeviceTest, testing::ValuesIn(device_params()), param_name);

// A copy into device memory touches exactly its range: the bytes on both sides of the destination
// keep what they held (the kit used to check only the range it asked for).
TEST_P(DeviceTest, CopyLeavesTheBytesAroundTheDestinationAlone) {
  HM_RULE("HM-R25");
  HM_REQUIRE(HM_CAP_DEVICE_MEMORY, "device memory");
  Stream stream = device().create_stream();
  for (uint64_t size : {uint64_t{1}, uint64_t{63}, uint64_t{4096 + 5}, uint64_t{(1 << 20) + 3}}) {
    const uint64_t guard = 64;
    Buffer buffer = device().allocate(size + 2 * guard);
    auto* source = static_cast<uint8_t*>(host_buffer(size));
    auto* result = static_cast<uint8_t*>(host_buffer(size + 2 * guard));
    fill_pattern(source, size, static_cast<uint32_t>(size));
    stream.fill(buffer.data(), 0xa5, size + 2 * guard);
    HM_ASSERT_OK(device(),
                 api().memcpy_async(stream.native(), static_cast<uint8_t*>(buffer.data()) + guard,
                                    source, size));
    stream.copy(result, buffer.data(), size + 2 * guard);
    stream.synchronize();
    for (uint64_t i = 0; i < guard; ++i) {
      ASSERT_EQ(result[i], 0xa5) << "size " << size << ": the copy wrote " << guard - i
                                 << " byte(s) before its destination";
      ASSERT_EQ(result[guard + size + i], 0xa5)
          << "size " << size << ": the copy wrote " << i + 1 << " byte(s) past its destination";
    }
    EXPECT_EQ(find_mismatch(result + guard, size, static_cast<uint32_t>(size)), -1) << size;
  }
}

// Each failure's message names the call that failed, so it is this failure's and not an earlier
// one's (a plugin that keeps the first message of a thread says nothing about the later ones).
TEST_P(DeviceTest, LastErrorNamesTheFailingCall) {
  HM_RULE("HM-R11");
  int local = 0;
  hm_device_properties props{};
  props.struct_size = sizeof props;
  hm_stream stream = nullptr;
  const int32_t count = device().plugin().device_count();
  const std::pair<const char*, std::function<hm_status()>> failures[] = {
      {"mem_free", [&] { return api().mem_free(&local); }},
      {"device_properties", [&] { return api().device_properties(-1, &props); }},
      {"stream_create", [&] { return api().stream_create(count, 0, &stream); }},
      {"event_create", [&] { return api().event_create(index(), 0, nullptr); }},
  };
  for (const auto& [slot, call] : failures) {
    ASSERT_NE(call(), HM_OK) << slot << " accepted a bad argument";
    const std::string message = api().last_error();
    EXPECT_NE(message.find(slot), std::string::npos)
        << "after " << slot << " failed, last_error says '" << message << "'";
  }
}

// last_error belongs to the calling thread: a failure on one thread does not overwrite what
// another thread's failure said.
TEST_P(DeviceTest, LastErrorIsPerThread) {
  HM_RULE("HM-R11");
  int local = 0;
  ASSERT_NE(api().mem_free(&local), HM_OK) << "freeing a stack address was accepted";
  const std::string mine = api().last_error();
  std::string theirs;
  std::thread other([&] {
    void* out = nullptr;
    EXPECT_NE(api().mem_alloc(index() + 1000, 64, HM_MEM_DEVICE, &out), HM_OK);
    theirs = api().last_error();
  });
  other.join();
  EXPECT_NE(theirs, mine) << "both threads' failures read the same last_error";
  EXPECT_EQ(std::string(api().last_error()), mine)
      << "another thread's failure replaced this one's";
}

}  // namespace
}  // namespace hetmesh::cts
