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
  auto path = std::make_shared<std::string>();
  CLI::App* config = app.add_subcommand("config", "Show the effective job config");
  config->add_option("--config", *path, "job config (TOML); default: the default job");
  auto print = std::make_shared<bool>(false);
  config->add_flag("--print", *print,
                   "print the effective config as TOML (what this command does)");
  config->callback([path] {
    const afd::JobConfig c =
        path->empty() ? afd::parse_config("", "the default job") : afd::load_config(*path);
    fmt::print("# the effective job config of {} (hetmesh {}): every key, defaults filled in\n{}",
               path->empty() ? "the default job" : *path, HETMESH_VERSION, afd::to_toml(c));
  });
}

}  // namespace hetmesh::cli
