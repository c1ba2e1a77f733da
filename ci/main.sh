#!/usr/bin/env bash
# The main job: builds hetmesh (Release) and runs the AFD demo. With no arguments that is 1A1F on
# the cpu plugin over ipc, as separate processes, checked against a single-process reference.
# Arguments go to `hetmesh demo`, e.g. --config examples/configs/2a2f-cpu-asic_stub-ipc.toml
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/install-deps.sh >/dev/null
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/hetmesh/ccache}
# Cache hits across checkouts in different folders (CI clones anew each time).
export CCACHE_BASEDIR=$PWD CCACHE_NOHASHDIR=1
cmake --preset release -DHETMESH_BUILD_TESTS=OFF >/dev/null
cmake --build --preset release
build/release/bin/hetmesh demo "$@"
