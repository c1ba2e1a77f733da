// hetmesh: the command line entry point.
#include "commands.hpp"

#include "demo_command.hpp"

#include <hetmesh/core/error.hpp>

#include <cstdio>

int main(int argc, char** argv) {
  CLI::App app{"hetmesh: vendor-neutral attention-FFN disaggregation"};
  app.require_subcommand(1);
  hetmesh::demo::add_demo_command(app);
  hetmesh::cli::add_info_command(app);
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks with a same-run baseline");
  bench->require_subcommand(1);
  hetmesh::cli::add_bench_transport_command(*bench);
  hetmesh::cli::add_bench_afd_command(*bench);
  hetmesh::cli::add_bench_faults_command(*bench);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const hetmesh::Error& e) {
    std::fprintf(stderr, "hetmesh: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
