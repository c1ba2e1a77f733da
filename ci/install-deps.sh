#!/usr/bin/env bash
# Installs the Debian 12 packages hetmesh builds and tests with. Idempotent and quick when they
# are already present.
set -euo pipefail

packages=(
  build-essential cmake ninja-build ccache pkg-config clang-format
  libfmt-dev libcli11-dev nlohmann-json3-dev libtomlplusplus-dev libssl-dev libcurl4-openssl-dev
  libhwloc-dev libmicrohttpd-dev  # hwloc: topology; libmicrohttpd: the metrics endpoint
  etcd-server etcd-client iproute2 openssl
  prometheus  # scrapes a running job in the test command (tests/tools/prometheus_test.sh)
  openmpi-bin slurm-wlm munge  # hetmesh run under mpirun and srun (tests/tools/launchers_test.sh)
  python3-dev pybind11-dev libdlpack-dev python3-pytest python3-numpy python3-torch
  python3-matplotlib python3-yaml  # python3 -m hetmesh.plot; examples/kubernetes checked
  libgtest-dev libgmock-dev libbenchmark-dev
  libibverbs-dev rdma-core ibverbs-providers
  libfabric-dev libfabric-bin  # the fabric transport; fi_pingpong is its bench baseline
  libamdhip64-dev libhsa-runtime-dev
  libze-dev libze1  # the level_zero plugin's headers; the loader its stand-in driver is loaded by
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
sudo_cmd=()
[[ $(id -u) -eq 0 ]] || sudo_cmd=(sudo)
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
