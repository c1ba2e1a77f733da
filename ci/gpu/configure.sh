# Sourced by the GPU machine's scripts (build-and-test.sh, python.sh): configures build/gpu
# against the carried .deps/gpu and the machine's CUDA, with the tests, plus the caller's
# arguments. Sets deps, build and LD_LIBRARY_PATH for the caller.
deps=$PWD/.deps/gpu/usr
build=$PWD/build/gpu
export LD_LIBRARY_PATH=$deps/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

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
