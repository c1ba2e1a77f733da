#!/usr/bin/env bash
# Runs THERE, on the one-GPU machine, after ci/gpu/build-and-test.sh has built build/gpu: the
# heterogeneous data path between the GPU and other plugins' memory.
#   1. the transport suite's cuda pairs (ipc and tcp: cuda <-> cpu, cuda <-> cuda across two
#      processes, cuda -> asic_stub), odd sizes and offsets, many writes in flight, a peer killed;
#   2. `hetmesh bench transport` over ipc for cuda:0 -> cpu, cpu -> cuda:0, cuda:0 -> cuda:0 (two
#      processes on one GPU) and rocm (hip-on-cuda) -> cuda:0, each beside its same-run one-DMA
#      baseline (one memcpy_async by the source's plugin into pinned host memory, and its sync);
#   3. `hetmesh bench afd` with StepMesh's per-A traffic, A on cuda:0 and F on cpu:0;
#   4. small messages: `hetmesh bench transport` over ipc cpu -> cpu, twice, beside ucx_perftest
#      (ucp_put_bw and ucp_am_lat, UCX_TLS=sm,self; carried in .deps/gpu);
#   5. staged tcp: cuda:0 -> cpu, cpu -> cuda:0 and cuda:0 -> cuda:0 over tcp beside cpu -> cpu over
#      tcp in the same run (the tcp path's own ceiling).
# Results go to $OUT: data-path.log, transport-*.json, bench-afd.json.
#
#   run(kind="nvidia-h200", carry=[".deps/gpu"], timeout_s=600,
#       command="bash ci/gpu/build-and-test.sh >/dev/null; bash ci/gpu/data-path.sh")
set -uo pipefail
cd "$(dirname "$0")/../.."
source ci/gpu/configure.sh data-path  # the preamble: OUT, the log, deps, build, section
root=$PWD
status=0

cmake --build "$build" -j "$(nproc)" --target hetmesh-cli transport_test hetmesh-device-cpu \
  hetmesh-device-asic_stub hetmesh-device-cuda || { echo "build failed"; exit 2; }
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader

section "transport suite: the cuda pairs"
timeout -k 10 300 "$build/bin/transport_test" --gtest_filter='*cuda*' --gtest_brief=1 || status=1

work=$(mktemp -d)
bench_transport() {  # NAME MEMORY PEER_MEMORY [bench options...] [-- env...]
  local name=$1 memory=$2 peer=$3
  shift 3
  local options=() envs=()
  while (($#)) && [[ $1 != -- ]]; do options+=("$1"); shift; done
  (($#)) && shift && envs=("$@")
  section "hetmesh bench transport --transport ipc --memory $memory --peer-memory $peer ${options[*]}"
  (cd "$work" && env "${envs[@]}" timeout -k 5 120 "$hetmesh" bench transport --transport ipc \
    --memory "$memory" --peer-memory "$peer" --iterations 500 "${options[@]}" \
    --json "$OUT/transport-$name.json") || status=1
}
sizes=(--sizes 8 4K 64K 896K 1792K)
bench_transport cuda-to-cpu cuda:0 cpu "${sizes[@]}"
bench_transport cpu-to-cuda cpu cuda:0 "${sizes[@]}"
bench_transport cuda-to-cuda cuda:0 cuda:0 "${sizes[@]}"
# Two processes on one GPU again, under MPS (a daemon of this run's own, private pipe directory).
if command -v nvidia-cuda-mps-control >/dev/null; then
  mps=$(mktemp -d)
  export CUDA_MPS_PIPE_DIRECTORY=$mps/pipe CUDA_MPS_LOG_DIRECTORY=$mps/log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  if nvidia-cuda-mps-control -d; then
    bench_transport cuda-to-cuda-mps cuda:0 cuda:0 "${sizes[@]}"
    echo quit | nvidia-cuda-mps-control
  else
    echo "MPS did not start"
  fi
  unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
else
  echo "no nvidia-cuda-mps-control here: two processes on one GPU measured without MPS only"
fi
# Device memory of two plugins: through the staging ring, for several geometries.
hip_on_cuda=$build/lib/hetmesh/hip-on-cuda
if [[ -f $hip_on_cuda/libamdhip64.so.5 ]]; then
  for geometry in "4 2048" "8 1024" "16 512" "32 256"; do
    read -r slots kib <<<"$geometry"
    bench_transport "rocm-to-cuda-${slots}x${kib}" rocm:0 cuda:0 --sizes 64K 896K 1792K \
      --staging-slots "$slots" --staging-slot-kib "$kib" -- LD_LIBRARY_PATH="$hip_on_cuda:$LD_LIBRARY_PATH"
  done
fi

# ucx_perftest from .deps/gpu: its modules load from beside libucs (lib/x86_64-linux-gnu/ucx).
export PATH=$PWD/.deps/gpu/usr/bin:$PATH
command -v ucx_perftest >/dev/null || echo "no ucx_perftest carried: the ipc rows have no UCX baseline"
small=(--sizes 8 4K 64K 896K 1792K)
bench_transport cpu-to-cpu-1 cpu cpu "${small[@]}"
bench_transport cpu-to-cpu-2 cpu cpu "${small[@]}"
# The same stream with a notification on every 8th write only: what the notifications cost.
bench_transport cpu-to-cpu-notify8 cpu cpu --sizes 4K 64K --notify-every 8

bench_tcp() {  # NAME MEMORY PEER_MEMORY
  section "hetmesh bench transport --transport tcp --memory $2 --peer-memory $3"
  (cd "$work" && timeout -k 5 120 "$hetmesh" bench transport --transport tcp --memory "$2" \
    --peer-memory "$3" --sizes 64K 896K 1792K --iterations 300 --json "$OUT/tcp-$1.json") || status=1
}
bench_tcp cpu-to-cpu cpu cpu
bench_tcp cuda-to-cpu cuda:0 cpu
bench_tcp cpu-to-cuda cpu cuda:0
bench_tcp cuda-to-cuda cuda:0 cuda:0

section "hetmesh bench afd: StepMesh per-A traffic, A on cuda:0, F on cpu:0, slots and the application's buffers"
sed 's/^ffn = "cuda:1"/ffn = "cpu:0"/' "$root/examples/configs/stepmesh-1a1f-cuda.toml" \
  >"$work/stepmesh-1a1f-cuda-cpu.toml"
(cd "$work" && timeout -k 5 180 "$hetmesh" bench afd --config "$work/stepmesh-1a1f-cuda-cpu.toml" \
  --iterations 1000 --caller-buffers --json "$OUT/bench-afd.json") || status=1

rm -rf "$work"
section done
exit $status
