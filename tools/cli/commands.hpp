// Subcommands of the `hetmesh` command line tool.
#pragma once

#include <CLI/CLI.hpp>

namespace hetmesh::cli {

// Registers `hetmesh info` on `app`.
void add_info_command(CLI::App& app);
// Registers `hetmesh config` (--print: the effective job config of a file, or the default).
void add_config_command(CLI::App& app);

// Registers `hetmesh bench transport` on the `bench` subcommand.
void add_bench_transport_command(CLI::App& bench);
// Registers `hetmesh bench afd`.
void add_bench_afd_command(CLI::App& bench);
// Registers `hetmesh bench faults`.
void add_bench_faults_command(CLI::App& bench);

}  // namespace hetmesh::cli
