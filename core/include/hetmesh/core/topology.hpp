// Where devices and RDMA NICs sit in a machine, from hwloc (Debian libhwloc-dev): each PCI
// device's NUMA node, the chain of PCI bridges above it, the CPUs near it, and the NIC nearest it.
// `hetmesh info` shows it; "auto" NIC choice per instance uses it. A build without hwloc knows no
// topology: every query answers "unknown", and from_xml refuses.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

// Exported from the library, which hides every other symbol (core/README.md, "Exports").
#pragma GCC visibility push(default)

namespace hetmesh {

class Topology {
 public:
  // This machine, I/O devices included. Never throws: a machine hwloc cannot read is an empty
  // topology, and says so in why_empty().
  static Topology of_this_machine();
  // An hwloc XML export (`lstopo --of xml`): another machine's, or a made-up one for tests.
  // Throws Error(INVALID_ARGUMENT) if hwloc cannot read it.
  static Topology from_xml(const std::string& xml);

  Topology(Topology&&) noexcept;
  Topology& operator=(Topology&&) noexcept;
  ~Topology();

  bool empty() const { return !impl_; }
  const std::string& why_empty() const { return why_empty_; }

  // Where the PCI device "DDDD:BB:DD.F" sits; nullopt if the topology has no such device.
  struct Place {
    int numa_node = -1;     // the nearest NUMA node, -1 if none
    std::string path;       // bridges down to it: "0000:10:00.0 > 0000:11:00.0"
    std::vector<int> cpus;  // the CPUs (PUs, by OS index) of its NUMA node or package
  };
  std::optional<Place> place(const std::string& pci_bus_id) const;

  struct Nic {
    std::string name;        // "mlx5_0", as verbs names it
    std::string pci_bus_id;  // "" if hwloc does not say
    int numa_node = -1;
  };
  std::vector<Nic> rdma_nics() const;

  // The RDMA NIC nearest the PCI device: the one under the lowest PCI bridge they share, then one
  // on the same NUMA node, then any; among equally near ones, the one with the fewest entries in
  // `taken` (the NICs already handed to other devices: so 8 GPUs share 2 NICs 4 and 4). nullopt
  // when the device is unknown or the machine has no RDMA NIC.
  std::optional<std::string> nearest_nic(const std::string& pci_bus_id,
                                         const std::map<std::string, int>& taken = {}) const;

  int numa_nodes() const;

 private:
  struct Impl;
  explicit Topology(std::unique_ptr<Impl> impl, std::string why_empty = {});
  std::unique_ptr<Impl> impl_;
  std::string why_empty_;
};

}  // namespace hetmesh

#pragma GCC visibility pop
