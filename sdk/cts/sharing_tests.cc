// IPC and dma-buf export. IPC is checked across processes: this executable re-runs itself as a
// peer (--cts-ipc-peer), opens the handle, verifies the exporter's bytes and writes new ones.
#include "cts.hpp"
#include "ipc_peer.hpp"

#include <hetmesh/core/subprocess.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
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
  expect_ipc_round_trip(device(), device(), {.kind = MemoryKind::pinned_host});
}

// A pointer inside an allocation exports the whole allocation: the peer maps it from its base
// (a plugin that looks up exact bases refuses this, one that exports [ptr, end) maps the wrong
// bytes).
TEST_P(DeviceTest, IpcHandleOfAnInteriorPointerOpensTheWholeAllocation) {
  HM_RULE("HM-R36");
  HM_REQUIRE(HM_CAP_IPC | HM_CAP_DEVICE_MEMORY, "IPC");
  if (!(api().ipc_export && api().ipc_open && api().ipc_close))
    GTEST_SKIP() << "an IPC slot is NULL";
  expect_ipc_round_trip(device(), device(), {.export_offset = 3 * 4096 + 40});
}

// A host of ABI minor 0 does not know HM_MEM_IPC_MAPPED_HOST (minor 1): the plugin must answer
// HM_MEM_IPC_MAPPED to it, whatever its own minor.
TEST_P(DeviceTest, IpcMappingIsReportedInTheHostsMinor) {
  HM_RULE("HM-R38");
  HM_REQUIRE(HM_CAP_IPC | HM_CAP_PINNED_HOST_MEMORY, "IPC of pinned host memory");
  if (!(api().ipc_export && api().ipc_open && api().ipc_close))
    GTEST_SKIP() << "an IPC slot is NULL";
  expect_ipc_round_trip(device(), device(),
                        {.kind = MemoryKind::pinned_host, .peer_host_minor = 0});
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

// A dma-buf of part of an allocation covers that part: [offset, offset + length) of the fd holds
// exactly the range's bytes (read through mmap where the exporter allows it; a GPU's dma-buf
// usually does not, and then the length and the fd's size are what is checked).
TEST_P(DeviceTest, DmabufExportOfASubRangeCoversThatRange) {
  HM_RULE("HM-R39");
  HM_REQUIRE(HM_CAP_DMABUF_EXPORT | HM_CAP_DEVICE_MEMORY, "dma-buf export");
  if (!(api().dmabuf_export && api().dmabuf_release)) GTEST_SKIP() << "a dma-buf slot is NULL";
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t size = 64 * page, first = 8 * page, length = 16 * page;
  Buffer buffer = device().allocate(size);
  auto* host = static_cast<uint8_t*>(host_buffer(size));
  fill_pattern(host, size, 77);
  Stream stream = device().create_stream();
  stream.copy(buffer.data(), host, size);
  stream.synchronize();
  hm_dmabuf dmabuf{};
  dmabuf.struct_size = sizeof dmabuf;
  HM_ASSERT_OK(device(),
               api().dmabuf_export(static_cast<uint8_t*>(buffer.data()) + first, length, &dmabuf));
  EXPECT_EQ(dmabuf.length, length) << "the dma-buf does not describe the range asked for";
  off_t end = lseek(dmabuf.fd, 0, SEEK_END);
  EXPECT_GE(static_cast<uint64_t>(end), dmabuf.offset + dmabuf.length);
  const uint64_t map_from = dmabuf.offset / page * page;
  const uint64_t map_size = dmabuf.offset - map_from + dmabuf.length;
  void* view =
      mmap(nullptr, map_size, PROT_READ, MAP_SHARED, dmabuf.fd, static_cast<off_t>(map_from));
  if (view != MAP_FAILED) {
    const uint8_t* bytes = static_cast<const uint8_t*>(view) + (dmabuf.offset - map_from);
    EXPECT_EQ(std::memcmp(bytes, host + first, std::min(length, dmabuf.length)), 0)
        << "[offset, offset + length) of the fd holds other bytes than the range";
    munmap(view, map_size);
  }
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
