// The machine's topology through hwloc (topology.hpp).
#include <hetmesh/core/error.hpp>
#include <hetmesh/core/topology.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <hwloc.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <tuple>

namespace hetmesh {

struct Topology::Impl {
  hwloc_topology_t t = nullptr;
  ~Impl() {
    if (t) hwloc_topology_destroy(t);
  }
};

namespace {

std::string bus_id_of(const hwloc_obj_attr_u::hwloc_pcidev_attr_s& a) {
  return fmt::format("{:04x}:{:02x}:{:02x}.{:x}", a.domain, a.bus, a.dev, a.func);
}

// The bus id of a PCI device or of a PCI-to-PCI bridge (a host bridge has none).
std::optional<std::string> bus_id_of(hwloc_obj_t o) {
  if (o->type == HWLOC_OBJ_PCI_DEVICE) return bus_id_of(o->attr->pcidev);
  if (o->type == HWLOC_OBJ_BRIDGE && o->attr->bridge.upstream_type == HWLOC_OBJ_BRIDGE_PCI)
    return bus_id_of(o->attr->bridge.upstream.pci);
  return std::nullopt;
}

hwloc_obj_t find_pci(hwloc_topology_t t, const std::string& id) {
  unsigned domain = 0, bus = 0, dev = 0, func = 0;
  if (std::sscanf(id.c_str(), "%x:%x:%x.%x", &domain, &bus, &dev, &func) != 4) return nullptr;
  return hwloc_get_pcidev_by_busid(t, domain, bus, dev, func);
}

// The NUMA node of the normal object an I/O object hangs from, if it is exactly one.
int numa_of(hwloc_topology_t t, hwloc_obj_t o) {
  hwloc_obj_t a = hwloc_get_non_io_ancestor_obj(t, o);
  return a && a->nodeset && hwloc_bitmap_weight(a->nodeset) == 1 ? hwloc_bitmap_first(a->nodeset)
                                                                 : -1;
}

// `o` and its ancestors, nearest first.
std::vector<hwloc_obj_t> lineage(hwloc_obj_t o) {
  std::vector<hwloc_obj_t> up;
  for (; o; o = o->parent)
    up.push_back(o);
  return up;
}

hwloc_topology_t load(bool xml, const std::string& text, std::string& why) {
  hwloc_topology_t t = nullptr;
  if (hwloc_topology_init(&t) != 0) {
    why = fmt::format("hwloc_topology_init: {}", std::strerror(errno));
    return nullptr;
  }
  // PCI devices come from the Linux backend's sysfs discovery. hwloc's optional components stay
  // out: libpciaccess only adds names (and leaks them), and the GPU ones (opencl, gl, cuda, nvml,
  // rsmi, levelzero) would initialise vendor runtimes in every process that asks where it is.
  for (const char* component : {"pci", "opencl", "gl", "cuda", "nvml", "rsmi", "levelzero"})
    hwloc_topology_set_components(t, HWLOC_TOPOLOGY_COMPONENTS_FLAG_BLACKLIST, component);
  // A made-up topology keeps every I/O object it names; this machine's, those hwloc finds
  // important (GPUs, NICs and the bridges above them).
  hwloc_topology_set_io_types_filter(
      t, xml ? HWLOC_TYPE_FILTER_KEEP_ALL : HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
  if (xml &&
      hwloc_topology_set_xmlbuffer(t, text.c_str(), static_cast<int>(text.size() + 1)) != 0) {
    why = fmt::format("hwloc cannot read the XML: {}", std::strerror(errno));
    hwloc_topology_destroy(t);
    return nullptr;
  }
  if (hwloc_topology_load(t) != 0) {
    why = fmt::format("hwloc_topology_load: {}", std::strerror(errno));
    hwloc_topology_destroy(t);
    return nullptr;
  }
  return t;
}

}  // namespace

Topology::Topology(std::unique_ptr<Impl> impl, std::string why_empty)
    : impl_(std::move(impl)), why_empty_(std::move(why_empty)) {}
Topology::Topology(Topology&&) noexcept = default;
Topology& Topology::operator=(Topology&&) noexcept = default;
Topology::~Topology() = default;

Topology Topology::of_this_machine() {
  std::string why;
  hwloc_topology_t t = load(false, {}, why);
  if (!t) return Topology(nullptr, why);
  auto impl = std::make_unique<Impl>();
  impl->t = t;
  return Topology(std::move(impl));
}

Topology Topology::from_xml(const std::string& xml) {
  std::string why;
  hwloc_topology_t t = load(true, xml, why);
  if (!t) throw Error(HM_ERR_INVALID_ARGUMENT, "topology: " + why);
  auto impl = std::make_unique<Impl>();
  impl->t = t;
  return Topology(std::move(impl));
}

std::optional<Topology::Place> Topology::place(const std::string& pci_bus_id) const {
  if (!impl_) return std::nullopt;
  hwloc_obj_t device = find_pci(impl_->t, pci_bus_id);
  if (!device) return std::nullopt;
  Place p;
  p.numa_node = numa_of(impl_->t, device);
  std::vector<std::string> bridges;
  for (hwloc_obj_t o : lineage(device))
    if (auto id = bus_id_of(o)) bridges.insert(bridges.begin(), *id);
  p.path = fmt::format("{}", fmt::join(bridges, " > "));
  if (hwloc_obj_t a = hwloc_get_non_io_ancestor_obj(impl_->t, device); a && a->cpuset) {
    unsigned cpu;
    hwloc_bitmap_foreach_begin(cpu, a->cpuset) p.cpus.push_back(static_cast<int>(cpu));
    hwloc_bitmap_foreach_end();
  }
  return p;
}

std::vector<Topology::Nic> Topology::rdma_nics() const {
  std::vector<Nic> nics;
  if (!impl_) return nics;
  for (hwloc_obj_t o = nullptr; (o = hwloc_get_next_osdev(impl_->t, o));) {
    if (o->attr->osdev.type != HWLOC_OBJ_OSDEV_OPENFABRICS || !o->name) continue;
    Nic nic{o->name, "", numa_of(impl_->t, o)};
    if (o->parent && o->parent->type == HWLOC_OBJ_PCI_DEVICE)
      nic.pci_bus_id = bus_id_of(o->parent->attr->pcidev);
    nics.push_back(std::move(nic));
  }
  return nics;
}

std::optional<std::string> Topology::nearest_nic(const std::string& pci_bus_id,
                                                 const std::map<std::string, int>& taken) const {
  if (!impl_) return std::nullopt;
  hwloc_obj_t device = find_pci(impl_->t, pci_bus_id);
  if (!device) return std::nullopt;
  const std::vector<hwloc_obj_t> up = lineage(device);
  // (how far up the device's lineage the two meet, how often taken, name): smallest wins.
  std::optional<std::tuple<size_t, int, std::string>> best;
  for (hwloc_obj_t o = nullptr; (o = hwloc_get_next_osdev(impl_->t, o));) {
    if (o->attr->osdev.type != HWLOC_OBJ_OSDEV_OPENFABRICS || !o->name) continue;
    size_t meet = up.size();
    for (hwloc_obj_t a = o; a && meet == up.size(); a = a->parent)
      meet = static_cast<size_t>(std::find(up.begin(), up.end(), a) - up.begin());
    auto it = taken.find(o->name);
    std::tuple<size_t, int, std::string> score{meet, it == taken.end() ? 0 : it->second, o->name};
    if (!best || score < *best) best = score;
  }
  if (!best) return std::nullopt;
  return std::get<2>(*best);
}

int Topology::numa_nodes() const {
  return impl_ ? hwloc_get_nbobjs_by_type(impl_->t, HWLOC_OBJ_NUMANODE) : 0;
}

}  // namespace hetmesh
