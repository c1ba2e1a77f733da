// Whether an address is this machine's: for `--instances here` and for which host of a job hosts
// its store.
#pragma once

#include <string>

namespace hetmesh::afd {

// Whether `host` (an address or a name) is one of this machine's: an address of one of its
// interfaces (getifaddrs), a loopback address, or the wildcard. (Not "a socket binds to it":
// with ip_nonlocal_bind every address would be.)
bool is_this_host(const std::string& host);

}  // namespace hetmesh::afd
