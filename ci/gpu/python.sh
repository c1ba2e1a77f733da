#!/usr/bin/env bash
# Runs THERE, on the GPU machine (after ci/gpu/build-and-test.sh configured build/gpu, or alone):
# builds the Python package for that machine's python3 (its CUDA torch; pybind11's headers from
# the torch wheel, DLPack's from .deps/gpu), then runs the pytest suite, the PyTorch MoE example
# with A on cuda:0 and F on cpu:0, and python3 -m hetmesh.bench, hetmesh.bench_vllm and
# hetmesh.bench_queue on cpu and with A on cuda:0.
# Output in $OUT/python.log and $OUT/python-bench-*.json.
#
#   run(kind="nvidia-h200", carry=[".deps/gpu"], command="bash ci/gpu/python.sh")
set -uo pipefail
cd "$(dirname "$0")/../.."

OUT=${OUT:-$PWD/build/gpu-out}
mkdir -p "$OUT"
exec > >(tee "$OUT/python.log") 2>&1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

source ci/gpu/configure.sh  # deps, build, LD_LIBRARY_PATH, configure_gpu_build
python=$(command -v python3)
section() { printf '\n==== %s (%s) ====\n' "$*" "$(date +%T)"; }

section "python"
"$python" -c "import sys, sysconfig, torch; print(sys.version); print('include', sysconfig.get_paths()['include']); print('torch', torch.__version__, 'cuda', torch.cuda.is_available())" || exit 2
torch_include=$("$python" -c "import os, torch; print(os.path.join(os.path.dirname(torch.__file__), 'include'))")
# Only pybind11 from the wheel's include folder: it also has fmt and others, of other versions.
pybind11_include=$PWD/build/gpu-pybind11
mkdir -p "$pybind11_include" && ln -sfn "$torch_include/pybind11" "$pybind11_include/pybind11"
"$python" -c "import pytest; print('pytest', pytest.__version__)" || echo "no pytest here"

section configure
configure_gpu_build -DHETMESH_PYTHON="$python" -Dpybind11_DIR=/nonexistent \
  -DHETMESH_PYBIND11_INCLUDE_DIR="$pybind11_include"

section build
cmake --build "$build" -j "$(nproc)" --target hetmesh-python hetmesh-cli hetmesh-plugin-probe \
  hetmesh-device-cuda hetmesh-device-cpu hetmesh-device-asic_stub || exit 2
export PYTHONPATH=$build/python PYTHONDONTWRITEBYTECODE=1

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
for bench in bench bench_vllm bench_queue; do
  section "python3 -m hetmesh.$bench"
  for shape in "--tokens 1 --hidden 64" "--tokens 128 --hidden 7168"; do
    for device in cpu:0 cuda:0; do
      name=$(echo "$shape $device" | tr -c 'a-z0-9' '-')
      timeout -k 10 120 "$python" -m "hetmesh.$bench" $shape --attention-device "$device" \
        --json "$OUT/python-${bench//_/-}-$name.json"
    done
  done
done
