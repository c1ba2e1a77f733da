// The RAII device wrappers (Device, Buffer, Stream, Event, IpcMapping, DmaBuf) on the reference
// plugins: cpu (host memory as a device) and asic_stub (a simulated accelerator whose device
// memory the host cannot touch).
//
// Buffers are declared before the streams that use them, so streams (which finish their queued
// work when destroyed) go first even when an assertion ends a test early.
#include "device_helpers.hpp"
#include "test_support.hpp"

#include <hetmesh/plugins/asic_stub.h>
#include <hetmesh/core/device.hpp>
#include <hetmesh/core/plugin.hpp>
#include <hetmesh/core/subprocess.hpp>
#include <hetmesh/plugin_kit/memfd.hpp>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace hetmesh {
namespace {

using namespace std::chrono_literals;
using test::plugin_path;
using test::ScopedEnv;
using ::testing::HasSubstr;
using namespace device_test;

void store_flag(void* word, uint32_t value) {
  std::atomic_ref<uint32_t>(*static_cast<uint32_t*>(word)).store(value, std::memory_order_release);
}

// A device of each reference plugin.
class DeviceTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    auto plugin = load(GetParam());
    ASSERT_NE(plugin, nullptr);
    device_.emplace(plugin, 0);
  }
  const Device& device() const { return *device_; }

  std::optional<Device> device_;
};

TEST_P(DeviceTest, PropertiesDescribeTheDevice) {
  const hm_device_properties& p = device().properties();
  EXPECT_GT(std::strlen(p.name), 0u);
  EXPECT_GT(p.total_memory, 0u);
  EXPECT_TRUE(device().has(HM_CAP_DEVICE_MEMORY | HM_CAP_PINNED_HOST_MEMORY | HM_CAP_STREAM_MEMOPS |
                           HM_CAP_HOST_CALLBACK | HM_CAP_EVENT_TIMING | HM_CAP_IPC));
  EXPECT_EQ(p.memory_alignment, kPage);
  EXPECT_EQ(device().has(HM_CAP_HOST_ADDRESSABLE_DEVICE_MEMORY), std::string(GetParam()) == "cpu");
  EXPECT_THAT(capability_names(p.capabilities), HasSubstr("stream_memops"));
}

TEST_P(DeviceTest, CopyRoundTripThroughPinnedMemory) {
  const uint64_t n = 3 * kPage + 123;
  Buffer dev = device().allocate(n);
  Buffer dev2 = device().allocate(n);
  Buffer in = device().allocate(n, MemoryKind::pinned_host);
  Buffer out = device().allocate(n, MemoryKind::pinned_host);
  std::vector<uint8_t> plain(n, 0);
  for (uint64_t i = 0; i < n; ++i)
    bytes(in)[i] = static_cast<uint8_t>(i * 7 + 3);
  std::memset(out.data(), 0, n);
  Stream s = device().create_stream();

  s.copy(dev.data(), in.data(), n);                   // pinned -> device
  s.copy(dev2.data(), dev.data(), n);                 // device -> device
  s.copy(out.data(), dev2.data(), n);                 // device -> pinned
  s.copy(plain.data(), bytes(dev) + 1000, n - 1000);  // device (inside) -> plain host memory
  s.synchronize();
  EXPECT_EQ(std::memcmp(out.data(), in.data(), n), 0);
  EXPECT_EQ(std::memcmp(plain.data(), bytes(in) + 1000, n - 1000), 0);
  EXPECT_TRUE(s.ready());
}

TEST_P(DeviceTest, CopyPastTheEndOfAnAllocationIsRejected) {
  Buffer dev = device().allocate(kPage);
  Buffer in = device().allocate(2 * kPage, MemoryKind::pinned_host);
  Stream s = device().create_stream();
  EXPECT_THAT(error_of([&] { s.copy(bytes(dev) + 8, in.data(), kPage); }, HM_ERR_INVALID_ARGUMENT),
              HasSubstr("memcpy_async"));
}

TEST_P(DeviceTest, FillSetsBytesInStreamOrder) {
  const uint64_t n = 2 * kPage + 5;
  Buffer dev = device().allocate(n);
  Buffer out = device().allocate(n, MemoryKind::pinned_host);
  std::memset(out.data(), 0, n);
  Stream s = device().create_stream();
  s.fill(dev.data(), 0xAB, n);
  s.fill(bytes(dev) + 10, 0x01, 5);
  s.copy(out.data(), dev.data(), n);
  s.synchronize();
  for (uint64_t i = 0; i < n; ++i)
    ASSERT_EQ(bytes(out)[i], (i >= 10 && i < 15) ? 0x01 : 0xAB) << "at byte " << i;
}

TEST_P(DeviceTest, PointerQueryFindsTheContainingAllocation) {
  const uint64_t n = 2 * kPage + 100;
  Buffer dev = device().allocate(n);
  Buffer pinned = device().allocate(kPage, MemoryKind::pinned_host);

  PointerInfo inside = device().query(bytes(dev) + 1234);
  EXPECT_EQ(inside.kind, HM_MEM_DEVICE);
  EXPECT_EQ(inside.device, 0);
  EXPECT_EQ(inside.base, dev.data());
  EXPECT_EQ(inside.size, n);
  EXPECT_EQ(device().query(bytes(dev) + n - 1).base, dev.data());
  EXPECT_NE(device().query(bytes(dev) + n).base, dev.data());  // one past the end

  PointerInfo host = device().query(bytes(pinned) + 7);
  EXPECT_EQ(host.kind, HM_MEM_PINNED_HOST);
  EXPECT_EQ(host.base, pinned.data());
  EXPECT_EQ(host.size, kPage);

  int on_stack = 0;
  PointerInfo unknown = device().query(&on_stack);
  EXPECT_EQ(unknown.kind, HM_MEM_UNKNOWN);
  EXPECT_EQ(unknown.device, -1);
  EXPECT_EQ(unknown.base, nullptr);
}

TEST_P(DeviceTest, BufferMovesAndFreesOnDestruction) {
  Buffer a = device().allocate(kPage);
  void* p = a.data();
  Buffer b = std::move(a);
  EXPECT_FALSE(a);
  ASSERT_TRUE(b);
  EXPECT_EQ(b.data(), p);
  EXPECT_EQ(b.size(), kPage);
  EXPECT_EQ(device().query(p).kind, HM_MEM_DEVICE);
  b = Buffer();  // move-assigning frees the old allocation
  EXPECT_FALSE(b);
  EXPECT_EQ(device().query(p).kind, HM_MEM_UNKNOWN);
}

TEST_P(DeviceTest, ZeroSizeAllocationIsRejected) {
  EXPECT_THAT(error_of([&] { device().allocate(0); }, HM_ERR_INVALID_ARGUMENT),
              HasSubstr("mem_alloc"));
}

// More than any machine has (1 PiB, beyond x86-64's address space): the error names the device,
// the size and the kind before the plugin's own words, device and pinned host memory alike.
TEST_P(DeviceTest, AFailedAllocationNamesTheDeviceTheSizeAndTheKind) {
  constexpr uint64_t kTooMuch = 1ull << 50;
  const std::string size = "1.0 PiB (1125899906842624 bytes)";
  const std::string prefix = device().selector() + ": cannot allocate " + size + " of ";
  std::string said = error_of([&] { device().allocate(kTooMuch); }, HM_ERR_OUT_OF_MEMORY);
  EXPECT_EQ(
      said.rfind(prefix + "device memory: " + device().plugin().name() + ": mem_alloc failed", 0),
      0u)
      << said;
  said = error_of([&] { HostBuffer(device(), kTooMuch); }, HM_ERR_OUT_OF_MEMORY);
  EXPECT_EQ(said.rfind(prefix + "pinned host memory: ", 0), 0u) << said;
  EXPECT_THAT(said, HasSubstr("mem_alloc failed (HM_ERR_OUT_OF_MEMORY): mem_alloc: "));
}

TEST_P(DeviceTest, FreeInsideAnAllocationIsRejected) {
  Buffer dev = device().allocate(2 * kPage);
  hm_status status = device().api().mem_free(bytes(dev) + 64);
  EXPECT_EQ(status, HM_ERR_INVALID_ARGUMENT);
  EXPECT_THAT(
      error_of([&] { device().plugin().check(status, "mem_free"); }, HM_ERR_INVALID_ARGUMENT),
      HasSubstr("is not the start of an allocation"));
  EXPECT_EQ(device().query(dev.data()).kind, HM_MEM_DEVICE);  // still allocated
}

TEST_P(DeviceTest, EventsRecordSynchronizeAndTime) {
  Buffer dev = device().allocate(kPage);
  Stream s = device().create_stream();
  Event start = device().create_event();
  Event end = device().create_event();
  EXPECT_TRUE(start.ready());  // never recorded counts as complete
  start.record(s);
  s.fill(dev.data(), 1, kPage);
  end.record(s);
  end.synchronize();
  EXPECT_TRUE(end.ready());
  EXPECT_TRUE(start.ready());
  start.synchronize(0ms);  // complete, so even a zero timeout succeeds
  EXPECT_GE(end.elapsed_ms_since(start), 0.0f);

  Event untimed = device().create_event(HM_EVENT_DISABLE_TIMING);
  untimed.record(s);
  untimed.synchronize();
  EXPECT_THAT(error_of([&] { untimed.elapsed_ms_since(start); }, HM_ERR_INVALID_ARGUMENT),
              HasSubstr("event_elapsed_ms"));
}

TEST_P(DeviceTest, StreamWaitEventOrdersTwoStreams) {
  const uint64_t n = kPage + 17;
  Buffer gate = device().allocate(kPage, MemoryKind::pinned_host);
  Buffer dev = device().allocate(n);
  Buffer out = device().allocate(n, MemoryKind::pinned_host);
  store_flag(gate.data(), 0);
  std::memset(out.data(), 0, n);
  Stream a = device().create_stream();
  Stream b = device().create_stream();
  Event filled = device().create_event();

  a.wait_value32(gate.data(), 1, HM_WAIT_EQ);  // holds stream a until the host opens the gate
  a.fill(dev.data(), 0x5A, n);
  filled.record(a);
  b.wait(filled);
  b.copy(out.data(), dev.data(), n);

  EXPECT_FALSE(filled.ready());
  EXPECT_FALSE(b.ready());
  EXPECT_THAT(error_of([&] { b.synchronize(10ms); }, HM_ERR_TIMEOUT), HasSubstr("still pending"));
  EXPECT_EQ(bytes(out)[0], 0);  // b's copy has not run

  store_flag(gate.data(), 1);
  b.synchronize();
  EXPECT_TRUE(filled.ready());
  for (uint64_t i = 0; i < n; ++i)
    ASSERT_EQ(bytes(out)[i], 0x5A) << "at byte " << i;
}

TEST_P(DeviceTest, WriteValue32ReleasesAWaitOnAnotherStream) {
  const uint64_t n = kPage;
  Buffer flag = device().allocate(kPage);  // a flag in device memory
  Buffer dev = device().allocate(n);
  Buffer out = device().allocate(n, MemoryKind::pinned_host);
  Buffer word = device().allocate(kPage, MemoryKind::pinned_host);
  std::memset(out.data(), 0, n);
  Stream a = device().create_stream();
  Stream b = device().create_stream();
  b.fill(flag.data(), 0, 4);
  b.synchronize();

  a.wait_value32(flag.data(), 7, HM_WAIT_GEQ);
  a.fill(dev.data(), 0x33, n);
  a.copy(out.data(), dev.data(), n);
  EXPECT_FALSE(a.ready());

  b.write_value32(flag.data(), 7);
  a.synchronize();
  for (uint64_t i = 0; i < n; ++i)
    ASSERT_EQ(bytes(out)[i], 0x33) << "at byte " << i;
  b.synchronize();
  b.copy(word.data(), flag.data(), 4);
  b.synchronize();
  EXPECT_EQ(*static_cast<uint32_t*>(word.data()), 7u);
}

TEST_P(DeviceTest, StreamMemopsRejectBadArguments) {
  Buffer flag = device().allocate(kPage, MemoryKind::pinned_host);
  Stream s = device().create_stream();
  EXPECT_THAT(error_of([&] { s.write_value32(bytes(flag) + 2, 1); }, HM_ERR_INVALID_ARGUMENT),
              HasSubstr("not 4-byte aligned"));
  EXPECT_THAT(error_of([&] { s.wait_value32(flag.data(), 1, static_cast<hm_wait_condition>(9)); },
                       HM_ERR_INVALID_ARGUMENT),
              HasSubstr("unknown wait condition 9"));
}

struct CallbackRecord {
  const uint8_t* watched = nullptr;
  std::atomic<int> calls{0};
  uint8_t seen = 0;
};

TEST_P(DeviceTest, CallbackRunsAfterPriorWork) {
  Buffer dev = device().allocate(kPage);
  Buffer out = device().allocate(kPage, MemoryKind::pinned_host);
  std::memset(out.data(), 0, kPage);
  CallbackRecord record;
  record.watched = bytes(out) + kPage - 1;
  Stream s = device().create_stream();
  s.fill(dev.data(), 0x42, kPage);
  s.copy(out.data(), dev.data(), kPage);
  s.add_callback(
      [](void* user_data) {
        auto* r = static_cast<CallbackRecord*>(user_data);
        r->seen = *r->watched;
        r->calls.fetch_add(1);
      },
      &record);
  s.synchronize();
  EXPECT_EQ(record.calls.load(), 1);
  EXPECT_EQ(record.seen, 0x42);
}

TEST_P(DeviceTest, SynchronizeTimesOutUntilTheHostWritesTheFlag) {
  Buffer flag = device().allocate(kPage, MemoryKind::pinned_host);
  store_flag(flag.data(), 0);
  Stream s = device().create_stream();
  Event after = device().create_event();
  s.wait_value32(flag.data(), 1, HM_WAIT_EQ);  // nobody writes the flag yet
  after.record(s);

  EXPECT_THAT(error_of([&] { s.synchronize(10ms); }, HM_ERR_TIMEOUT),
              HasSubstr("stream_synchronize"));
  EXPECT_THAT(error_of([&] { after.synchronize(10ms); }, HM_ERR_TIMEOUT),
              HasSubstr("event_synchronize"));
  EXPECT_FALSE(s.ready());
  EXPECT_FALSE(after.ready());

  store_flag(flag.data(), 1);  // the host writes the flag through pinned memory
  s.synchronize();
  EXPECT_TRUE(s.ready());
  EXPECT_TRUE(after.ready());
}

TEST_P(DeviceTest, IpcMappingSharesTheAllocation) {
  const uint64_t n = 2 * kPage;
  Buffer dev = device().allocate(n);
  Buffer in = device().allocate(n, MemoryKind::pinned_host);
  Buffer out = device().allocate(n, MemoryKind::pinned_host);
  for (uint64_t i = 0; i < n; ++i)
    bytes(in)[i] = static_cast<uint8_t>(i ^ 0x5C);
  std::memset(out.data(), 0, n);

  hm_ipc_handle handle = ipc_export(device(), bytes(dev) + 100);  // any address inside works
  IpcMapping mapping(device(), handle);
  ASSERT_TRUE(mapping);
  EXPECT_NE(mapping.data(), dev.data());
  PointerInfo info = device().query(mapping.data());
  EXPECT_EQ(info.kind, HM_MEM_IPC_MAPPED);
  EXPECT_EQ(info.base, mapping.data());
  EXPECT_EQ(info.size, n);

  {
    Stream s = device().create_stream();
    s.copy(dev.data(), in.data(), n);
    s.copy(out.data(), mapping.data(), n);  // the same pages, seen through the mapping
    s.synchronize();
  }
  EXPECT_EQ(std::memcmp(out.data(), in.data(), n), 0);

  void* mapped = mapping.data();
  mapping.reset();
  EXPECT_EQ(device().query(mapped).kind, HM_MEM_UNKNOWN);
}

// A handle is a peer's bytes: ipc_open maps only a memfd that the kit exported from the process
// the handle names, of the size it names. A regular file, a FIFO (which must not hang it) and
// another program's memfd are refused by name, and the real handle still opens.
TEST_P(DeviceTest, IpcOpenRefusesWhatTheKitDidNotExport) {
  Buffer dev = device().allocate(2 * kPage);
  hm_ipc_handle real = ipc_export(device(), dev.data());
  auto forged = [&](int fd, uint64_t size) {
    hm::kit::MemfdHandle h;
    std::memcpy(&h, real.bytes, sizeof h);
    h.fd = fd;
    h.size = size;
    return hm::kit::encode_handle(h);
  };
  auto refusal = [&](const hm_ipc_handle& handle) -> std::string {
    try {
      IpcMapping opened(device(), handle);
      return "opened";
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), HM_ERR_INVALID_ARGUMENT) << e.what();
      return e.what();
    }
  };
  test::TempDir folder;
  int file = open(folder.file("plain").c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0600);
  ASSERT_EQ(ftruncate(file, 2 * kPage), 0);
  ASSERT_EQ(mkfifo(folder.file("fifo").c_str(), 0600), 0);
  int fifo = open(folder.file("fifo").c_str(), O_RDWR | O_NONBLOCK | O_CLOEXEC);
  int other = memfd_create("someone-else", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_EQ(ftruncate(other, 2 * kPage), 0);
  for (int fd : {file, fifo, other})
    EXPECT_THAT(refusal(forged(fd, 2 * kPage)), HasSubstr("not to memory the kit exported"));
  hm::kit::MemfdHandle h;
  std::memcpy(&h, real.bytes, sizeof h);
  EXPECT_THAT(refusal(forged(h.fd, 3 * kPage)), HasSubstr("its size is not the size the handle"));
  EXPECT_THAT(refusal(forged(h.fd, kPage)), HasSubstr("its size is not the size the handle"));
  for (int fd : {file, fifo, other})
    close(fd);
  IpcMapping mapping(device(), real);
  EXPECT_TRUE(mapping);
}

TEST_P(DeviceTest, DmaBufNeedsUdmabuf) {
  if (std::filesystem::exists("/dev/udmabuf")) GTEST_SKIP() << "/dev/udmabuf exists";
  EXPECT_FALSE(device().has(HM_CAP_DMABUF_EXPORT));
  Buffer dev = device().allocate(kPage);
  EXPECT_THAT(error_of([&] { DmaBuf dmabuf(device(), dev.data(), kPage); }, HM_ERR_NOT_SUPPORTED),
              HasSubstr("/dev/udmabuf"));
}

INSTANTIATE_TEST_SUITE_P(ReferencePlugins, DeviceTest, ::testing::Values("cpu", "asic_stub"),
                         [](const auto& test) { return std::string(test.param); });

}  // namespace
}  // namespace hetmesh
