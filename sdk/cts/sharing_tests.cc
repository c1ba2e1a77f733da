// IPC and dma-buf export. IPC is checked across processes: this executable re-runs itself as a
// peer (--cts-ipc-peer), opens the handle, verifies the exporter's bytes and writes new ones.
#include "cts.hpp"
#include "ipc_peer.hpp"

#include <hetmesh/core/subprocess.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <cstring>

namespace hetmesh::cts {
namespace {

TEST_P(DeviceTest, IpcHandleOpensInAnotherProcess) {
  HM_RULE("HM-R16");
  HM_REQUIRE(HM_CAP_IPC | HM_CAP_DEVICE_MEMORY, "IPC");
  ASSERT_TRUE(api().ipc_export && api().ipc_open && api().ipc_close)
      << "capability set but an IPC slot is NULL";
  HM_RULE("HM-R37");
  expect_ipc_round_trip(device(), device());
}

TEST_P(DeviceTest, IpcHandleOfPinnedMemoryOpensInAnotherProcess) {
  HM_RULE("HM-R16");
  HM_REQUIRE(HM_CAP_IPC | HM_CAP_PINNED_HOST_MEMORY, "IPC of pinned host memory");
  ASSERT_TRUE(api().ipc_export && api().ipc_open && api().ipc_close)
      << "capability set but an IPC slot is NULL";
  HM_RULE("HM-R37");
  expect_ipc_round_trip(device(), device(), MemoryKind::pinned_host);
}

TEST_P(DeviceTest, IpcExportRejectsForeignMemory) {
  HM_RULE("HM-R16");
  HM_REQUIRE(HM_CAP_IPC, "IPC");
  ASSERT_NE(api().ipc_export, nullptr) << "capability set but slot is NULL";
  HM_RULE("HM-R36");
  std::vector<uint8_t> heap(4096);
  hm_ipc_handle handle{};
  hm_status status = api().ipc_export(heap.data(), &handle);
  EXPECT_NE(status, HM_OK) << "exported plain heap memory";
}

TEST_P(DeviceTest, IpcOpenRejectsGarbageHandle) {
  HM_RULE("HM-R16");
  HM_REQUIRE(HM_CAP_IPC, "IPC");
  ASSERT_NE(api().ipc_open, nullptr) << "capability set but slot is NULL";
  HM_RULE("HM-R37");
  hm_ipc_handle garbage;
  std::memset(garbage.bytes, 0xa5, sizeof garbage.bytes);
  void* ptr = nullptr;
  hm_status status = api().ipc_open(index(), &garbage, &ptr);
  EXPECT_NE(status, HM_OK) << "opened a garbage handle";
  HM_RULE("HM-R11");
  EXPECT_STRNE(api().last_error(), "");
}

TEST_P(DeviceTest, IpcNotSupportedWithoutCapability) {
  HM_RULE("HM-R17");
  if (has(HM_CAP_IPC)) GTEST_SKIP() << "device has IPC";
  if (api().ipc_export == nullptr) return;
  Buffer buffer = device().allocate(
      4096, has(HM_CAP_DEVICE_MEMORY) ? MemoryKind::device : MemoryKind::pinned_host);
  hm_ipc_handle handle{};
  HM_EXPECT_STATUS(device(), HM_ERR_NOT_SUPPORTED, api().ipc_export(buffer.data(), &handle));
}

TEST_P(DeviceTest, DmabufExportGivesAnFdCoveringTheRange) {
  HM_RULE("HM-R16");
  HM_REQUIRE(HM_CAP_DMABUF_EXPORT | HM_CAP_DEVICE_MEMORY, "dma-buf export");
  ASSERT_TRUE(api().dmabuf_export && api().dmabuf_release) << "capability set but slot is NULL";
  HM_RULE("HM-R39");
  const uint64_t size = 4 << 20;
  Buffer buffer = device().allocate(size);
  hm_dmabuf dmabuf{};
  dmabuf.struct_size = sizeof dmabuf;
  HM_ASSERT_OK(device(), api().dmabuf_export(buffer.data(), size, &dmabuf));
  EXPECT_GE(dmabuf.fd, 0);
  EXPECT_EQ(dmabuf.length, size);
  EXPECT_GE(fcntl(dmabuf.fd, F_GETFD), 0) << "fd is not open";
  off_t end = lseek(dmabuf.fd, 0, SEEK_END);  // dma-bufs report their size through lseek
  EXPECT_GE(static_cast<uint64_t>(end), dmabuf.offset + dmabuf.length);
  HM_EXPECT_STATUS(device(), HM_OK, api().dmabuf_release(&dmabuf));
}

TEST_P(DeviceTest, DmabufNotSupportedWithoutCapability) {
  HM_RULE("HM-R17");
  if (has(HM_CAP_DMABUF_EXPORT)) GTEST_SKIP() << "device exports dma-bufs";
  if (api().dmabuf_export == nullptr) return;
  if (!has(HM_CAP_DEVICE_MEMORY)) GTEST_SKIP() << "no device memory to export";
  Buffer buffer = device().allocate(1 << 20);
  hm_dmabuf dmabuf{};
  dmabuf.struct_size = sizeof dmabuf;
  HM_EXPECT_STATUS(device(), HM_ERR_NOT_SUPPORTED,
                   api().dmabuf_export(buffer.data(), 1 << 20, &dmabuf));
}

}  // namespace
}  // namespace hetmesh::cts
