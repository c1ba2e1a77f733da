// The launcher: a job config to this host's instances, running, and back (launcher.hpp).
#include <hetmesh/afd/launcher.hpp>

#include <fmt/format.h>

#include <fstream>

namespace hetmesh::afd {
namespace {

// The instances that run here, once their memory is known to fit.
LocalInstances instances_that_fit(const JobConfig& config, const LaunchOptions& options,
                                  const LaunchRequest& request) {
  LocalInstances local = parse_instances(options.instances, config);
  std::vector<MemoryNeed> needs;
  auto need = [&](Role role, int rank) {
    double bytes = engine_host_bytes(config, role, rank);
    if (request.extra_bytes) bytes += request.extra_bytes(role, rank);
    needs.push_back({fmt::format("{} {}", to_string(role), rank), bytes});
  };
  for (int a : local.attention)
    need(Role::attention, a);
  for (int f : local.ffn)
    need(Role::ffn, f);
  refuse_unless_memory_fits(needs, request.config_name, request.memory_advice);
  return local;
}

}  // namespace

Launcher::Launcher(const JobConfig& config, const LaunchOptions& options, LaunchRequest request,
                   const std::string& name)
    : config_(config),
      options_(options),
      request_(std::move(request)),
      local_(instances_that_fit(config_, options_, request_)),
      folder_(make_job_folder("hetmesh-" + name)),
      remove_folder_(folder_),
      store_(config_, options_.store, local_.everything(config_), folder_),
      places_(place_instances(config_, local_, options_.pin)) {
  std::ofstream(folder_ / "job.toml") << to_toml(config_);
}

std::string Launcher::share() const {
  return everything() ? std::string() : describe_share(local_, store_);
}

Launcher::Outcome Launcher::run(const Run& run) {
  std::vector<std::string> command = request_.command;
  command.insert(command.end(), {"--config", (folder_ / "job.toml").string()});
  command.insert(command.end(), run.args.begin(), run.args.end());
  LocalJob job(command, store_.address(), folder_.string(), run.job);
  for (size_t i = 0; i < local_.ffn.size(); ++i)
    job.start(run.role_prefix + "ffn", local_.ffn[i], places_.args(false, i));
  for (size_t i = 0; i < local_.attention.size(); ++i) {
    std::function<void(const std::string&)> on_line;
    if (run.on_attention_line)
      on_line = [&job, &run, rank = local_.attention[i]](const std::string& line) {
        run.on_attention_line(job, rank, line);
      };
    job.start(run.role_prefix + "attention", local_.attention[i], places_.args(true, i),
              std::move(on_line));
  }
  Outcome outcome;
  outcome.failures = job.wait(run.limit, run.stopped_limit);
  outcome.interrupted = job.interrupted();
  if (outcome.interrupted == 0) outcome.explanation = job.explain(outcome.failures);
  return outcome;
}

int Launcher::exit_status(int status) const {
  return InterruptGuard::signal() != 0 ? 128 + InterruptGuard::signal() : status;
}

}  // namespace hetmesh::afd
