// The registration path a region takes: the one each transport and memory kind lead to
// (TransportTest), and the verbs registration fallback order a step at a time
// (VerbsRegistrationFallbackTest, the RegistrationFallback cases).
#include "transport_support.hpp"

#include <hetmesh/transport/rdma_info.hpp>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

namespace hetmesh {
namespace {

using namespace transport_test;

TEST_P(TransportTest, RegistrationPathFollowsTheMemory) {
  RegistrationPath path = local_->region->path();
  bool addressable = GetParam().local == "cpu";
  switch (GetParam().kind) {
    case TransportKind::ipc:
      EXPECT_EQ(path, RegistrationPath::ipc_handle) << to_string(path);
      break;
    case TransportKind::tcp:
      EXPECT_EQ(path, addressable ? RegistrationPath::host : RegistrationPath::staging)
          << to_string(path);
      break;
    case TransportKind::verbs:
      // rxe has no dma-buf MRs and no peermem, so device memory falls back to staging.
      EXPECT_EQ(path, addressable ? RegistrationPath::host : RegistrationPath::staging)
          << to_string(path);
      break;
    case TransportKind::fabric:
      // tcp and shm reach host memory only: device memory goes through a host mirror.
      EXPECT_EQ(path, addressable ? RegistrationPath::host : RegistrationPath::staging)
          << to_string(path);
      break;
  }
}

// The verbs registration fallback order, a step at a time: host memory takes plain ibv_reg_mr;
// memory the host cannot address (asic_stub's) tries dma-buf when the provider supports it, then
// peermem when nvidia_peermem is loaded, then pinned host staging. Each step is forced by knobs
// that switch the steps before it off (or, for peermem, pretend it is loaded), in both processes;
// the test checks the path recorded for our region and the peer's, why, and that data still
// arrives intact both ways. On rxe (no dma-buf MRs: its fd -1 probe does not answer EBADF; no
// nvidia_peermem) device memory always ends in staging, by each of the routes.
class VerbsRegistrationFallbackTest : public TransportTest {
 protected:
  void SetUp() override {
    for (const std::string& knob : GetParam().knobs)
      setenv(knob.c_str(), "1", 1);
    TransportTest::SetUp();
  }
  void TearDown() override {
    TransportTest::TearDown();
    for (const std::string& knob : GetParam().knobs)
      unsetenv(knob.c_str());
  }
  bool knob(const char* name) const {
    const auto& knobs = GetParam().knobs;
    return std::find(knobs.begin(), knobs.end(), name) != knobs.end();
  }
};

// What the RDMA device the verbs transport opens (the first with an active port) offers.
RdmaDeviceInfo verbs_device() {
  for (const RdmaDeviceInfo& d : list_rdma_devices())
    if (d.error.empty() && d.port_state == "ACTIVE") return d;
  return {};
}

TEST_P(VerbsRegistrationFallbackTest, PathAndDataAtEachStep) {
  const Param& p = GetParam();
  RdmaDeviceInfo rdma = verbs_device();
  const Region& region = *local_->region;
  const std::string& why = region.path_reason();
  auto position = [&](const std::string& text) {
    size_t at = why.find(text);
    EXPECT_NE(at, std::string::npos) << "'" << text << "' is not in the reason: " << why;
    return at;
  };
  RegistrationPath expected;
  if (p.local == "cpu") {
    expected = RegistrationPath::host;
    position("ibv_reg_mr");
  } else {
    bool dmabuf = !knob("HETMESH_VERBS_DISABLE_DMABUF") && rdma.dmabuf_supported &&
                  local_->device.has(HM_CAP_DMABUF_EXPORT);
    bool peermem = !knob("HETMESH_VERBS_DISABLE_PEERMEM") &&
                   (rdma.peermem_present || knob("HETMESH_VERBS_ASSUME_PEERMEM"));
    expected = dmabuf ? RegistrationPath::dmabuf : RegistrationPath::staging;
    if (!dmabuf) {
      // Each step passed over says why, in the order tried.
      size_t dmabuf_at =
          knob("HETMESH_VERBS_DISABLE_DMABUF")
              ? position("disabled by HETMESH_VERBS_DISABLE_DMABUF")
              : position(rdma.dmabuf_supported ? "cannot export" : "dma-buf unsupported");
      size_t peermem_at = position("peermem: ");
      if (knob("HETMESH_VERBS_DISABLE_PEERMEM"))
        position("disabled by HETMESH_VERBS_DISABLE_PEERMEM");
      // asic_stub memory is PROT_NONE host pages that no peer-memory client claims: ibv_reg_mr
      // refuses it, with or without nvidia_peermem, and staging follows.
      if (peermem) position("peermem: ibv_reg_mr failed");
      size_t staging_at = position("staging through");
      EXPECT_LT(dmabuf_at, peermem_at) << why;
      EXPECT_LT(peermem_at, staging_at) << why;
    }
  }
  EXPECT_EQ(region.path(), expected) << to_string(region.path()) << ": " << why;
  // The peer took the same steps with the same knobs.
  std::string peer(peer_region_.begin(), peer_region_.end());
  EXPECT_NE(peer.find(fmt::format("\"path\":\"{}\"", to_string(expected))), std::string::npos)
      << "peer region: " << peer;
  // Data arrives intact both ways: small, unaligned, and larger than a page at odd offsets.
  for (uint32_t value = 0; value < 5; ++value) {
    write(value);
    await_notification(value);
    expect_echo(value);
  }
}

std::vector<Param> fallback_steps() {
  const TransportKind v = TransportKind::verbs;
  return {{v, "cpu", "cpu", "host_memory", {}},
          {v, "asic_stub", "asic_stub", "natural_order", {}},
          {v, "asic_stub", "asic_stub", "dmabuf_off", {"HETMESH_VERBS_DISABLE_DMABUF"}},
          {v,
           "asic_stub",
           "asic_stub",
           "dmabuf_off_peermem_tried",
           {"HETMESH_VERBS_DISABLE_DMABUF", "HETMESH_VERBS_ASSUME_PEERMEM"}},
          {v,
           "asic_stub",
           "asic_stub",
           "dmabuf_and_peermem_off",
           {"HETMESH_VERBS_DISABLE_DMABUF", "HETMESH_VERBS_DISABLE_PEERMEM"}}};
}

INSTANTIATE_TEST_SUITE_P(RegistrationFallback, VerbsRegistrationFallbackTest,
                         testing::ValuesIn(fallback_steps()), param_name);

}  // namespace
}  // namespace hetmesh
