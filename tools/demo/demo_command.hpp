// Registers `hetmesh demo` (the AFD demo, the main job) on the command line.
#pragma once

#include <CLI/CLI.hpp>

namespace hetmesh::demo {
void add_demo_command(CLI::App& app);
}
