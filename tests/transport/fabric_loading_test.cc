// libfabric is opened at the fabric transport's first use, never before: a process that uses
// another transport loads neither it nor the providers' own libraries it brings (psm2 and
// infinipath install signal handlers in whatever process loads them, which then print their own
// backtrace over the process's crash handling).
#include <hetmesh/transport/fabric_info.hpp>
#include <hetmesh/transport/transport.hpp>

#include <gtest/gtest.h>

#include <hetmesh/core/error.hpp>

#include <dlfcn.h>

#include <cstdlib>
#include <string>

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

// libfabric's shm provider does not survive a killed peer (docs/failures.md): "auto" never takes
// it, even where it is the only provider, and says so; named, it is taken.
TEST(FabricLoading, AutoNeverChoosesShm) {
  if (libfabric_loaded()) GTEST_SKIP() << "needs a process where libfabric is not loaded yet";
  setenv("FI_PROVIDER", "shm", 1);  // read by libfabric when it loads
  TransportOptions options;
  options.kind = TransportKind::fabric;
  options.fabric_provider = "auto";
  try {
    Transport::create(options);
    ADD_FAILURE() << "\"auto\" took the shm provider";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), HM_ERR_NOT_SUPPORTED);
    EXPECT_NE(std::string(e.what()).find("found only libfabric's shm provider"), std::string::npos)
        << e.what();
  }
  options.fabric_provider = "shm";
  EXPECT_EQ(Transport::create(options)->kind(), TransportKind::fabric);
  unsetenv("FI_PROVIDER");
}

}  // namespace
}  // namespace hetmesh
