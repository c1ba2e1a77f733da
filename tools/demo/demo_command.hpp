// Registers `hetmesh demo` (the AFD demo, the main job) and `hetmesh run` (one of its instances,
// started by another launcher) on the command line.
#pragma once

#include <CLI/CLI.hpp>

namespace hetmesh::demo {
void add_demo_command(CLI::App& app);
void add_run_command(CLI::App& app);
}  // namespace hetmesh::demo
