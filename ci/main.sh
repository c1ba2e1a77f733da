#!/usr/bin/env bash
# The main job. Builds hetmesh (Release) and runs it on the cpu plugin. Until the AFD engine lands
# (issue 4: `hetmesh demo`), it lists the plugins, devices and capabilities the loader finds.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/install-deps.sh
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/hetmesh/ccache}
cmake --preset release -DHETMESH_BUILD_TESTS=OFF >/dev/null
cmake --build --preset release
build/release/bin/hetmesh info "$@"
