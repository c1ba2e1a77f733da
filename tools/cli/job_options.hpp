// The command-line options of every command that launches an AFD job (`hetmesh demo`, `hetmesh
// bench afd`), into afd::LaunchOptions (launcher.hpp): which instances start on this host, the
// store to join (docs/launching.md) and whether to pin them to CPUs near their devices; and,
// hidden, the ones the launcher gives each instance it starts: --role, --rank, --store, --out,
// and its place (--cpus, --nic).
#pragma once

#include <hetmesh/afd/launcher.hpp>

#include <CLI/CLI.hpp>

namespace hetmesh::cli {

inline void add_job_launch_options(CLI::App& command, afd::LaunchOptions& o) {
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
