// Transport selection (`auto`): ipc on the same node, else verbs when an RDMA device is usable,
// else tcp; a forced kind wins. The decision is checked on device records shaped like those
// list_rdma_devices() returns, then on this host itself against what sysfs says (inside the rxe VM
// that must be verbs on rxe0), then through the AFD job config that uses it.
#include <hetmesh/afd/job.hpp>
#include <hetmesh/core/subprocess.hpp>
#include <hetmesh/transport/selection.hpp>

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

namespace hetmesh {
namespace {

namespace fs = std::filesystem;

// An rxe-like port that verbs can use, as list_rdma_devices() reports one.
RdmaDeviceInfo active_device(const std::string& name) {
  RdmaDeviceInfo d;
  d.name = name;
  d.port = 1;
  d.port_state = "ACTIVE";
  d.link_layer = "Ethernet";
  d.active_mtu = 4096;
  d.gid_index = 1;
  d.gid = "::ffff:10.99.0.1";
  d.max_qp_wr = 1048576;
  d.max_sge = 32;
  d.max_inline = 256;
  d.max_mr_size = ~uint64_t{0};
  d.max_msg_sz = 8 << 20;
  return d;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

bool required(TransportKind kind) {
  const char* list = std::getenv("HM_TEST_REQUIRE_TRANSPORTS");
  return list && contains(list, to_string(kind));
}

TEST(ChooseTransport, ForcedKindIsTakenWhateverTheRest) {
  for (TransportKind kind : {TransportKind::ipc, TransportKind::tcp, TransportKind::verbs})
    for (bool same_node : {false, true}) {
      TransportSelectionInput input;
      input.forced = kind;
      input.same_node = same_node;
      input.rdma_devices = {active_device("rxe0")};
      TransportSelection choice = choose_transport(input);
      EXPECT_EQ(choice.kind, kind) << choice.reason;
      EXPECT_TRUE(contains(choice.reason, "forced")) << choice.reason;
    }
}

TEST(ChooseTransport, SameNodePicksIpcEvenWithUsableRdma) {
  TransportSelectionInput input;
  input.same_node = true;
  input.rdma_devices = {active_device("mlx5_0")};
  TransportSelection choice = choose_transport(input);
  EXPECT_EQ(choice.kind, TransportKind::ipc) << choice.reason;
}

TEST(ChooseTransport, OtherNodeWithUsableRdmaPicksVerbs) {
  TransportSelectionInput input;
  RdmaDeviceInfo down = active_device("mlx5_0");
  down.port_state = "DOWN";
  input.rdma_devices = {down, active_device("mlx5_1")};
  TransportSelection choice = choose_transport(input);
  EXPECT_EQ(choice.kind, TransportKind::verbs) << choice.reason;
  EXPECT_TRUE(contains(choice.reason, "mlx5_1")) << choice.reason;
}

TEST(ChooseTransport, OtherNodeWithoutUsableRdmaFallsBackToTcp) {
  TransportSelectionInput input;
  TransportSelection none = choose_transport(input);
  EXPECT_EQ(none.kind, TransportKind::tcp) << none.reason;
  EXPECT_TRUE(contains(none.reason, "no RDMA device")) << none.reason;

  RdmaDeviceInfo down = active_device("rxe0");
  down.port_state = "DOWN";
  RdmaDeviceInfo broken = active_device("rxe1");
  broken.error = "cannot open: Permission denied";
  RdmaDeviceInfo no_qp = active_device("rxe2");
  no_qp.max_inline = -1;
  input.rdma_devices = {down, broken, no_qp};
  TransportSelection choice = choose_transport(input);
  EXPECT_EQ(choice.kind, TransportKind::tcp) << choice.reason;
  // The reason names every device and why it was passed over.
  EXPECT_TRUE(contains(choice.reason, "rxe0 port 1: port 1 is DOWN")) << choice.reason;
  EXPECT_TRUE(contains(choice.reason, "Permission denied")) << choice.reason;
  EXPECT_TRUE(contains(choice.reason, "probe RC queue pair")) << choice.reason;
}

TEST(ChooseTransport, ConfiguredRdmaDeviceIsTheOnlyOneConsidered) {
  TransportSelectionInput input;
  input.rdma_devices = {active_device("rxe0")};
  input.rdma_device = "mlx5_0";
  TransportSelection choice = choose_transport(input);
  EXPECT_EQ(choice.kind, TransportKind::tcp) << choice.reason;
  EXPECT_TRUE(contains(choice.reason, "not the configured device mlx5_0")) << choice.reason;
  input.rdma_device = "rxe0";
  EXPECT_EQ(choose_transport(input).kind, TransportKind::verbs);
}

// Another process on this machine has the same node identity: ipc may connect them.
TEST(ChooseTransport, NodeIdentityIsSharedWithAnotherProcessOfThisHost) {
  std::string mine = node_identity();
  EXPECT_TRUE(contains(mine, "/")) << mine;
  EXPECT_FALSE(contains(mine, "unknown-boot")) << mine;
  ProcessResult child =
      run_process({self_executable(), "--node-identity"}, std::chrono::seconds(30));
  ASSERT_EQ(child.exit_code, 0) << child.describe() << child.err;
  EXPECT_EQ(child.out, mine + "\n");
}

// What sysfs says independently of libibverbs: the RDMA devices with an ACTIVE port (in sysfs's
// order, which is not the order libibverbs lists them in).
std::vector<std::string> sysfs_active_rdma_devices() {
  std::vector<std::string> active;
  std::error_code ec;
  for (const auto& device : fs::directory_iterator("/sys/class/infiniband", ec)) {
    for (const auto& port : fs::directory_iterator(device.path() / "ports", ec)) {
      std::string state;
      std::getline(std::ifstream(port.path() / "state"), state);
      if (contains(state, "ACTIVE")) {
        active.push_back(device.path().filename().string());
        break;
      }
    }
  }
  return active;
}

// On this host, a peer on another node gets verbs exactly when sysfs shows an active RDMA port
// (in the rxe VM: rxe0), else tcp.
TEST(ChooseTransport, ThisHostAgreesWithSysfs) {
  std::vector<std::string> active = sysfs_active_rdma_devices();
  bool rdma = !active.empty();
  TransportSelection choice = choose_transport(std::nullopt, /*same_node=*/false);
  if (required(TransportKind::verbs)) {
    ASSERT_TRUE(rdma) << "HM_TEST_REQUIRE_TRANSPORTS names verbs, but sysfs shows no active RDMA "
                         "port";
  }
  if (rdma) {
    EXPECT_EQ(choice.kind, TransportKind::verbs) << choice.reason;
    bool names_one = false;
    for (const std::string& device : active)
      names_one = names_one || contains(choice.reason, device);
    EXPECT_TRUE(names_one) << choice.reason << " names none of the devices sysfs shows active";
  } else {
    EXPECT_EQ(choice.kind, TransportKind::tcp) << choice.reason;
  }
  if (const char* vm = std::getenv("HETMESH_RXE_DEVICE")) {
    EXPECT_TRUE(contains(choice.reason, vm)) << choice.reason;
  }
  // The same node still prefers ipc.
  EXPECT_EQ(choose_transport(std::nullopt, /*same_node=*/true).kind, TransportKind::ipc);
}

// The AFD job config goes through the same function: `auto` is ipc (one host), a named one wins.
TEST(ChooseTransport, SingleHostJobUsesIt) {
  afd::JobConfig config;
  TransportSelection choice = afd::single_host_transport_choice(config);
  EXPECT_EQ(choice.kind, TransportKind::ipc) << choice.reason;
  EXPECT_TRUE(contains(choice.reason, "this node")) << choice.reason;
  for (TransportKind kind : {TransportKind::tcp, TransportKind::verbs, TransportKind::ipc}) {
    config.transport.kind = kind;
    EXPECT_EQ(afd::single_host_transport(config), kind);
    EXPECT_EQ(afd::engine_spec(config, afd::Role::attention, 0).transport.kind, kind);
  }
}

}  // namespace
}  // namespace hetmesh

int main(int argc, char** argv) {
  if (argc == 2 && std::strcmp(argv[1], "--node-identity") == 0) {
    std::cout << hetmesh::node_identity() << "\n";
    return 0;
  }
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
