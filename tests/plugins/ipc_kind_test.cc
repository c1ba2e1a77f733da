// What pointer_query calls memory opened through ipc_open (plugin_kit/ipc_kind.hpp, as the
// host-memory kit applies it): a peer's pinned host memory is HM_MEM_IPC_MAPPED_HOST, but only for
// a host of ABI minor >= 1, which knows that kind; device memory never is.
#include <hetmesh/plugin_kit/host_memory.hpp>

#include <gtest/gtest.h>

namespace {

hm_host_api host_of_minor(uint32_t minor) {
  hm_host_api host{};
  host.struct_size = sizeof host;
  host.abi_major = HM_DEVICE_PLUGIN_ABI_MAJOR;
  host.abi_minor = minor;
  return host;
}

// Allocates `kind` memory, exports it, opens the handle and says what pointer_query calls the
// mapping. `hidden`: device memory is a PROT_NONE view, as in the asic_stub plugin.
int32_t kind_of_opened(const hm_host_api* host, int32_t kind, bool hidden) {
  hm::kit::HostMemory memory(0x54535431, hidden, {uint64_t{1} << 20}, host);
  void* allocation = memory.alloc(0, 4096, kind);
  hm_ipc_handle handle = memory.ipc_export(allocation);
  void* mapped = memory.ipc_open(0, &handle);
  hm_pointer_info info{};
  info.struct_size = sizeof info;
  memory.query(mapped, &info);
  memory.ipc_close(mapped);
  memory.free(allocation);
  return info.kind;
}

TEST(IpcKind, PinnedMemoryOpenedForAMinor1HostIsAHostPointer) {
  hm_host_api host = host_of_minor(1);
  EXPECT_EQ(kind_of_opened(&host, HM_MEM_PINNED_HOST, true), HM_MEM_IPC_MAPPED_HOST);
  EXPECT_EQ(kind_of_opened(&host, HM_MEM_DEVICE, true), HM_MEM_IPC_MAPPED);
  EXPECT_EQ(kind_of_opened(&host, HM_MEM_DEVICE, false), HM_MEM_IPC_MAPPED);
}

TEST(IpcKind, AMinor0HostNeverSeesTheNewKind) {
  hm_host_api host = host_of_minor(0);
  EXPECT_EQ(kind_of_opened(&host, HM_MEM_PINNED_HOST, true), HM_MEM_IPC_MAPPED);
  EXPECT_EQ(hm::kit::host_pointer_mapping_kind(nullptr), HM_MEM_IPC_MAPPED);
}

TEST(IpcKind, BothKindsAreIpcMappings) {
  EXPECT_TRUE(hm::kit::is_ipc_mapping(HM_MEM_IPC_MAPPED));
  EXPECT_TRUE(hm::kit::is_ipc_mapping(HM_MEM_IPC_MAPPED_HOST));
  EXPECT_FALSE(hm::kit::is_ipc_mapping(HM_MEM_PINNED_HOST));
}

}  // namespace
