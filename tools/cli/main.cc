// hetmesh: the command line entry point. Every failure that reaches here is printed as one line,
// "hetmesh: error: ...", with exit code 1, and a usage error (an unknown command or option, a
// missing or malformed value) with exit code 2: never an uncaught exception (abort, exit 134).
#include "commands.hpp"

#include "demo_command.hpp"

#include <hetmesh/core/error.hpp>
#include <hetmesh/core/log.hpp>

#include <cstdio>
#include <filesystem>
#include <new>

namespace {

constexpr int kUsageError = 2;

// The subcommand of `app` named `word`, or nullptr.
const CLI::App* find_command(const CLI::App& app, const char* word) {
  for (const CLI::App* sub : app.get_subcommands({}))
    if (sub->check_name(word)) return sub;
  return nullptr;
}

std::string command_names(const CLI::App& app) {
  std::string names;
  for (const CLI::App* sub : app.get_subcommands({}))
    names += (names.empty() ? "" : ", ") + sub->get_name();
  return names;
}

}  // namespace

int main(int argc, char** argv) {
  hetmesh::init_logging();  // environment warnings (a typo in HETMESH_*) come first
  CLI::App app{"hetmesh: vendor-neutral attention-FFN disaggregation"};
  app.set_version_flag("--version", "hetmesh " HETMESH_VERSION);
  app.require_subcommand(1);
  hetmesh::demo::add_demo_command(app);
  hetmesh::demo::add_run_command(app);
  hetmesh::cli::add_info_command(app);
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks with a same-run baseline");
  bench->require_subcommand(1);
  hetmesh::cli::add_bench_transport_command(*bench);
  hetmesh::cli::add_bench_afd_command(*bench);
  hetmesh::cli::add_bench_faults_command(*bench);
  hetmesh::cli::add_config_command(app);
  // An unknown command is named as one (CLI11 would say "arguments were not expected"): the
  // first word, and the word after a command that has commands of its own (bench).
  const CLI::App* level = &app;
  for (int at = 1; at < argc && level != nullptr && argv[at][0] != '-'; ++at) {
    const CLI::App* command = find_command(*level, argv[at]);
    if (command == nullptr) {
      std::fprintf(stderr, "hetmesh: error: unknown command '%s%s%s' (commands: %s; see --help)\n",
                   level == &app ? "" : level->get_name().c_str(), level == &app ? "" : " ",
                   argv[at], command_names(*level).c_str());
      return kUsageError;
    }
    level = command->get_subcommands({}).empty() ? nullptr : command;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::RuntimeError& e) {  // a command's own exit status, e.g. an instance's
    return e.get_exit_code();
  } catch (const CLI::ParseError& e) {
    const int status = app.exit(e);  // prints the help, the version or the usage error
    return status == 0 ? 0 : kUsageError;
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
