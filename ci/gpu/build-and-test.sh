#!/usr/bin/env bash
# Runs THERE, on the GPU machine (the device `run` tool, with `carry: [".deps/gpu"]` from
# ci/gpu/fetch-deps.sh): builds hetmesh in build/gpu against the carried dependencies, then runs
# `hetmesh info`, the cuda plugin's unit test and the conformance kit over every plugin of the
# build (cuda, cpu, asic_stub: each device, and every ordered pair of devices, e.g.
# cuda:0 -> cpu:0 and cuda:0 -> asic_stub:1). Results go to $OUT (the run tool's folder):
#   build-and-test.log  everything below
#   environment.txt     nvidia-smi, toolchain and what /usr/include already has
#   info.txt            hetmesh info
#   cts.log, cts.xml    the CTS output and its JUnit XML
#   cts-summary.txt     the CTS summary table
#   cts-rocm-on-cuda.*  the CTS of the rocm plugin run on these GPUs through hip-on-cuda
#                       (plugins/rocm/tools), with the cpu plugin for the pairs
#   cts-level_zero-on-cuda.*  the CTS of the level_zero plugin through ze-on-cuda
#                       (plugins/level_zero/tools), paired with cuda, rocm-on-cuda, cpu, asic_stub
# Exit status: the CTS's (0 = conformant), or 2 when the build fails.
#
#   run(kind="nvidia-h200", carry=[".deps/gpu"], timeout_s=540, command="bash ci/gpu/build-and-test.sh")
set -uo pipefail
cd "$(dirname "$0")/../.."
source ci/gpu/configure.sh build-and-test  # the preamble: OUT, the log, deps, build, section

jobs=$(nproc)

section environment
{
  nvidia-smi --query-gpu=index,name,driver_version,pci.bus_id,memory.total --format=csv 2>&1
  nvidia-smi topo -m 2>&1 | head -20
  cmake --version | head -1
  ninja --version
  g++ --version | head -1
  /usr/local/cuda/bin/nvcc --version 2>&1 | tail -2
  echo "in /usr/include: $(ls /usr/include | grep -E 'gtest|gmock|fmt|toml|CLI|nlohmann|infiniband' | tr '\n' ' ')"
  echo "carried: $(tr '\n' ';' <"$deps/../PACKAGES" 2>/dev/null || echo 'nothing (.deps/gpu missing)')"
  echo "nproc $jobs, $(uname -r)"
} | tee "$OUT/environment.txt"

section configure
configure_gpu_build

section build
# What the CTS needs first (it must build); then the CLI, which `hetmesh info` needs.
cts_targets=(hetmesh-cts hetmesh-plugin-probe hetmesh-device-cuda hetmesh-device-cpu
  hetmesh-device-asic_stub cuda_plugin_test)
for p in wrong_major short_table missing_slot init_fails init_crashes no_entry newer_minor; do
  cts_targets+=("hetmesh-device-abi_$p")
done
cmake --build "$build" -j "$jobs" --target "${cts_targets[@]}" || exit 2
cmake --build "$build" -j "$jobs" --target hetmesh-cli || echo "hetmesh-cli did not build (the CTS does not need it)"
# The rocm plugin and hip-on-cuda, where the carried HIP headers were found.
cmake --build "$build" -j "$jobs" --target hetmesh-device-rocm hetmesh-hip-on-cuda 2>/dev/null ||
  echo "the rocm plugin or hip-on-cuda did not build (no HIP headers in .deps/gpu?)"
# The level_zero plugin and ze-on-cuda, where the carried Level Zero headers were found.
cmake --build "$build" -j "$jobs" --target hetmesh-device-level_zero hetmesh-ze-on-cuda 2>/dev/null ||
  echo "the level_zero plugin or ze-on-cuda did not build (no Level Zero headers in .deps/gpu?)"

section hetmesh info
if [[ -x $build/bin/hetmesh ]]; then
  HETMESH_LOG=info "$build/bin/hetmesh" info 2>&1 | tee "$OUT/info.txt"
fi

section cuda_plugin_test
timeout -k 10 120 "$build/bin/cuda_plugin_test" --gtest_brief=1 2>&1

section hetmesh-cts
# Every plugin of the build folder: no --plugin means the loader's own discovery.
timeout -k 10 420 "$build/bin/hetmesh-cts" --junit "$OUT/cts.xml" --gtest_brief=1 >"$OUT/cts.log" 2>&1
cts_status=$?
cat "$OUT/cts.log"
sed -n '/==== hetmesh-cts summary/,$p' "$OUT/cts.log" >"$OUT/cts-summary.txt"
section "hetmesh-cts: the rocm plugin on these NVIDIA GPUs, through hip-on-cuda"
# Not AMD hardware and not AMD's HIP runtime: the rocm plugin's own code (its HIP calls, its
# HM_WAIT_GEQ relay, the kit's GPU layer) with each HIP call done by the CUDA driver
# (plugins/rocm/tools/hip_on_cuda.cc says what differs), beside the cpu plugin for the pairs.
rocm_plugin=$build/lib/hetmesh/plugins/libhetmesh-device-rocm.so
hip_on_cuda=$build/lib/hetmesh/hip-on-cuda
rocm_status=0
if [[ -f $rocm_plugin && -f $hip_on_cuda/libamdhip64.so.5 ]]; then
  LD_LIBRARY_PATH=$hip_on_cuda:$LD_LIBRARY_PATH timeout -k 10 300 "$build/bin/hetmesh-cts" \
    --plugin "$rocm_plugin" --plugin "$build/lib/hetmesh/plugins/libhetmesh-device-cpu.so" \
    --junit "$OUT/cts-rocm-on-cuda.xml" --gtest_brief=1 >"$OUT/cts-rocm-on-cuda.log" 2>&1
  rocm_status=$?
  grep -E "FAILED|Failure|rocm" "$OUT/cts-rocm-on-cuda.log" | head -40
  sed -n '/==== hetmesh-cts summary/,$p' "$OUT/cts-rocm-on-cuda.log" | tee "$OUT/cts-rocm-on-cuda-summary.txt"
else
  echo "skipped: the rocm plugin or hip-on-cuda was not built"
fi

section "hetmesh-cts: the level_zero plugin on these NVIDIA GPUs, through ze-on-cuda"
# Not Intel hardware and not Intel's driver: the level_zero plugin's own code through Debian's
# real Level Zero loader, with each call of the driver done by the CUDA driver
# (plugins/level_zero/tools/ze_on_cuda.cc says what differs); every pair with cuda, rocm on
# hip-on-cuda, cpu and asic_stub.
level_zero_status=0
level_zero_plugin=$build/lib/hetmesh/plugins/libhetmesh-device-level_zero.so
ze_on_cuda=$build/lib/hetmesh/ze-on-cuda/libze_on_cuda.so
if [[ -f $level_zero_plugin && -f $ze_on_cuda ]]; then
  plugins=(--plugin "$level_zero_plugin")
  for p in cuda rocm cpu asic_stub; do
    [[ -f $build/lib/hetmesh/plugins/libhetmesh-device-$p.so ]] &&
      plugins+=(--plugin "$build/lib/hetmesh/plugins/libhetmesh-device-$p.so")
  done
  LD_LIBRARY_PATH=$hip_on_cuda:$LD_LIBRARY_PATH ZE_ENABLE_ALT_DRIVERS=$ze_on_cuda \
    timeout -k 10 420 "$build/bin/hetmesh-cts" "${plugins[@]}" \
    --junit "$OUT/cts-level_zero-on-cuda.xml" --gtest_brief=1 >"$OUT/cts-level_zero-on-cuda.log" 2>&1
  level_zero_status=$?
  grep -E "FAILED|Failure" "$OUT/cts-level_zero-on-cuda.log" | head -40
  sed -n '/==== hetmesh-cts summary/,$p' "$OUT/cts-level_zero-on-cuda.log" |
    tee "$OUT/cts-level_zero-on-cuda-summary.txt"
else
  echo "skipped: the level_zero plugin or ze-on-cuda was not built"
fi

section done
echo "hetmesh-cts exit status $cts_status; rocm through hip-on-cuda: $rocm_status;" \
  "level_zero through ze-on-cuda: $level_zero_status"
(( cts_status != 0 )) && exit $cts_status
(( rocm_status != 0 )) && exit $rocm_status
exit $level_zero_status
