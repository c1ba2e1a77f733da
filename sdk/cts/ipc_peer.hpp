// Cross-process IPC checks: the exporter side runs in the test, the importer in a child process.
#pragma once

#include <hetmesh/core/device.hpp>

namespace hetmesh::cts {

struct IpcRoundTrip {
  MemoryKind kind = MemoryKind::device;
  // Where in the allocation the exported pointer lies: the handle describes the whole allocation
  // wherever it points (HM-R36), and the peer maps all of it from its base (HM-R37).
  uint64_t export_offset = 0;
  // The ABI minor the peer's host announces; an older one must never see a kind added after it
  // (HM-R38).
  uint32_t peer_host_minor = HM_DEVICE_PLUGIN_ABI_MINOR;
};

// Exports memory of `exporter`, has a child process open it on `importer` (same plugin) twice and
// close the first mapping, check the second's kind, base, size and bytes and overwrite them
// (through the host pointer where the mapping claims to be one, HM_MEM_IPC_MAPPED_HOST); then
// checks the overwrite here. Reports gtest failures.
void expect_ipc_round_trip(const Device& exporter, const Device& importer,
                           const IpcRoundTrip& how = {});

// The child side: `hetmesh-cts --cts-ipc-peer PLUGIN DEVICE HANDLE_HEX SIZE SEED HOST_MINOR`.
// Returns the process exit code; prints the reason for a failure.
int run_ipc_peer(int argc, char** argv);

}  // namespace hetmesh::cts
