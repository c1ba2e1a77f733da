// Cross-process IPC checks: the exporter side runs in the test, the importer in a child process.
#pragma once

#include <hetmesh/core/device.hpp>

namespace hetmesh::cts {

// Exports memory of `kind` of `exporter`, has a child process open it on `importer` (same plugin),
// check the bytes and overwrite them (through the host pointer where the mapping claims to be one,
// HM_MEM_IPC_MAPPED_HOST); then checks the overwrite here. Reports gtest failures.
void expect_ipc_round_trip(const Device& exporter, const Device& importer,
                           MemoryKind kind = MemoryKind::device);

// The child side: `hetmesh-cts --cts-ipc-peer PLUGIN DEVICE HANDLE_HEX SIZE SEED`. Returns the
// process exit code; prints the reason for a failure.
int run_ipc_peer(int argc, char** argv);

}  // namespace hetmesh::cts
