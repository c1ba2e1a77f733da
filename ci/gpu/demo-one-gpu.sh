#!/usr/bin/env bash
# Runs THERE, on the one-GPU machine, after ci/gpu/build-and-test.sh has built build/gpu: the demo
# with its F instance on a device whose memory the host cannot touch, by both routes of
# hetmesh/demo_experts.h, each verified against the single-process reference:
#   1. A on cpu:0, F on cuda:0: the cuda plugin's kernel library, libhetmesh-demo-cuda.so;
#   2. A on cuda:0, F on rocm:0 (the rocm plugin through hip-on-cuda, not AMD hardware), which has
#      no kernel library: its experts run on the host through staging.
# Results go to $OUT/demo-one-gpu-*.log.
#
#   run(carry=[".deps/gpu"], command="bash ci/gpu/build-and-test.sh; bash ci/gpu/demo-one-gpu.sh")
set -uo pipefail
cd "$(dirname "$0")/../.."
source ci/gpu/configure.sh  # the preamble: OUT, the log, deps, build, section
root=$PWD
status=0
cmake --build "$build" -j "$(nproc)" --target hetmesh-cli hetmesh-demo-cuda || { echo "build failed"; exit 2; }

work=$(mktemp -d)
demo() {  # demo NAME ATTENTION FFN EXPECTED-LOG-LINE [env...]
  local name=$1 attention=$2 ffn=$3 expected=$4
  shift 4
  sed -e "s/^attention = \"cpu:0\"/attention = \"$attention\"/" -e "s/^ffn = \"cpu:0\"/ffn = \"$ffn\"/" \
    "$root/examples/configs/1a1f-cpu-ipc.toml" >"$work/$name.toml"
  printf '\n==== demo %s: A %s, F %s ====\n' "$name" "$attention" "$ffn"
  (cd "$work" && env HETMESH_LOG=info "$@" timeout -k 5 120 "$build/bin/hetmesh" demo --config "$work/$name.toml") \
    >"$OUT/demo-one-gpu-$name.log" 2>&1
  local rc=$?
  grep -E "experts run|^verified" "$OUT/demo-one-gpu-$name.log"
  if [[ $rc -ne 0 ]] || ! grep -q "$expected" "$OUT/demo-one-gpu-$name.log" ||
    ! grep -q "^verified:" "$OUT/demo-one-gpu-$name.log"; then
    echo "FAILED: demo $name (exit $rc), see demo-one-gpu-$name.log"
    tail -20 "$OUT/demo-one-gpu-$name.log"
    status=1
  fi
}
demo cuda-kernels cpu:0 cuda:0 "cuda:0: experts run by .*libhetmesh-demo-cuda.so"
if [[ -f $build/lib/hetmesh/hip-on-cuda/libamdhip64.so.5 ]]; then
  demo rocm-staged cuda:0 rocm:0 "rocm:0: experts run on the host through staging" \
    LD_LIBRARY_PATH="$build/lib/hetmesh/hip-on-cuda:$LD_LIBRARY_PATH"
fi
rm -rf "$work"
exit $status
