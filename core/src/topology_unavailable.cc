// Topology for a build without hwloc (topology.hpp): nothing is known, and from_xml refuses.
#include <hetmesh/core/error.hpp>
#include <hetmesh/core/topology.hpp>

namespace hetmesh {

struct Topology::Impl {};

Topology::Topology(std::unique_ptr<Impl> impl, std::string why_empty)
    : impl_(std::move(impl)), why_empty_(std::move(why_empty)) {}
Topology::Topology(Topology&&) noexcept = default;
Topology& Topology::operator=(Topology&&) noexcept = default;
Topology::~Topology() = default;

Topology Topology::of_this_machine() {
  return Topology(nullptr, "this hetmesh was built without hwloc (Debian libhwloc-dev)");
}

Topology Topology::from_xml(const std::string&) {
  throw Error(HM_ERR_NOT_SUPPORTED,
              "topology: this hetmesh was built without hwloc (Debian libhwloc-dev)");
}

std::optional<Topology::Place> Topology::place(const std::string&) const {
  return std::nullopt;
}

std::vector<Topology::Nic> Topology::rdma_nics() const {
  return {};
}

std::optional<std::string> Topology::nearest_nic(const std::string&,
                                                 const std::map<std::string, int>&) const {
  return std::nullopt;
}

int Topology::numa_nodes() const {
  return 0;
}

}  // namespace hetmesh
