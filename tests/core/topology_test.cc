// The machine's topology (core/topology.hpp) on made-up machines given as hwloc XML: each GPU's
// NUMA node, PCI path and local CPUs, and the NIC nearest it. A box with 8 GPUs and 8 NICs (each
// GPU and a NIC under one PCIe switch) gives each GPU its own NIC; a box with 2 NICs for 8 GPUs
// shares them by NUMA node; NICs that are equally near are shared out evenly (afd::assign_nics,
// what the launcher hands each instance whose NIC is "auto"); and each instance is pinned to CPUs
// of its device's NUMA node (afd::assign_cpus).
#include <hetmesh/afd/instances.hpp>
#include <hetmesh/afd/job.hpp>
#include <hetmesh/core/error.hpp>
#include <hetmesh/core/topology.hpp>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

namespace hetmesh {
namespace {

struct Nic {
  unsigned bus;
  std::string name;
};
// A PCIe switch: its own bus, and the GPUs' and NICs' buses under it.
struct Switch {
  unsigned bus;
  std::vector<unsigned> gpus;
  std::vector<Nic> nics;
};
// A socket: its switches, and the GPUs and NICs right under its host bridge.
struct Socket {
  std::vector<Switch> switches;
  std::vector<unsigned> gpus;
  std::vector<Nic> nics;
};

std::string set(uint64_t bits) {
  return fmt::format("0x{:08x}", bits);
}

std::string sets(uint64_t cpus, uint64_t nodes) {
  return fmt::format(R"(cpuset="{0}" complete_cpuset="{0}" nodeset="{1}" complete_nodeset="{1}")",
                     set(cpus), set(nodes));
}

std::string pci(const char* type, unsigned bus) {
  return fmt::format(R"(pci_busid="0000:{:02x}:00.0" pci_type="{}")", bus, type);
}

std::string gpu_xml(unsigned bus) {
  return fmt::format("<object type=\"PCIDev\" {}/>\n", pci("0302 [10de:2335] [10de:18be] a1", bus));
}

std::string nic_xml(const Nic& nic) {
  return fmt::format(
      "<object type=\"PCIDev\" {}><object type=\"OSDev\" name=\"{}\" osdev_type=\"3\"/></object>\n",
      pci("0207 [15b3:1021] [15b3:0022] 00", nic.bus), nic.name);
}

// hwloc XML of a machine with `cores` cores per socket.
std::string machine_xml(const std::vector<Socket>& sockets, int cores) {
  const uint64_t all_cpus = (uint64_t{1} << (cores * sockets.size())) - 1;
  const uint64_t all_nodes = (uint64_t{1} << sockets.size()) - 1;
  std::string xml = fmt::format(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<!DOCTYPE topology SYSTEM \"hwloc2.dtd\">\n"
      "<topology version=\"2.0\">\n<object type=\"Machine\" os_index=\"0\" {} "
      "allowed_cpuset=\"{}\" allowed_nodeset=\"{}\">\n",
      sets(all_cpus, all_nodes), set(all_cpus), set(all_nodes));
  for (size_t s = 0; s < sockets.size(); ++s) {
    const uint64_t cpus = ((uint64_t{1} << cores) - 1) << (cores * s), node = uint64_t{1} << s;
    xml += fmt::format("<object type=\"Package\" os_index=\"{}\" {}>\n", s, sets(cpus, node));
    xml +=
        fmt::format("<object type=\"NUMANode\" os_index=\"{}\" {} local_memory=\"1073741824\"/>\n",
                    s, sets(cpus, node));
    for (int c = 0; c < cores; ++c) {
      const int index = static_cast<int>(s) * cores + c;
      const std::string one = sets(uint64_t{1} << index, node);
      xml += fmt::format(
          "<object type=\"Core\" os_index=\"{0}\" {1}><object type=\"PU\" os_index=\"{0}\" "
          "{1}/></object>\n",
          index, one);
    }
    const unsigned first = static_cast<unsigned>(0x20 * s + 0x10);
    xml += fmt::format(
        "<object type=\"Bridge\" bridge_type=\"0-1\" depth=\"0\" "
        "bridge_pci=\"0000:[{:02x}-{:02x}]\">\n",
        first, first + 0x0f);
    for (const Switch& sw : sockets[s].switches) {
      xml += fmt::format(
          "<object type=\"Bridge\" {} bridge_type=\"1-1\" depth=\"1\" "
          "bridge_pci=\"0000:[{:02x}-{:02x}]\">\n",
          pci("0604 [1000:c010] [1000:a064] b0", sw.bus), sw.bus + 1, sw.bus + 3);
      for (unsigned g : sw.gpus)
        xml += gpu_xml(g);
      for (const Nic& n : sw.nics)
        xml += nic_xml(n);
      xml += "</object>\n";
    }
    for (unsigned g : sockets[s].gpus)
      xml += gpu_xml(g);
    for (const Nic& n : sockets[s].nics)
      xml += nic_xml(n);
    xml += "</object>\n</object>\n";
  }
  return xml + "</object>\n</topology>\n";
}

std::string bus_id(unsigned bus) {
  return fmt::format("0000:{:02x}:00.0", bus);
}

// Every GPU's NIC, handed out in GPU order by the launcher's own function (afd::assign_nics).
std::vector<std::string> hand_out(const Topology& t, const std::vector<unsigned>& gpus) {
  std::vector<std::string> pci;
  for (unsigned g : gpus)
    pci.push_back(bus_id(g));
  return afd::assign_nics(pci, t);
}

// Two sockets, four PCIe switches on each, and under each switch one GPU and one NIC.
TEST(TopologyTest, EightGpusAndEightNicsEachGpuGetsTheNicUnderItsSwitch) {
  std::vector<Socket> sockets(2);
  std::vector<unsigned> gpus;
  for (unsigned s = 0; s < 2; ++s)
    for (unsigned k = 0; k < 4; ++k) {
      unsigned sw = 0x20 * s + 0x10 + 4 * k;
      sockets[s].switches.push_back({sw, {sw + 1}, {{sw + 2, fmt::format("mlx5_{}", 4 * s + k)}}});
      gpus.push_back(sw + 1);
    }
  Topology t = Topology::from_xml(machine_xml(sockets, 4));
  EXPECT_EQ(t.numa_nodes(), 2);
  EXPECT_EQ(t.rdma_nics().size(), 8u);
  EXPECT_EQ(hand_out(t, gpus), (std::vector<std::string>{"mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3",
                                                         "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7"}));
  // Even when every NIC but its own is free, a GPU keeps the NIC of its switch.
  EXPECT_EQ(t.nearest_nic(bus_id(gpus[5]), {{"mlx5_5", 9}}), "mlx5_5");
  auto place = t.place(bus_id(gpus[5]));
  ASSERT_TRUE(place.has_value());
  EXPECT_EQ(place->numa_node, 1);
  EXPECT_EQ(place->path, "0000:34:00.0 > 0000:35:00.0");
  EXPECT_EQ(place->cpus, (std::vector<int>{4, 5, 6, 7}));
  auto nic = t.rdma_nics()[6];
  EXPECT_EQ(nic.name, "mlx5_6");
  EXPECT_EQ(nic.pci_bus_id, "0000:3a:00.0");
  EXPECT_EQ(nic.numa_node, 1);
}

// Two sockets, four GPUs each under switches of their own, and one NIC per socket: each GPU gets
// its socket's NIC, however many GPUs took it already.
TEST(TopologyTest, EightGpusAndTwoNicsShareThemByNumaNode) {
  std::vector<Socket> sockets(2);
  std::vector<unsigned> gpus;
  for (unsigned s = 0; s < 2; ++s) {
    for (unsigned k = 0; k < 4; ++k) {
      unsigned sw = 0x20 * s + 0x10 + 4 * k;
      sockets[s].switches.push_back({sw, {sw + 1}, {}});
      gpus.push_back(sw + 1);
    }
    sockets[s].nics.push_back({0x20 * s + 0x1f, fmt::format("mlx5_{}", s)});
  }
  Topology t = Topology::from_xml(machine_xml(sockets, 2));
  EXPECT_EQ(hand_out(t, gpus), (std::vector<std::string>{"mlx5_0", "mlx5_0", "mlx5_0", "mlx5_0",
                                                         "mlx5_1", "mlx5_1", "mlx5_1", "mlx5_1"}));
}

// NICs equally near (under the same host bridge as the GPUs) are shared out evenly.
TEST(TopologyTest, EquallyNearNicsAreSharedOutEvenly) {
  std::vector<Socket> sockets(1);
  sockets[0].gpus = {0x11, 0x12, 0x13, 0x14};
  sockets[0].nics = {{0x18, "mlx5_0"}, {0x19, "mlx5_1"}};
  Topology t = Topology::from_xml(machine_xml(sockets, 2));
  EXPECT_EQ(hand_out(t, sockets[0].gpus),
            (std::vector<std::string>{"mlx5_0", "mlx5_1", "mlx5_0", "mlx5_1"}));
  EXPECT_EQ(t.place(bus_id(0x11))->path, "0000:11:00.0");
}

TEST(TopologyTest, UnknownDevicesAndMachinesWithoutNicsHaveNoNearestNic) {
  std::vector<Socket> sockets(1);
  sockets[0].gpus = {0x11};
  Topology t = Topology::from_xml(machine_xml(sockets, 2));
  EXPECT_EQ(t.nearest_nic(bus_id(0x11)), std::nullopt);  // no NIC at all
  EXPECT_EQ(t.place("0000:99:00.0"), std::nullopt);
  EXPECT_EQ(t.place("not a bus id"), std::nullopt);
  try {
    Topology::from_xml("<topology><object type=\"Nonsense\"");
    ADD_FAILURE() << "hwloc read broken XML";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), HM_ERR_INVALID_ARGUMENT);
  }
}

// Each instance gets CPUs of its device's NUMA node while that node has some left, then any;
// a device that is not a PCI device gets any; each CPU once.
TEST(TopologyTest, InstancesArePinnedToTheirDevicesNumaNode) {
  std::vector<Socket> sockets(2);
  sockets[0].gpus = {0x11};
  sockets[1].gpus = {0x31};
  Topology t = Topology::from_xml(machine_xml(sockets, 4));
  const std::vector<int> all = {0, 1, 2, 3, 4, 5, 6, 7};
  auto cpus =
      afd::assign_cpus({bus_id(0x31), bus_id(0x11), "", bus_id(0x31), bus_id(0x31)}, t, 2, all);
  EXPECT_EQ(cpus, (std::vector<std::vector<int>>{{4, 5}, {0, 1}, {2, 3}, {6, 7}, {}}));
  // Once its node is full, a device's instance takes CPUs elsewhere.
  cpus = afd::assign_cpus({bus_id(0x11), bus_id(0x11), bus_id(0x11)}, t, 3, all);
  EXPECT_EQ(cpus, (std::vector<std::vector<int>>{{0, 1, 2}, {3, 4, 5}, {}}));
}

// What the launcher hands an instance, and what the instance makes of it.
TEST(TopologyTest, AnInstanceTakesThePlaceItIsHanded) {
  afd::InstancePlaces places;
  places.attention = {{{4, 5}, "mlx5_1"}, {{}, ""}};
  places.ffn = {{{}, "mlx5_0"}};
  EXPECT_EQ(places.args(true, 0), (std::vector<std::string>{"--cpus", "4,5", "--nic", "mlx5_1"}));
  EXPECT_EQ(places.args(true, 1), std::vector<std::string>{});
  EXPECT_EQ(places.args(false, 0), (std::vector<std::string>{"--nic", "mlx5_0"}));
  EXPECT_EQ(places.describe({{0, 3}, {2}}), "attention 0: CPUs 4,5, NIC mlx5_1; ffn 2: NIC mlx5_0");
  afd::EngineSpec spec;
  spec.transport.rdma_device = "auto";
  EXPECT_EQ(afd::placed(spec, {{}, "mlx5_1"}).transport.rdma_device, "mlx5_1");
  EXPECT_EQ(afd::placed(spec, {}).transport.rdma_device, "auto");
  EXPECT_TRUE(afd::placed(spec, {}).comm_cpus.empty());
}

TEST(TopologyTest, ThisMachineLoads) {
  Topology t = Topology::of_this_machine();
  ASSERT_FALSE(t.empty()) << t.why_empty();
  EXPECT_GE(t.numa_nodes(), 1);
}

}  // namespace
}  // namespace hetmesh
