// What a child hetmesh-cts prints as its tests run: GoogleTest's own lines, less the filter that
// the supervisor sets (thousands of test names) and with source files named without the build
// machine's folders.
#pragma once

namespace hetmesh::cts {

// Replaces GoogleTest's default printer with that one. Call after InitGoogleTest.
void use_brief_printer();

}  // namespace hetmesh::cts
