#!/usr/bin/env bash
# Runs THERE, on the GPU machine: round trips the device triggers (docs/device-triggered.md). The
# Python tests of the mode, then python3 -m hetmesh.bench_graph (the host's push_pull per layer,
# the device's rings issued eagerly, the same step captured in a CUDA graph and replayed, every
# answer checked) with A on cuda:0 and F on cpu:0 and on cuda:0, at 1 token and at StepMesh's
# per-A shape, and without GPU work between the layers; the PyTorch MoE example with each A's
# decode step captured in a CUDA graph. Output in $OUT/graph.log and $OUT/graph-*.json.
#
#   run(kind="nvidia-h200", carry=[".deps/gpu"], command="bash ci/gpu/graph.sh")
set -uo pipefail
cd "$(dirname "$0")/../.."
source ci/gpu/configure.sh graph  # the preamble: OUT, the log, deps, build, section

section build
build_gpu_python  # python, PYTHONPATH

section "pytest: the device-triggered mode and stream waits (cpu plugin)"
(cd python/tests && timeout -k 10 200 "$python" -m pytest -q -p no:cacheprovider \
  test_device_trigger.py test_stream_wait.py) || echo "pytest failed"

# A GPU per A (two As waiting in their streams on one GPU stall: docs/device-triggered.md).
gpus=$(nvidia-smi --list-gpus | wc -l)
if ((gpus >= 2)); then
  section "the PyTorch MoE example, each A's decode step captured in a CUDA graph (A cuda:r, F cpu:0)"
  timeout -k 10 200 "$python" examples/python/moe_layer.py --attention-device cuda --graph --steps 50
  echo "exit $?"
else
  section "the PyTorch MoE example with --graph: skipped, it needs a GPU per A ($gpus here)"
fi

for shape in "--tokens 1 --hidden 64" "--tokens 128 --hidden 7168"; do
  for ffn in cpu:0 cuda:0; do
    name=$(echo "$shape $ffn" | tr -c 'a-z0-9' '-')
    section "python3 -m hetmesh.bench_graph $shape, A cuda:0, F $ffn"
    timeout -k 10 150 "$python" -m hetmesh.bench_graph $shape --attention-device cuda:0 \
      --ffn-device "$ffn" --json "$OUT/graph-$name.json"
    echo "exit $?"
  done
done

# The exchange alone: no GPU work between the layers (each sends the first tokens again).
section "python3 -m hetmesh.bench_graph --no-chain, 128 x 7168, A cuda:0, F cpu:0"
timeout -k 10 150 "$python" -m hetmesh.bench_graph --tokens 128 --hidden 7168 --no-chain \
  --attention-device cuda:0 --ffn-device cpu:0 --json "$OUT/graph-no-chain.json"
echo "exit $?"
