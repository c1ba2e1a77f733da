// One instance of a job in the process that runs it (instance.hpp): what it runs on, its engine,
// and its failure report.
#include <hetmesh/afd/instance.hpp>

#include <hetmesh/core/error.hpp>
#include <hetmesh/core/job_secret.hpp>
#include <hetmesh/core/log.hpp>

#include <fmt/format.h>

#include <unistd.h>

#include <algorithm>
#include <cstdio>

namespace hetmesh::afd {
namespace {

// The job's config as instance (role, rank) runs it: its device replaced where `device` names one.
JobConfig instance_config(const JobConfig& config, Role role, int rank, const std::string& device) {
  const int count = role == Role::attention ? config.job.attention : config.job.ffn;
  if (rank < 0 || rank >= count)
    throw Error(HM_ERR_INVALID_ARGUMENT, fmt::format("rank {}: the job has {} {} instance(s)", rank,
                                                     count, to_string(role)));
  JobConfig out = config;
  if (!device.empty())
    (role == Role::attention ? out.devices.attention : out.devices.ffn)
        .at(static_cast<size_t>(rank)) = device;
  return out;
}

// The job's secret: the file named, else the config's, else the one this process was handed
// (HETMESH_JOB_SECRET_FILE); none for a job on one host's loopback.
std::optional<JobSecret> find_secret(const JobConfig& config, const std::string& file) {
  if (!file.empty()) return JobSecret::read_file(file);
  if (!config.rendezvous.secret_file.empty())
    return JobSecret::read_file(config.rendezvous.secret_file);
  return JobSecret::from_environment();
}

// The job's store: the one named, else the config's; a port of 0 is only for its host.
std::string store_address(const JobConfig& config, const std::string& named) {
  std::string store = named.empty() ? config.rendezvous.address : named;
  if (store.ends_with(":0"))
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("store '{}': name the address of the job's store (store=\"host:port\", "
                            "e.g. hetmesh.StoreServer().address); port 0 is only for the process "
                            "that hosts it",
                            store));
  return store;
}

}  // namespace

Instance::Instance(const JobConfig& config, Role role, int rank, const InstanceOptions& options)
    : config_(instance_config(config, role, rank, options.device)),
      spec_(engine_spec(config_, role, rank)),
      secret_(find_secret(config_, options.secret_file)) {
  const std::string store = store_address(config_, options.store);
  if (secret_) spec_.transport.secret = *secret_;
  if (!options.job.empty()) spec_.job = options.job;
  if (options.metrics_index >= 0) spec_.metrics_index = options.metrics_index;
  plugins_ = load_plugins(config_);
  device_ = plugins_.device(role == Role::attention
                                ? config_.devices.attention.at(static_cast<size_t>(rank))
                                : config_.devices.ffn.at(static_cast<size_t>(rank)));
  spec_ = placed(std::move(spec_), options.place);
  store_ = connect_store(store, config_.job.join_timeout, secret_);
}

Instance::~Instance() {
  close();
}

AttentionEngine& Instance::attention() {
  if (spec_.role != Role::attention || closed_)
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("{} {} has no attention engine{}", to_string(spec_.role), spec_.rank,
                            closed_ ? " any more (closed)" : ""));
  if (!attention_) attention_ = std::make_unique<AttentionEngine>(spec_, *device_, *store_);
  return *attention_;
}

FfnEngine& Instance::ffn() {
  if (spec_.role != Role::ffn || closed_)
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("{} {} has no ffn engine{}", to_string(spec_.role), spec_.rank,
                            closed_ ? " any more (closed)" : ""));
  if (!ffn_) ffn_ = std::make_unique<FfnEngine>(spec_, *device_, *store_);
  return *ffn_;
}

void Instance::close() {
  closed_ = true;
  attention_.reset();
  ffn_.reset();
}

std::unique_ptr<Instance> open_instance(const JobConfig& config, Role role, int rank,
                                        const InstanceOptions& options) {
  return std::make_unique<Instance>(config, role, rank, options);
}

int run_instance(const InstanceIdentity& who, const std::function<int()>& body) {
  std::string message;
  bool consequence = false;
  try {
    return body();
  } catch (const Error& e) {
    message = e.what();
    consequence = e.status() == kStatusJobFailed;
  } catch (const std::exception& e) {
    message = e.what();
  }
  std::string origin = fmt::format("{}:{}", who.role, who.rank);
  if (!consequence) {
    try {
      // Short: the store was up when the job started, so a refusal now means it is gone.
      auto store = connect_store(who.store, std::min(who.timeout, std::chrono::milliseconds(500)));
      Rendezvous rendezvous(*store, who.job, who.role, who.rank);
      consequence = !rendezvous.report_failure(message);
    } catch (const std::exception& e) {
      log(LogLevel::warn, "{}: cannot publish its failure: {}", origin, e.what());
    }
  }
  if (consequence) {
    log(LogLevel::info, "{}: stopped after another instance's failure: {}", origin, message);
    return kExitAfterAnotherFailure;
  }
  char host[256] = "?";
  gethostname(host, sizeof host - 1);
  std::fprintf(stderr, "hetmesh: error: %s:%d on %s pid %d: %s\n", who.role.c_str(), who.rank, host,
               static_cast<int>(getpid()), message.c_str());
  return 1;
}

}  // namespace hetmesh::afd
