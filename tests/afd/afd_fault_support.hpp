// What the files of afd_fault_test share: the bounds of the instances it starts (this binary
// re-run with --role, afd_fault_test.cc) and of the test's own waits.
#pragma once

#include <chrono>

namespace hetmesh::afd::fault_test {

// The engines' bound on every wait in the children: what a stopped peer costs its survivors. Both
// bounds are far beyond any pause of a healthy peer on a loaded machine, which must never look
// like the fault under test.
inline constexpr std::chrono::milliseconds kChildTimeout{30000};
// Their heartbeat: a peer silent this long is hung, even when no data is due.
inline constexpr std::chrono::milliseconds kHeartbeat{10000};
// The heartbeat of the replacement cases ("recover"), which do not measure it: their survivors
// learn of a loss from the replacement or from the dead peer's link. Starting and connecting a
// replacement keeps a slow machine (the rxe VM: 2 emulated cores) so busy that a survivor can go
// unheard for over a second; that must not make it look hung.
inline constexpr std::chrono::milliseconds kRecoveryHeartbeat{60000};
// How long the test waits for a child: far beyond any bound the engine promises.
inline constexpr std::chrono::milliseconds kWait{120000};

}  // namespace hetmesh::afd::fault_test
