// The store of an invocation that launches a job, and its secret (job_store.hpp).
#include <hetmesh/afd/job_store.hpp>

#include "this_host.hpp"

#include <hetmesh/core/error.hpp>
#include <hetmesh/core/job_secret.hpp>
#include <hetmesh/core/socket.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdlib>
#include <optional>

namespace hetmesh::afd {

namespace {

// "host:port" of "http://host:port/...".
std::string url_host_port(const std::string& url) {
  std::string rest = url.substr(url.find("://") + 3);
  return rest.substr(0, rest.find('/'));
}

}  // namespace

JobStore::JobStore(const JobConfig& config, const std::string& join, bool whole_job,
                   const std::filesystem::path& folder) {
  std::optional<JobSecret> secret;
  std::string file = config.rendezvous.secret_file;
  if (!file.empty())
    secret = JobSecret::read_file(file);
  else if ((secret = JobSecret::from_environment()))
    file = std::getenv(JobSecret::kFileVariable);
  const bool etcd = config.rendezvous.kind == RendezvousKind::etcd;
  if (!secret && etcd && !whole_job)
    throw Error(HM_ERR_INVALID_ARGUMENT,
                fmt::format("this invocation starts part of a job that meets at etcd ({}): name "
                            "the job's secret file, [rendezvous] secret_file, which every "
                            "invocation reads (a secret made here would be this invocation's "
                            "alone, and the others' links would be refused)",
                            config.rendezvous.address));
  if (!secret && (join.empty() || etcd)) {
    // A job of this launcher's own gets a secret for it alone; one across hosts must name the
    // file every host reads, since nobody else could learn this one.
    const auto where =
        net::resolve(etcd ? url_host_port(config.rendezvous.address) : config.rendezvous.address,
                     /*passive=*/true, "store address");
    if (!net::is_loopback(where.front()))
      throw Error(HM_ERR_INVALID_ARGUMENT,
                  fmt::format("[rendezvous] address {} is reachable from other hosts: name the "
                              "job's secret file, [rendezvous] secret_file, which every host of "
                              "the job reads (made with: head -c 32 /dev/urandom | xxd -p -c 64 > "
                              "FILE; chmod 600 FILE)",
                              config.rendezvous.address));
    secret = JobSecret::generate();
    file = (folder / "job.secret").string();
    secret->write_file(file);
  }
  if (secret) {
    secret_file_ = std::filesystem::absolute(file).string();
    ::setenv(JobSecret::kFileVariable, secret_file_.c_str(), 1);
  }
  if (etcd) {  // nothing to host: every invocation meets at etcd
    address_ = config.rendezvous.address;
    return;
  }
  if (!join.empty()) {
    address_ = join;
    return;
  }
  // One config for every host: the host whose address the store has hosts it, the others join.
  const std::string& at = config.rendezvous.address;
  if (!is_this_host(at.substr(0, at.rfind(':'))) && !at.ends_with(":0")) {
    address_ = at;
    return;
  }
  server_ = std::make_unique<TcpStoreServer>(config.rendezvous.address, secret);
  address_ = server_->address();
}

std::string describe_share(const LocalInstances& local, const JobStore& store) {
  auto ranks = [](const std::vector<int>& r) {
    return r.empty() ? std::string("none") : fmt::format("{}", fmt::join(r, ","));
  };
  return fmt::format("here: attention {}, ffn {}; rendezvous store {} ({}){}",
                     ranks(local.attention), ranks(local.ffn), store.address(),
                     store.hosted() ? "hosted here" : "joined",
                     store.hosted() && !store.secret_file().empty()
                         ? fmt::format("; job secret in {} (other invocations: {}=FILE)",
                                       store.secret_file(), JobSecret::kFileVariable)
                         : "");
}

}  // namespace hetmesh::afd
