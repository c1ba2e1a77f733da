// The HETMESH_* environment variables that some part of hetmesh reads, and the check that warns
// about any other (a typo such as HETMESH_LOGS would otherwise be silently ignored).
#pragma once

#include <string>
#include <vector>

namespace hetmesh {

// One warning per HETMESH_* variable of the environment that is not a known one, each naming the
// variable and, where one is close, the known name it was probably meant to be.
std::vector<std::string> unknown_environment_warnings();

}  // namespace hetmesh
