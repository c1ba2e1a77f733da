#!/usr/bin/env bash
# Runs THERE, on the two-GPU machine, after ci/gpu/build-and-test.sh has built build/gpu:
#   1. `hetmesh demo` with A on cuda:0 and F on cuda:1 over ipc, with A on cuda:0 and F on
#      asic_stub, and with A on the rocm plugin (through hip-on-cuda) and F on cuda:1 (each
#      verifies the final hidden states against the single-process reference);
#   2. `hetmesh bench afd` with StepMesh's per-A traffic between cuda:0 and cuda:1, and in the
#      same run the baselines of hetmesh-cuda-baselines: the raw cudaMemcpyPeerAsync pair and
#      NCCL ncclSend/ncclRecv on the same sizes and GPUs;
#   3. compute interference: a compute-bound kernel on cuda:1 alone, while NCCL moves the AFD
#      traffic, and while hetmesh does.
# Results go to $OUT: afd.log, demo-*.log, bench-afd.json, baselines-*.json, summary.txt.
#
#   run(kind="nvidia-h200-x2", carry=[".deps/gpu"], timeout_s=600,
#       command="bash ci/gpu/build-and-test.sh; bash ci/gpu/afd.sh")
set -uo pipefail
cd "$(dirname "$0")/../.."
source ci/gpu/configure.sh afd  # the preamble: OUT, the log, deps, build, section
root=$PWD
baselines=$build/libexec/hetmesh/hetmesh-cuda-baselines
status=0

cmake --build "$build" -j "$(nproc)" --target hetmesh-cli hetmesh-demo-cuda hetmesh-cuda-baselines \
  || { echo "build failed"; exit 2; }
cmake --build "$build" -j "$(nproc)" --target hetmesh-device-rocm hetmesh-hip-on-cuda 2>/dev/null ||
  echo "no rocm plugin or hip-on-cuda (no HIP headers carried): the rocm demo is skipped"

work=$(mktemp -d)
for config in 1a1f-cuda-ipc 2a2f-cuda-asic_stub-ipc; do
  section "hetmesh demo --config examples/configs/$config.toml"
  (cd "$work" && timeout -k 5 120 "$hetmesh" demo --config "$root/examples/configs/$config.toml") \
    2>&1 | tee "$OUT/demo-$config.log"
  [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
done

# Two vendors' plugins in one job: A on the rocm plugin (on these NVIDIA GPUs through hip-on-cuda,
# plugins/rocm/tools: not AMD hardware), F on the cuda plugin.
if [[ -f $build/lib/hetmesh/hip-on-cuda/libamdhip64.so.5 ]]; then
  config=1a1f-rocm-cuda-ipc
  section "hetmesh demo --config examples/configs/$config.toml (rocm on hip-on-cuda)"
  (cd "$work" && LD_LIBRARY_PATH=$build/lib/hetmesh/hip-on-cuda:$LD_LIBRARY_PATH \
    timeout -k 5 120 "$hetmesh" demo --config "$root/examples/configs/$config.toml") \
    2>&1 | tee "$OUT/demo-$config.log"
  [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
fi

section "hetmesh bench afd: A cuda:0, F cuda:1, StepMesh per-A traffic, 1 micro-batch"
bench_config=$root/examples/configs/stepmesh-1a1f-cuda.toml
(cd "$work" && timeout -k 5 180 "$hetmesh" bench afd --config "$bench_config" --iterations 20000 \
  --warmup 500 --no-bare --json "$OUT/bench-afd.json") || status=1

section "baselines, same run: cudaMemcpyPeerAsync pair and NCCL send/recv, same sizes and GPUs"
timeout -k 5 120 "$baselines" roundtrip --a 0 --f 1 --iterations 20000 | tee "$OUT/baselines-roundtrip.json" \
  || status=1

section "interference: compute kernel on cuda:1 alone and while NCCL moves the traffic (one process)"
timeout -k 5 180 "$baselines" interference --a 0 --f 1 --kernels 300 | tee "$OUT/baselines-interference-nccl.json" \
  || status=1

section "interference: the same kernel (its own process) alone, then while hetmesh moves the traffic"
timeout -k 5 60 "$baselines" compute --f 1 --seconds 3 | tee "$OUT/compute-alone.json" || status=1
(cd "$work" && exec timeout -k 5 240 "$hetmesh" bench afd --config "$bench_config" --iterations 100000 \
  --warmup 2000 --no-bare --json "$OUT/bench-afd-during-compute.json" \
  >"$OUT/bench-afd-during-compute.log" 2>&1) &
bench_pid=$!
sleep 3  # past process start and CUDA initialisation; the kernel then runs while the bench does
timeout -k 5 240 "$baselines" compute --f 1 --while-pid $bench_pid | tee "$OUT/compute-with-hetmesh.json" \
  || status=1
wait $bench_pid || status=1
tail -25 "$OUT/bench-afd-during-compute.log"

section summary
python3 "$root/ci/gpu/afd_summary.py" "$OUT" | tee "$OUT/summary.txt" || status=1
rm -rf "$work"
exit $status
