// From a job config to what the engine needs: the engine spec of one instance and the plugins.
// Shared by `hetmesh demo` and `hetmesh bench afd`.
#pragma once

#include <hetmesh/afd/engine.hpp>
#include <hetmesh/afd/job_config.hpp>
#include <hetmesh/transport/selection.hpp>

namespace hetmesh::afd {

// The transport a single-host job uses, chosen by choose_transport (transport_selection.hpp),
// which logs why: `auto` resolves to ipc, since every instance shares the node; a config that
// names a transport gets it.
TransportSelection single_host_transport_choice(const JobConfig& config);
TransportKind single_host_transport(const JobConfig& config);

EngineSpec engine_spec(const JobConfig& config, Role role, int rank);

// Loads the plugins the config names (explicit paths, per-plugin options) plus the usual search.
PluginRegistry load_plugins(const JobConfig& config);

}  // namespace hetmesh::afd
