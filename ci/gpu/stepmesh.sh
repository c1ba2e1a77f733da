#!/usr/bin/env bash
# Runs THERE, on the GPU machine: StepMesh's API on hetmesh (docs/stepmesh.md) with CUDA tensors.
# The StepMesh-style tests (python/tests/test_stepmesh.py) with every instance on cuda:0; StepMesh's
# own Python tests, unmodified, where fetch-deps.sh carried them (STEPMESH_SRC); and
# python3 -m hetmesh.bench_stepmesh (fserver_lib against hetmesh's own Python path, the same bytes)
# on cuda:0 and on the host. Output in $OUT/stepmesh.log and $OUT/stepmesh-*.json.
#
#   STEPMESH_SRC=<checkout> bash ci/gpu/fetch-deps.sh   # here
#   run(kind="nvidia-h200", carry=[".deps/gpu"], command="bash ci/gpu/stepmesh.sh")
set -uo pipefail
cd "$(dirname "$0")/../.."
source ci/gpu/configure.sh stepmesh  # the preamble: OUT, the log, deps, build, section

section build
build_gpu_python  # python, PYTHONPATH

section "pytest: StepMesh-style scenarios with CUDA tensors (every instance on cuda:0)"
(cd python/tests && HM_TEST_STEPMESH_DEVICE=cuda timeout -k 10 300 "$python" -m pytest -q \
  -p no:cacheprovider test_stepmesh.py) || echo "pytest failed"

# StepMesh's tests as its run_single_gpu.sh starts them (one scheduler, server and worker on GPU 0),
# fserver_lib being hetmesh's.
if [ -d .deps/gpu/stepmesh ]; then
  for test in .deps/gpu/stepmesh/test_fserver*.py; do
    section "StepMesh's $(basename "$test"), unmodified, 1 worker x 1 server on cuda:0"
    port=$((20000 + RANDOM % 20000))
    env_common=(DMLC_NUM_WORKER=1 DMLC_NUM_SERVER=1 DMLC_PS_ROOT_URI=127.0.0.1
                DMLC_PS_ROOT_PORT=$port STEPMESH_GPU=0 HETMESH_STEPMESH_MAX_BYTES=$((16 << 20)))
    env "${env_common[@]}" DMLC_ROLE=scheduler timeout -k 10 300 "$python" "$test" &
    env "${env_common[@]}" DMLC_ROLE=server timeout -k 10 300 "$python" "$test" >"$OUT/server.txt" &
    env "${env_common[@]}" DMLC_ROLE=worker timeout -k 10 300 "$python" "$test" | tail -3
    echo "worker exit ${PIPESTATUS[0]}"
    wait
    tail -3 "$OUT/server.txt"
  done
else
  echo "no StepMesh tests carried (STEPMESH_SRC=<checkout> bash ci/gpu/fetch-deps.sh)"
fi

for device in cuda cpu; do
  section "python3 -m hetmesh.bench_stepmesh --device $device (2A2F, StepMesh's shape)"
  timeout -k 10 300 "$python" -m hetmesh.bench_stepmesh --device "$device" \
    --json "$OUT/stepmesh-$device.json"
  echo "exit $?"
done
