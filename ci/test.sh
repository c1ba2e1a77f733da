#!/usr/bin/env bash
# The test command: installs dependencies, builds with warnings as errors, runs the unit and
# end-to-end tests and the conformance kit, the AFD demo, the verbs tests inside a soft-RoCE VM,
# the out-of-tree template plugin against the installed SDK, and the ASan/UBSan build of core +
# cpu + asic_stub. Fails on the first failing step.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

step() { printf '\n==== %s ====\n' "$*"; }

step "dependencies"
bash ci/install-deps.sh

export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/hetmesh/ccache}
# Cache hits across checkouts in different folders (CI clones anew each time).
export CCACHE_BASEDIR=$PWD CCACHE_NOHASHDIR=1
export CCACHE_MAXSIZE=${CCACHE_MAXSIZE:-2G}
export CTEST_PARALLEL_LEVEL=${CTEST_PARALLEL_LEVEL:-$(nproc)}
# install-deps put etcd here: the tests over etcd must run, not skip.
export HM_TEST_REQUIRE_ETCD=1

step "layers: includes and links follow sdk < core < backends < afd < tools; no vendor header outside plugins/"
bash ci/check-layers.sh

step "format"
git ls-files '*.h' '*.hpp' '*.cc' '*.c' | xargs clang-format --dry-run -Werror

step "build (preset ci: RelWithDebInfo, -Werror)"
cmake --preset ci
cmake --build --preset ci
cmake --install build/ci >/dev/null

step "unit tests and the conformance kit (cpu, asic_stub and every pair of their devices)"
ctest --preset ci

step "hetmesh info"
build/ci-install/bin/hetmesh info

step "the main job: hetmesh demo (1A1F cpu over ipc; 2A2F cpu -> asic_stub and asic_stub -> cpu over ipc; 2A2F over tcp, over two tcp rails and over libfabric; 1A1F cpu -> level_zero on the host stand-in of Intel's driver)"
demo_dir=$(mktemp -d)
(cd "$demo_dir" && "$root/build/ci/bin/hetmesh" demo)
(cd "$demo_dir" && "$root/build/ci/bin/hetmesh" demo --config "$root/examples/configs/2a2f-cpu-asic_stub-ipc.toml")
(cd "$demo_dir" && "$root/build/ci/bin/hetmesh" demo --config "$root/examples/configs/2a2f-asic_stub-cpu-ipc.toml")
(cd "$demo_dir" && "$root/build/ci/bin/hetmesh" demo --config "$root/examples/configs/2a2f-cpu-tcp.toml")
(cd "$demo_dir" && "$root/build/ci/bin/hetmesh" demo --config "$root/examples/configs/2a2f-cpu-tcp-rails.toml")
(cd "$demo_dir" && "$root/build/ci/bin/hetmesh" demo --config "$root/examples/configs/2a2f-cpu-fabric.toml")
(cd "$demo_dir" && ZE_ENABLE_ALT_DRIVERS="$root/build/ci/lib/hetmesh/ze-host/libze_hetmesh_host.so" \
  "$root/build/ci/bin/hetmesh" demo --config "$root/examples/configs/1a1f-cpu-level_zero-ipc.toml")
rm -rf "$demo_dir"

step "verbs on real soft-RoCE: transport suite, AFD engine and demo inside the rxe VM"
# The checkout is shared into the VM at its own path, wherever it is (the VM hides /tmp).
bash ci/rxe-vm.sh --timeout 1800 --rw "$root" -- bash ci/verbs-tests.sh build/ci

step "template plugin, built out of tree against the installed SDK"
bash ci/test-template.sh "$root/build/ci-install" "$root/build/template"

step "ASan + UBSan build: core, cpu and asic_stub plugins (not the vendor plugins), unit tests, conformance kit"
cmake --preset asan
cmake --build --preset asan
# The preset's ASAN_OPTIONS turn leak checks on, and turn off GCC 12's __tls_get_addr interceptor:
# it takes a dynamic TLS block that happens to sit 16 bytes into a page for a pre-2.25 glibc one
# and sends LeakSanitizer's tracer to a bad address ("Tracer caught signal 11" after a test passed,
# on both tries; google/sanitizers#1322). Dynamic TLS stays scanned through the heap it lives in.
ctest --preset asan

step "all tests passed"
