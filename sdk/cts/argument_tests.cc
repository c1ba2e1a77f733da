// Every slot's "Returns:" list for bad arguments, slot by slot (the header's HM-R12 and HM-R13): a
// NULL out-parameter or pointer, a range past its allocation, unknown flags or conditions, a NULL
// handle. A plugin that answered HM_OK here would write through NULL or act on garbage later.
#include "cts.hpp"

#include <unistd.h>

#include <cstring>

namespace hetmesh::cts {
namespace {

TEST_P(DeviceTest, DeviceAndMemorySlotsRejectBadArguments) {
  HM_RULE("HM-R12");
  HM_EXPECT_STATUS(device(), HM_ERR_INVALID_ARGUMENT, api().device_count(nullptr));
  HM_EXPECT_STATUS(device(), HM_ERR_INVALID_ARGUMENT, api().device_properties(index(), nullptr));
  int local = 0;
  HM_EXPECT_STATUS(device(), HM_ERR_INVALID_ARGUMENT, api().pointer_query(&local, nullptr));
  Stream stream = device().create_stream();
  auto* host = static_cast<uint8_t*>(host_buffer(4096));
  HM_EXPECT_STATUS(device(), HM_ERR_INVALID_ARGUMENT,
                   api().memcpy_async(stream.native(), nullptr, host, 16));
  HM_EXPECT_STATUS(device(), HM_ERR_INVALID_ARGUMENT,
                   api().memcpy_async(stream.native(), host, nullptr, 16));
  HM_EXPECT_STATUS(device(), HM_ERR_INVALID_ARGUMENT,
                   api().memset_async(stream.native(), nullptr, 0, 16));
  HM_RULE("HM-R13");
  HM_EXPECT_STATUS(device(), HM_ERR_INVALID_HANDLE, api().memset_async(nullptr, host, 0, 16));
  HM_EXPECT_STATUS(device(), HM_ERR_INVALID_HANDLE, api().stream_destroy(nullptr));
  HM_EXPECT_STATUS(device(), HM_ERR_INVALID_HANDLE, api().event_destroy(nullptr));
  stream.synchronize();
}

// A copy or fill whose range starts in an allocation and runs past its end is refused, not done.
TEST_P(DeviceTest, RangesPastTheirAllocationAreRefused) {
  HM_RULE("HM-R12");
  HM_REQUIRE(HM_CAP_DEVICE_MEMORY, "device memory");
  Stream stream = device().create_stream();
  const uint64_t size = 8192;
  Buffer buffer = device().allocate(size);
  auto* host = static_cast<uint8_t*>(host_buffer(2 * size));
  auto* last = static_cast<uint8_t*>(buffer.data()) + size - 16;
  HM_EXPECT_STATUS(device(), HM_ERR_INVALID_ARGUMENT,
                   api().memcpy_async(stream.native(), last, host, 32));
  HM_EXPECT_STATUS(device(), HM_ERR_INVALID_ARGUMENT,
                   api().memcpy_async(stream.native(), host, last, 32));
  HM_EXPECT_STATUS(device(), HM_ERR_INVALID_ARGUMENT,
                   api().memset_async(stream.native(), last, 0, 32));
  stream.synchronize();
}

TEST_P(DeviceTest, StreamMemopsRejectBadFlagsAndConditions) {
  HM_RULE("HM-R33");
  HM_REQUIRE(HM_CAP_STREAM_MEMOPS | HM_CAP_PINNED_HOST_MEMORY, "stream memory operations");
  if (!(api().stream_write_value32 && api().stream_wait_value32))
    GTEST_SKIP() << "a memop slot is NULL (a failure of its own)";
  Buffer word = device().allocate(4096, MemoryKind::pinned_host);
  Stream stream = device().create_stream();
  HM_EXPECT_STATUS(device(), HM_ERR_INVALID_ARGUMENT,
                   api().stream_write_value32(stream.native(), word.data(), 1, 1));
  HM_EXPECT_STATUS(device(), HM_ERR_INVALID_ARGUMENT,
                   api().stream_wait_value32(stream.native(), word.data(), 0, HM_WAIT_GEQ, 1));
  HM_EXPECT_STATUS(device(), HM_ERR_INVALID_ARGUMENT,
                   api().stream_wait_value32(stream.native(), word.data(), 0, 17, 0));
  HM_RULE("HM-R13");
  HM_EXPECT_STATUS(device(), HM_ERR_INVALID_HANDLE,
                   api().stream_write_value32(nullptr, word.data(), 1, 0));
  HM_EXPECT_STATUS(device(), HM_ERR_INVALID_HANDLE,
                   api().stream_wait_value32(nullptr, word.data(), 0, HM_WAIT_GEQ, 0));
  stream.synchronize();
}

TEST_P(DeviceTest, TimingAndCallbacksRejectBadArguments) {
  HM_RULE("HM-R12");
  Stream stream = device().create_stream();
  if (has(HM_CAP_EVENT_TIMING) && api().event_elapsed_ms) {
    Event a = device().create_event(), b = device().create_event();
    a.record(stream);
    b.record(stream);
    stream.synchronize();
    HM_EXPECT_STATUS(device(), HM_ERR_INVALID_ARGUMENT,
                     api().event_elapsed_ms(a.native(), b.native(), nullptr));
    HM_RULE("HM-R13");
    float ms = 0;
    HM_EXPECT_STATUS(device(), HM_ERR_INVALID_HANDLE,
                     api().event_elapsed_ms(nullptr, b.native(), &ms));
    HM_EXPECT_STATUS(device(), HM_ERR_INVALID_HANDLE,
                     api().event_elapsed_ms(a.native(), nullptr, &ms));
  }
  HM_RULE("HM-R13");
  if (has(HM_CAP_HOST_CALLBACK) && api().stream_add_callback)
    HM_EXPECT_STATUS(device(), HM_ERR_INVALID_HANDLE,
                     api().stream_add_callback(
                         nullptr, [](void*) {}, nullptr));
}

TEST_P(DeviceTest, IpcSlotsRejectBadArguments) {
  HM_RULE("HM-R12");
  HM_REQUIRE(HM_CAP_IPC | HM_CAP_DEVICE_MEMORY, "IPC");
  if (!(api().ipc_export && api().ipc_open && api().ipc_close))
    GTEST_SKIP() << "an IPC slot is NULL (a failure of its own)";
  Buffer buffer = device().allocate(8192);
  HM_EXPECT_STATUS(device(), HM_ERR_INVALID_ARGUMENT, api().ipc_export(buffer.data(), nullptr));
  hm_ipc_handle handle = ipc_export(device(), buffer.data());
  void* ptr = nullptr;
  HM_EXPECT_STATUS(device(), HM_ERR_INVALID_ARGUMENT, api().ipc_open(index(), nullptr, &ptr));
  HM_EXPECT_STATUS(device(), HM_ERR_INVALID_ARGUMENT, api().ipc_open(index(), &handle, nullptr));
  for (int32_t bad : {device().plugin().device_count(), -1}) {
    ptr = nullptr;
    HM_EXPECT_STATUS(device(), HM_ERR_INVALID_ARGUMENT, api().ipc_open(bad, &handle, &ptr));
    if (ptr != nullptr) api().ipc_close(ptr);
  }
  HM_EXPECT_STATUS(device(), HM_ERR_INVALID_ARGUMENT,
                   api().ipc_close(static_cast<uint8_t*>(buffer.data()) + 64));
}

TEST_P(DeviceTest, DmabufSlotsRejectBadArguments) {
  HM_RULE("HM-R12");
  HM_REQUIRE(HM_CAP_DMABUF_EXPORT | HM_CAP_DEVICE_MEMORY, "dma-buf export");
  if (!(api().dmabuf_export && api().dmabuf_release))
    GTEST_SKIP() << "a dma-buf slot is NULL (a failure of its own)";
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  Buffer buffer = device().allocate(4 * page);
  hm_dmabuf out{};
  out.struct_size = sizeof out;
  HM_EXPECT_STATUS(device(), HM_ERR_INVALID_ARGUMENT, api().dmabuf_export(buffer.data(), 0, &out));
  HM_EXPECT_STATUS(device(), HM_ERR_INVALID_ARGUMENT,
                   api().dmabuf_export(buffer.data(), page, nullptr));
  HM_EXPECT_STATUS(device(), HM_ERR_INVALID_ARGUMENT,
                   api().dmabuf_export(buffer.data(), 8 * page, &out));  // past the allocation
  HM_RULE("HM-R6");
  out.struct_size = sizeof(size_t);
  HM_EXPECT_STATUS(device(), HM_ERR_INVALID_ARGUMENT,
                   api().dmabuf_export(buffer.data(), page, &out));
  HM_RULE("HM-R12");
  HM_EXPECT_STATUS(device(), HM_ERR_INVALID_ARGUMENT, api().dmabuf_release(nullptr));
}

TEST_P(DeviceTest, HostRegisterRejectsBadArguments) {
  HM_RULE("HM-R12");
  HM_REQUIRE(HM_CAP_HOST_REGISTER, "host_register");
  if (!(api().host_register && api().host_unregister))
    GTEST_SKIP() << "a host_register slot is NULL (a failure of its own)";
  std::vector<uint8_t> memory(1 << 16);
  HM_EXPECT_STATUS(device(), HM_ERR_INVALID_ARGUMENT, api().host_register(nullptr, 4096));
  HM_EXPECT_STATUS(device(), HM_ERR_INVALID_ARGUMENT, api().host_register(memory.data(), 0));
  HM_ASSERT_OK(device(), api().host_register(memory.data(), memory.size()));
  HM_EXPECT_STATUS(device(), HM_ERR_INVALID_ARGUMENT,  // overlaps what it already knows
                   api().host_register(memory.data() + 4096, 4096));
  HM_EXPECT_STATUS(device(), HM_ERR_INVALID_ARGUMENT, api().host_unregister(memory.data() + 64));
  HM_EXPECT_STATUS(device(), HM_OK, api().host_unregister(memory.data()));
}

}  // namespace
}  // namespace hetmesh::cts
