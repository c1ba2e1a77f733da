// What libfabric offers on this host for the fabric transport, for `hetmesh info`: each provider
// and domain that has reliable datagrams with messages and RMA writes, with the limits the
// transport reads from it. Built without libfabric, list_fabric_providers() returns nothing;
// where libfabric cannot be opened at run time, it throws Error(HM_ERR_NOT_SUPPORTED) saying why.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

// Exported from the library, which hides every other symbol (core/README.md, "Exports").
#pragma GCC visibility push(default)

namespace hetmesh {

struct FabricProviderInfo {
  std::string provider;  // e.g. "tcp;ofi_rxm": what [transport] provider names
  std::string domain;    // e.g. "lo", "rxe0", "rdmap0s6-rdm"
  uint64_t max_message = 0;
  bool ordered = false;        // FI_ORDER_WAW and SAW: writes and notices go back to back
  bool device_memory = false;  // FI_HMEM: device memory could be registered (not used yet)
};

std::vector<FabricProviderInfo> list_fabric_providers();

}  // namespace hetmesh

#pragma GCC visibility pop
