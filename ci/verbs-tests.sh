#!/usr/bin/env bash
# The verbs (RDMA) tests, run inside the soft-RoCE VM by ci/test.sh:
#   bash ci/rxe-vm.sh -- bash ci/verbs-tests.sh BUILD_DIR
# A skipped verbs test is a failure here (HM_TEST_REQUIRE_TRANSPORTS).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build/ci}
export HM_TEST_REQUIRE_TRANSPORTS="verbs fabric"

echo "== hetmesh info (RDMA devices, limits, registration path)"
"$build/bin/hetmesh" info --in-process | sed -n '/RDMA devices/,/refused/p'

# A filter that matches nothing would pass silently: insist on the tests being there.
require_tests() {
  local n
  n=$("$1" --gtest_list_tests --gtest_filter="$2" | grep -c '^  ')
  ((n >= $3)) || { echo "verbs-tests: $1 has $n tests matching $2, expected at least $3" >&2; exit 1; }
}
# 41 = 9 cases x 4 memory pairings + the 5 registration fallback steps (and libfabric's verbs, and
# 18 over two rails); rails_test: striping, a rail cut, the lead cut, and the cut rail back, over verbs and over
# libfabric's verbs;ofi_rxm.
require_tests "$build/bin/transport_test" '*verbs*:-*fabric*' 41
require_tests "$build/bin/transport_test" 'RegistrationFallback/*verbs*' 5
require_tests "$build/bin/transport_test" '*fabric_verbs_ofi_rxm*' 36
require_tests "$build/bin/transport_test" '*verbs_rails*' 18
require_tests "$build/bin/rails_test" '*verbs*' 8
require_tests "$build/bin/write_more_test" '*verbs*' 4
require_tests "$build/bin/transport_selection_test" '*ThisHostAgreesWithSysfs*' 1
require_tests "$build/bin/afd_engine_test" '*verbs*' 2
require_tests "$build/bin/afd_fault_test" '*verbs*' 4
require_tests "$build/bin/afd_queue_test" '*verbs*' 3
require_tests "$build/bin/afd_caller_buffers_test" '*verbs*' 1
require_tests "$build/bin/afd_tensors_test" '*verbs*' 1

echo "== transport suite over verbs (registration fallback order included)"
"$build/bin/transport_test" --gtest_filter='*verbs*:-*fabric*' --gtest_brief=1

echo "== runs of writes with \`more\` over verbs: held, then posted together"
"$build/bin/write_more_test" --gtest_filter='*verbs*' --gtest_brief=1

echo "== rails over rxe0 and rxe1 (verbs, and libfabric's verbs;ofi_rxm): a striped write crosses both; rxe1's link taken down mid-stream, then rxe0's (the lead); back after its cooldown"
FI_UNIVERSE_SIZE=32 "$build/bin/rails_test" --gtest_filter='*verbs*' --gtest_brief=1

echo "== transport suite over libfabric's verbs provider (verbs;ofi_rxm on rxe0)"
# rxm sizes each verbs CQ for FI_UNIVERSE_SIZE peers (256 by default), beyond rxe's 32767 CQEs:
# "Unable to create verbs CQ" at fi_enable. A real NIC takes the default.
FI_UNIVERSE_SIZE=32 "$build/bin/transport_test" --gtest_filter='*fabric_verbs_ofi_rxm*' --gtest_brief=1

echo "== transport selection: auto must pick verbs (rxe0) for a peer on another node"
"$build/bin/transport_selection_test" --gtest_brief=1

echo "== AFD engine over verbs (every layer queued ahead, an F killed under the queue, side-band messages, the application's own buffers, extra tensors packed and landing in an F's own buffer)"
"$build/bin/afd_engine_test" --gtest_filter='*verbs*' --gtest_brief=1
"$build/bin/afd_queue_test" --gtest_filter='*verbs*' --gtest_brief=1
"$build/bin/afd_caller_buffers_test" --gtest_filter='*verbs*' --gtest_brief=1
"$build/bin/afd_tensors_test" --gtest_filter='*verbs*' --gtest_brief=1

echo "== faults and a replacement over verbs: an F or an A killed mid-run, survivors contained or failing by name, a replacement rejoining"
"$build/bin/afd_fault_test" --gtest_filter='*verbs*' --gtest_brief=1

echo "== hetmesh demo over verbs: A on cpu, F on asic_stub (staged registration)"
(cd /tmp && "$OLDPWD/$build/bin/hetmesh" demo --config "$OLDPWD/examples/configs/2a2f-cpu-asic_stub-verbs.toml")
