#!/usr/bin/env bash
# ci/check-layers.sh must pass on the repository and fail, naming the file, on each kind of
# violation planted in a scratch tree.
set -uo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
check=$repo/ci/check-layers.sh
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
failures=0

expect_pass() {
  if ! out=$(bash "$check" "$1" 2>&1); then
    echo "FAIL: expected no violation in $1, got:"
    echo "$out"
    failures=$((failures + 1))
  fi
}
# expect_violation NAME FILE CONTENT: a clean tree plus one planted file must fail naming FILE.
expect_violation() {
  local name=$1 file=$2 content=$3 tree=$scratch/$1
  mkdir -p "$tree/$(dirname "$file")"
  printf '%s\n' "$content" >"$tree/$file"
  if out=$(bash "$check" "$tree" 2>&1); then
    echo "FAIL [$name]: check-layers accepted $file"
    failures=$((failures + 1))
  elif ! grep -q "^$file:" <<<"$out"; then
    echo "FAIL [$name]: the report does not name $file:"
    echo "$out"
    failures=$((failures + 1))
  else
    echo "ok [$name]: $(head -n 1 <<<"$out")"
  fi
}

expect_pass "$repo"
mkdir -p "$scratch/clean/core/src"
printf '#include <hetmesh/core/log.hpp>\n' >"$scratch/clean/core/src/ok.cc"
expect_pass "$scratch/clean"

expect_violation core_up core/src/a.cc '#include <hetmesh/transport/transport.hpp>'
expect_violation core_afd core/include/hetmesh/core/a.hpp '#include "hetmesh/afd/engine.hpp"'
expect_violation backends_up backends/src/a.cc '  #  include <hetmesh/afd/job.hpp>'
expect_violation sdk_up sdk/include/hetmesh/plugin_kit/a.hpp '#include <hetmesh/core/error.hpp>'
expect_violation plugin_host plugins/cpu/a.cc '#include <hetmesh/core/device.hpp>'
expect_violation vendor afd/src/a.cc '#include <cuda_runtime.h>'
expect_violation relative backends/src/a.cc '#include "../../afd/src/wire.hpp"'
expect_violation naming core/include/hetmesh/device.hpp '// a public header outside hetmesh/core/'
expect_violation core_links core/CMakeLists.txt 'target_link_libraries(hetmesh PRIVATE hetmesh::transport)'
expect_violation afd_links afd/CMakeLists.txt 'target_link_libraries(hetmesh_afd PRIVATE hetmesh_demo)'
expect_violation example_lib examples/demo/CMakeLists.txt 'add_library(x STATIC x.cc)'
expect_violation example_src tools/CMakeLists.txt 'add_executable(x ../examples/x.cc)'

if ((failures)); then
  echo "$failures layer-check case(s) failed"
  exit 1
fi
echo "layer check: all cases behave"
