// libfabric is opened at the fabric transport's first use, never before: a process that uses
// another transport loads neither it nor the providers' own libraries it brings (psm2 and
// infinipath install signal handlers in whatever process loads them, which then print their own
// backtrace over the process's crash handling).
#include <hetmesh/transport/fabric_info.hpp>
#include <hetmesh/transport/transport.hpp>

#include <gtest/gtest.h>

#include <dlfcn.h>

namespace hetmesh {
namespace {

bool libfabric_loaded() {
  void* handle = dlopen("libfabric.so.1", RTLD_LAZY | RTLD_NOLOAD);
  if (handle != nullptr) dlclose(handle);
  return handle != nullptr;
}

TEST(FabricLoading, OnlyTheFabricTransportOpensLibfabric) {
  ASSERT_FALSE(libfabric_loaded()) << "the test itself must not link libfabric";
  TransportOptions options;
  options.kind = TransportKind::tcp;
  auto tcp = Transport::create(options);
  EXPECT_FALSE(libfabric_loaded()) << "a tcp transport loaded libfabric";

  options.kind = TransportKind::fabric;
  options.fabric_provider = "tcp";
  auto fabric = Transport::create(options);
  EXPECT_TRUE(libfabric_loaded());
  EXPECT_FALSE(list_fabric_providers().empty());
}

}  // namespace
}  // namespace hetmesh
