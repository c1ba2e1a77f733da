// The options of every command that launches an AFD job (`hetmesh demo`, `hetmesh bench afd`):
// which instances start on this host, the store to join (docs/launching.md) and whether to pin
// them to CPUs near their devices, and the ones the launcher (afd::LocalJob) gives each instance
// it starts: --role, --rank, --store, --out, and its place (--cpus, --nic).
#pragma once

#include <hetmesh/afd/job.hpp>

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

namespace hetmesh::cli {

struct JobLaunchOptions {
  std::vector<std::string> instances;  // the instances started here; none = all
  std::string store;                   // the store to join; none = host it
  std::string role;                    // in an instance: its role ("" in the launcher)
  int rank = 0;
  std::string out;           // in an instance: the job's folder
  std::string pin = "auto";  // auto, on, off: CPUs of its device's NUMA node per instance
  afd::InstancePlace place;  // in an instance: its CPUs and NIC (afd::InstancePlaces)
};

inline void add_job_launch_options(CLI::App& command, JobLaunchOptions& o) {
  command.add_option("--instances", o.instances,
                     "start only these instances here: attention, ffn, attention:0,1, ffn:2-3 "
                     "(default: all); for jobs on several hosts, see docs/launching.md");
  command.add_option("--store", o.store,
                     "join the rendezvous store at HOST:PORT instead of hosting it");
  command
      .add_option("--pin", o.pin,
                  "pin each instance to CPUs of its device's NUMA node (where the topology says): "
                  "auto (when each gets 4 or more and the config's [affinity] names none), on, off")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "on", "off"}));
  command.add_option("--cpus", o.place.cpus, "internal")->delimiter(',')->group("");
  command.add_option("--nic", o.place.nic, "internal")->group("");
  command.add_option("--role", o.role, "internal")->group("");
  command.add_option("--rank", o.rank, "internal")->group("");
  command.add_option("--out", o.out, "internal")->group("");
}

}  // namespace hetmesh::cli
