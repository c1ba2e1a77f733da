#include "fabric/fabric_library.hpp"

#include <hetmesh/core/error.hpp>

#include <fmt/format.h>

#include <dlfcn.h>

#include <string>

namespace hetmesh::detail {
namespace {

// The runtime of the libfabric whose headers hetmesh was built with (Debian's libfabric1).
constexpr const char* kLibrary = "libfabric.so.1";

struct Loaded {
  FabricLibrary functions{};
  std::string failure;  // empty once loaded
};

template <typename Fn>
bool find(void* handle, const char* name, Fn& out, std::string& failure) {
  out = reinterpret_cast<Fn>(dlsym(handle, name));
  if (out == nullptr && failure.empty())
    failure = fmt::format("{} has no {} (it is older than libfabric 1.17?)", kLibrary, name);
  return out != nullptr;
}

Loaded load() {
  Loaded l;
  // Never closed: provider threads and handlers may outlive any one transport.
  void* handle = dlopen(kLibrary, RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* e = dlerror();
    l.failure = fmt::format("cannot load {}: {} (install libfabric, Debian's libfabric1)", kLibrary,
                            e ? e : "unknown error");
    return l;
  }
  FabricLibrary& f = l.functions;
  find(handle, "fi_getinfo", f.getinfo, l.failure);
  find(handle, "fi_freeinfo", f.freeinfo, l.failure);
  find(handle, "fi_dupinfo", f.dupinfo, l.failure);
  find(handle, "fi_fabric", f.fabric, l.failure);
  find(handle, "fi_strerror", f.strerror, l.failure);
  return l;
}

}  // namespace

const FabricLibrary& fabric_library() {
  static const Loaded loaded = load();
  if (!loaded.failure.empty()) throw Error(HM_ERR_NOT_SUPPORTED, "fabric: " + loaded.failure);
  return loaded.functions;
}

}  // namespace hetmesh::detail
