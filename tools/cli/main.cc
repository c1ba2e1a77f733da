// hetmesh: the command line entry point. Every failure that reaches here is printed as one line,
// "hetmesh: error: ...", with exit code 1: never an uncaught exception (abort, exit 134).
#include "commands.hpp"

#include "demo_command.hpp"

#include <hetmesh/core/error.hpp>
#include <hetmesh/core/log.hpp>

#include <cstdio>
#include <filesystem>
#include <new>

int main(int argc, char** argv) {
  hetmesh::init_logging();  // environment warnings (a typo in HETMESH_*) come first
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
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr,
                 "hetmesh: error: out of memory (an allocation failed); the job is too big for "
                 "this machine: make its [model] shape smaller or run fewer instances here\n");
    return 1;
  } catch (const std::filesystem::filesystem_error& e) {
    std::fprintf(stderr, "hetmesh: error: %s (check that the folder exists and is writable)\n",
                 e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hetmesh: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
