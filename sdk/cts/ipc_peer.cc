#include "ipc_peer.hpp"

#include "cts.hpp"

#include <hetmesh/core/hex.hpp>
#include <hetmesh/core/subprocess.hpp>

#include <cstdio>
#include <cstring>
#include <optional>

namespace hetmesh::cts {
namespace {

constexpr uint64_t kSize = (1 << 20) + 4096;
constexpr uint32_t kExporterSeed = 1234;
constexpr uint8_t kPeerFill = 0xc7;
constexpr int kWrongMappingKind = 7;  // the peer's exit status when HM-R38 is broken

}  // namespace

void expect_ipc_round_trip(const Device& exporter, const Device& importer,
                           const IpcRoundTrip& how) {
  Buffer buffer = exporter.allocate(kSize, how.kind);
  Buffer staging =
      exporter.allocate(kSize, exporter.has(HM_CAP_PINNED_HOST_MEMORY) ? MemoryKind::pinned_host
                                                                       : MemoryKind::device);
  std::vector<uint8_t> host(kSize);
  void* host_side = exporter.has(HM_CAP_PINNED_HOST_MEMORY) ? staging.data() : host.data();
  fill_pattern(host_side, kSize, kExporterSeed);
  Stream stream = exporter.create_stream();
  stream.copy(buffer.data(), host_side, kSize);
  stream.synchronize();

  hm_ipc_handle handle =
      ipc_export(exporter, static_cast<char*>(buffer.data()) + how.export_offset);
  ProcessResult child =
      run_process({env().self, "--cts-ipc-peer", importer.plugin().path(),
                   std::to_string(importer.index()), to_hex(handle.bytes), std::to_string(kSize),
                   std::to_string(kExporterSeed), std::to_string(how.peer_host_minor),
                   how.kind == MemoryKind::pinned_host ? "pinned" : "device"},
                  std::chrono::seconds(120));
  if (child.exit_code == kWrongMappingKind) HM_RULE("HM-R38");
  ASSERT_EQ(child.exit_code, 0) << "IPC peer process failed (" << child.describe()
                                << "): " << child.out << child.err;

  std::memset(host_side, 0, kSize);
  stream.copy(host_side, buffer.data(), kSize);
  stream.synchronize();
  const auto* bytes = static_cast<const uint8_t*>(host_side);
  for (uint64_t i = 0; i < kSize; ++i)
    ASSERT_EQ(bytes[i], kPeerFill) << "the peer's write is not visible at byte " << i;
}

int run_ipc_peer(int argc, char** argv) {
  if (argc != 9) {
    std::printf(
        "usage: --cts-ipc-peer PLUGIN DEVICE HANDLE_HEX SIZE SEED HOST_MINOR pinned|device\n");
    return 2;
  }
  try {
    const uint32_t host_minor = static_cast<uint32_t>(std::stoul(argv[7]));
    std::string refusal;
    std::shared_ptr<Plugin> plugin = load_plugin_file(argv[2], "", &refusal, host_minor);
    if (!plugin) {
      std::printf("plugin %s was refused: %s\n", argv[2], refusal.c_str());
      return 3;
    }
    Device device(plugin, std::stoi(argv[3]));
    hm_ipc_handle handle{};
    try {
      from_hex(argv[4], handle.bytes, "HANDLE_HEX");
    } catch (const Error& e) {
      std::printf("malformed handle: %s\n", e.what());
      return 2;
    }
    uint64_t size = std::stoull(argv[5]);
    uint32_t seed = static_cast<uint32_t>(std::stoul(argv[6]));

    // HM-R37: an allocation opened twice stays mapped until its last close (CUDA answers both
    // opens with one base and counts them); every check below runs on the second mapping.
    std::optional<IpcMapping> first(std::in_place, device, handle);
    IpcMapping mapping(device, handle);
    first.reset();
    PointerInfo info = device.query(static_cast<char*>(mapping.data()) + size - 1);
    bool host_pointer = info.kind == HM_MEM_IPC_MAPPED_HOST;
    if ((info.kind != HM_MEM_IPC_MAPPED && !host_pointer) || info.base != mapping.data()) {
      std::printf(
          "pointer_query on the mapping gave kind %d base %p (expected IPC_MAPPED or "
          "IPC_MAPPED_HOST, %p)\n",
          info.kind, info.base, mapping.data());
      return 4;
    }
    // HM-R38: a peer's pinned memory is a host pointer for a host that knows the kind, and
    // device memory never is.
    const bool pinned = std::strcmp(argv[8], "pinned") == 0;
    const uint32_t minor = plugin->negotiated_abi_minor();  // min(the host's, the plugin's)
    const int32_t expected = pinned && minor >= 1 ? HM_MEM_IPC_MAPPED_HOST : HM_MEM_IPC_MAPPED;
    if (info.kind != expected) {
      std::printf(
          "HM-R38: pointer_query reported %s for a peer's %s memory opened at ABI minor %u "
          "(the host's %u, the plugin's %u); expected %s\n",
          host_pointer ? "HM_MEM_IPC_MAPPED_HOST" : "HM_MEM_IPC_MAPPED",
          pinned ? "pinned host" : "device", minor, host_minor, plugin->plugin_abi_minor(),
          expected == HM_MEM_IPC_MAPPED_HOST ? "HM_MEM_IPC_MAPPED_HOST" : "HM_MEM_IPC_MAPPED");
      return kWrongMappingKind;
    }
    if (info.size != size) {
      std::printf(
          "HM-R24: pointer_query on the mapping gave size %llu, the exported allocation's is "
          "%llu\n",
          static_cast<unsigned long long>(info.size), static_cast<unsigned long long>(size));
      return 4;
    }
    // A mapping that claims to be a host pointer is read and written as one.
    if (host_pointer) {
      if (int64_t bad = find_mismatch(mapping.data(), size, seed); bad >= 0) {
        std::printf(
            "IPC_MAPPED_HOST (HM-R38): the host reads other bytes than the exporter's at "
            "offset %lld\n",
            static_cast<long long>(bad));
        return 5;
      }
    }
    std::vector<uint8_t> host(size);
    Stream stream = device.create_stream();
    stream.copy(host.data(), mapping.data(), size);
    stream.synchronize(std::chrono::seconds(60));
    if (int64_t bad = find_mismatch(host.data(), size, seed); bad >= 0) {
      std::printf("exporter's bytes differ at offset %lld\n", static_cast<long long>(bad));
      return 5;
    }
    if (host_pointer) {
      std::memset(mapping.data(), kPeerFill, size);
    } else {
      stream.fill(mapping.data(), kPeerFill, size);
      stream.synchronize(std::chrono::seconds(60));
    }
    return 0;
  } catch (const std::exception& e) {
    std::printf("%s\n", e.what());
    return 6;
  }
}

}  // namespace hetmesh::cts
