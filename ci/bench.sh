#!/usr/bin/env bash
# Runs the benchmarks of docs/benchmarks.md on this machine (Release build), each with its
# same-run baseline, and leaves JSON in build/bench/. Not part of the test command: timings on a
# shared 2-core machine are noisy, so only the ratios printed beside each figure mean anything.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/install-deps.sh >/dev/null
command -v ucx_perftest >/dev/null || apt-get install -y -qq ucx-utils >/dev/null  # ipc baseline
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/hetmesh/ccache}
cmake --preset release >/dev/null
cmake --build --preset release >/dev/null
out=build/bench
mkdir -p "$out"
bin=$PWD/build/release/bin/hetmesh

echo "== machine"; nproc; uptime; uname -r
echo "== ipc transport (baselines: memcpy, ucx_perftest UCX_TLS=sm,self)"
"$bin" bench transport --transport ipc --sizes 8 4K 64K 1M 2M --json "$out/transport-ipc.json"
echo "== tcp transport (baseline: memcpy)"
"$bin" bench transport --transport tcp --sizes 8 4K 64K 1M 2M --json "$out/transport-tcp.json"
echo "== AFD round trip, StepMesh's 2A2F shape, cpu plugin over ipc (baseline: memcpy)"
(cd "$out" && "$bin" bench afd --json afd-2a2f-ipc.json)
# ib_write_bw runs with our window as its queue depth (-t), right after our figure for each size.
echo "== verbs transport on soft-RoCE inside the VM (baselines: ib_write_bw, ib_write_lat)"
bash ci/rxe-vm.sh --timeout 1800 --rw "$PWD" -- "$bin" bench transport --transport verbs \
  --sizes 8 64K 1M 1835008 --iterations 50 --json "$PWD/$out/transport-verbs.json"
