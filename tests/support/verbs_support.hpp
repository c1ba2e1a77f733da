// For tests that run over every transport: a verbs case is skipped where no RDMA device is
// usable, unless HM_TEST_REQUIRE_TRANSPORTS names verbs (ci/verbs-tests.sh, in the soft-RoCE VM),
// where an unusable verbs is a failure.
#pragma once

#include <hetmesh/core/error.hpp>
#include <hetmesh/transport/transport.hpp>

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

namespace hetmesh::test {

inline bool verbs_usable() {
  try {
    Transport::create(TransportOptions{TransportKind::verbs});
    return true;
  } catch (const Error&) {
    return false;
  }
}

inline bool verbs_required() {
  const char* required = std::getenv("HM_TEST_REQUIRE_TRANSPORTS");
  return required != nullptr && std::string(required).find("verbs") != std::string::npos;
}

}  // namespace hetmesh::test

// In a test body: skips (or fails, where verbs is required) a case over an unusable verbs.
#define HETMESH_SKIP_UNLESS_USABLE(kind)                                                        \
  do {                                                                                          \
    if ((kind) == ::hetmesh::TransportKind::verbs && !::hetmesh::test::verbs_usable()) {        \
      if (!::hetmesh::test::verbs_required())                                                   \
        GTEST_SKIP() << "no usable RDMA device (set HM_TEST_REQUIRE_TRANSPORTS=verbs to fail)"; \
      FAIL() << "verbs is required but unusable here";                                          \
    }                                                                                           \
  } while (0)
