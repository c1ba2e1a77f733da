// Subcommands of the `hetmesh` command line tool.
#pragma once

#include <CLI/CLI.hpp>

namespace hetmesh::cli {

// Registers `hetmesh info` on `app`.
void add_info_command(CLI::App& app);

}  // namespace hetmesh::cli
