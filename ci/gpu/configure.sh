# Sourced by every GPU-machine script from the repository root, as `source ci/gpu/configure.sh
# NAME`: the shared preamble. Sets OUT (created; what comes back from the machine) and, with NAME,
# tees the script's output into $OUT/NAME.log; keeps NVLink multicast off (it can take a shared
# host's GPUs out of service); sets deps, build, hetmesh and LD_LIBRARY_PATH; defines section().
# configure_gpu_build configures build/gpu against the carried .deps/gpu and the machine's CUDA;
# build_gpu_python builds the Python package.
OUT=${OUT:-$PWD/build/gpu-out}
mkdir -p "$OUT"
if [[ -n ${1:-} ]]; then exec > >(tee "$OUT/$1.log") 2>&1; fi
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
deps=$PWD/.deps/gpu/usr
build=$PWD/build/gpu
hetmesh=$build/bin/hetmesh
export LD_LIBRARY_PATH=$deps/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
section() { printf '\n==== %s (%s) ====\n' "$*" "$(date +%T)"; }

# configure_gpu_build [extra cmake arguments...]: exits 2 when .deps/gpu is missing or cmake fails.
configure_gpu_build() {
  if [[ ! -d $deps ]]; then
    echo ".deps/gpu is missing: run ci/gpu/fetch-deps.sh here first and carry .deps/gpu"
    exit 2
  fi
  local cuda_root
  cuda_root=$([[ -x /usr/local/cuda/bin/nvcc ]] && echo /usr/local/cuda)
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_PREFIX_PATH="$deps" \
    -DCMAKE_POLICY_VERSION_MINIMUM=3.5 -DHETMESH_WITH_CUDA=ON ${cuda_root:+-DCUDAToolkit_ROOT=$cuda_root} \
    -DHETMESH_BUILD_TESTS=ON "$@" || exit 2
}

# build_gpu_python: the Python package for the GPU machine's python3 (its CUDA torch; pybind11's
# headers from the torch wheel, DLPack's from .deps/gpu), the command and the cuda, cpu and
# asic_stub plugins. Sets python and PYTHONPATH; exits 2 on failure.
build_gpu_python() {
  python=$(command -v python3)
  "$python" -c "import sys, sysconfig, torch; print(sys.version); print('include', sysconfig.get_paths()['include']); print('torch', torch.__version__, 'cuda', torch.cuda.is_available())" || exit 2
  local torch_include pybind11_include
  torch_include=$("$python" -c "import os, torch; print(os.path.join(os.path.dirname(torch.__file__), 'include'))")
  # Only pybind11 from the wheel's include folder: it also has fmt and others, of other versions.
  pybind11_include=$PWD/build/gpu-pybind11
  mkdir -p "$pybind11_include" && ln -sfn "$torch_include/pybind11" "$pybind11_include/pybind11"
  "$python" -c "import pytest; print('pytest', pytest.__version__)" || echo "no pytest here"
  configure_gpu_build -DHETMESH_PYTHON="$python" -Dpybind11_DIR=/nonexistent \
    -DHETMESH_PYBIND11_INCLUDE_DIR="$pybind11_include"
  cmake --build "$build" -j "$(nproc)" --target hetmesh-python hetmesh-cli hetmesh-plugin-probe \
    hetmesh-device-cuda hetmesh-device-cpu hetmesh-device-asic_stub || exit 2
  export PYTHONPATH=$build/python PYTHONDONTWRITEBYTECODE=1
}
