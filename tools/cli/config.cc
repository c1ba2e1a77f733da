// `hetmesh config --print`: the effective job config, as every instance of the job will read it:
// the file's values and the defaults for what it leaves out. A file that does not validate fails
// here, with the error a job would give. `--metrics-token`: the bearer token of the job's metrics.
#include "commands.hpp"

#include <hetmesh/afd/job_config.hpp>
#include <hetmesh/core/job_secret.hpp>
#include <hetmesh/core/metrics_server.hpp>

#include <fmt/format.h>

#include <memory>
#include <optional>
#include <string>

namespace hetmesh::cli {

void add_config_command(CLI::App& app) {
  struct Options {
    std::string path;
    bool print = false;  // the effective config (the default); the flag says so on the command line
    bool metrics_token = false;
  };
  auto o = std::make_shared<Options>();  // owned by the callback: CLI11 writes into it
  CLI::App* config = app.add_subcommand("config", "Show the effective job config");
  config->add_option("--config", o->path, "job config (TOML); default: the default job");
  config->add_flag("--print", o->print,
                   "print the effective config as TOML (what this command does)");
  config->add_flag("--metrics-token", o->metrics_token,
                   "print the bearer token a Prometheus scrape of this job's metrics sends, from "
                   "its secret (HETMESH_JOB_SECRET_FILE, else [rendezvous] secret_file)");
  config->callback([o] {
    const afd::JobConfig c =
        o->path.empty() ? afd::parse_config("", "the default job") : afd::load_config(o->path);
    if (o->metrics_token) {
      std::optional<JobSecret> secret = JobSecret::from_environment();
      if (!secret && !c.rendezvous.secret_file.empty())
        secret = JobSecret::read_file(c.rendezvous.secret_file);
      if (!secret)
        throw Error(HM_ERR_INVALID_ARGUMENT,
                    "--metrics-token: no secret: set HETMESH_JOB_SECRET_FILE, or name a config "
                    "whose [rendezvous] secret_file names it");
      fmt::print("{}\n", metrics::metrics_token(*secret));
      return;
    }
    fmt::print("# the effective job config of {} (hetmesh {}): every key, defaults filled in\n{}",
               o->path.empty() ? "the default job" : o->path, HETMESH_VERSION, afd::to_toml(c));
  });
}

}  // namespace hetmesh::cli
