#!/usr/bin/env bash
# Runs THERE, on the GPU machine (after ci/gpu/build-and-test.sh configured build/gpu, or alone):
# builds the Python package for that machine's python3 (its CUDA torch; pybind11's headers from
# the torch wheel, DLPack's from .deps/gpu), then runs the pytest suite, the PyTorch MoE example
# with A on cuda:0 and F on cpu:0, and python3 -m hetmesh.bench, hetmesh.bench_vllm and
# hetmesh.bench_queue and hetmesh.bench_graph on cpu and with A on cuda:0.
# Output in $OUT/python.log and $OUT/python-bench-*.json.
#
#   run(kind="nvidia-h200", carry=[".deps/gpu"], command="bash ci/gpu/python.sh")
set -uo pipefail
cd "$(dirname "$0")/../.."
source ci/gpu/configure.sh python  # the preamble: OUT, the log, deps, build, section

build_gpu_python  # python, PYTHONPATH

section "hetmesh.devices()"
"$python" -c "import hetmesh; print(hetmesh.__version__); [print(d) for d in hetmesh.devices()]"

section "pytest (cpu plugin)"
(cd python/tests && timeout -k 10 300 "$python" -m pytest -q -p no:cacheprovider .) || echo "pytest failed"

section "the PyTorch MoE example, A on cuda:0, F on cpu:0"
timeout -k 10 200 "$python" examples/python/moe_layer.py --attention-device cuda:0 --ffn-device cpu:0
echo "exit $?"
section "the PyTorch MoE example, A on cpu:0, F on cpu:0"
timeout -k 10 200 "$python" examples/python/moe_layer.py
echo "exit $?"

# hetmesh.bench (Python against C++), hetmesh.bench_vllm (the vLLM connector against the bare
# engine) and hetmesh.bench_queue (layers queued against waited), each on a small and the StepMesh
# shape, A on cpu:0 and cuda:0.
for bench in bench bench_vllm bench_queue bench_graph; do
  section "python3 -m hetmesh.$bench"
  for shape in "--tokens 1 --hidden 64" "--tokens 128 --hidden 7168"; do
    for device in cpu:0 cuda:0; do
      name=$(echo "$shape $device" | tr -c 'a-z0-9' '-')
      timeout -k 10 120 "$python" -m "hetmesh.$bench" $shape --attention-device "$device" \
        --json "$OUT/python-${bench//_/-}-$name.json"
    done
  done
done
