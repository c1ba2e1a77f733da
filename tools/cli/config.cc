// `hetmesh config --print`: the effective job config, as every instance of the job will read it:
// the file's values and the defaults for what it leaves out. A file that does not validate fails
// here, with the error a job would give.
#include "commands.hpp"

#include <hetmesh/afd/job_config.hpp>

#include <fmt/format.h>

#include <memory>
#include <string>

namespace hetmesh::cli {

void add_config_command(CLI::App& app) {
  struct Options {
    std::string path;
    bool print = false;  // the one thing the command does; the flag says so on the command line
  };
  auto o = std::make_shared<Options>();  // owned by the callback: CLI11 writes into it
  CLI::App* config = app.add_subcommand("config", "Show the effective job config");
  config->add_option("--config", o->path, "job config (TOML); default: the default job");
  config->add_flag("--print", o->print,
                   "print the effective config as TOML (what this command does)");
  config->callback([o] {
    const afd::JobConfig c =
        o->path.empty() ? afd::parse_config("", "the default job") : afd::load_config(o->path);
    fmt::print("# the effective job config of {} (hetmesh {}): every key, defaults filled in\n{}",
               o->path.empty() ? "the default job" : o->path, HETMESH_VERSION, afd::to_toml(c));
  });
}

}  // namespace hetmesh::cli
