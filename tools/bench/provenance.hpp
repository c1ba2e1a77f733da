// Where and when a benchmark ran, for its JSON: the host, the UTC date and time, and the hetmesh
// version, so a figure is never separated from its machine.
#pragma once

#include <nlohmann/json.hpp>

namespace hetmesh::cli {

// {"host": ..., "date": "2026-12-01T18:30:00Z", "hetmesh_version": "0.1.0"}
nlohmann::json provenance();

}  // namespace hetmesh::cli
