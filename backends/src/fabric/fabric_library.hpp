// libfabric, opened at the first use of the fabric transport (or of list_fabric_providers) rather
// than linked: loading it loads every provider's own libraries (psm2, infinipath, efa, ...), and
// some of those install signal handlers in any process they are loaded into, which a job that
// never names the fabric transport must not get. Only libfabric's few exported functions come from
// here; the rest of its API is inline calls through each object's operations table.
#pragma once

#include <rdma/fabric.h>

namespace hetmesh::detail {

struct FabricLibrary {
  decltype(&::fi_getinfo) getinfo;
  decltype(&::fi_freeinfo) freeinfo;
  decltype(&::fi_dupinfo) dupinfo;
  decltype(&::fi_fabric) fabric;
  decltype(&::fi_strerror) strerror;
};

// The library, opened once per process; throws Error(HM_ERR_NOT_SUPPORTED) naming the file and
// why it could not be opened (every later call says the same).
const FabricLibrary& fabric_library();

// fi_strerror's text for a positive libfabric error number.
inline const char* fabric_strerror(int error) {
  return fabric_library().strerror(error);
}

}  // namespace hetmesh::detail
