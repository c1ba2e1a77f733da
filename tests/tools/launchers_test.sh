#!/usr/bin/env bash
# `hetmesh run` started by real launchers (docs/launching.md): Open MPI's mpirun and torchrun (from
# Debian's python3-torch) each start the four processes of a 2A2F demo job on this host, each
# process takes its instance from the launcher's variables, rank 0 hosts the store, and each A
# verifies its final hidden states against the single-process reference. A launcher that starts
# a number of processes other than the job's is refused at once, naming the counts. Slurm's srun is not run here yet (docs/launching.md says so).
#
#   launchers_test.sh HETMESH CONFIG
set -uo pipefail
hetmesh=$1 config=$2
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
cd "$scratch" || exit 1
failures=0
fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}
port() { echo $((20000 + RANDOM % 20000)); }
verified() {  # $1 = what ran, $2 = its output: both As verified
  local count
  count=$(grep -c "verified: final hidden states" <<<"$2")
  [[ $count == 2 ]] || fail "$1: $count of 2 attention instances verified: $2"
}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1  # CI runs as root

if command -v mpirun >/dev/null; then
  echo "== mpirun -n 4"
  out=$(timeout -k 5 120 mpirun -n 4 --oversubscribe -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT="$(port)" \
    "$hetmesh" run --config "$config" 2>&1) || fail "mpirun -n 4 failed: $out"
  verified "mpirun -n 4" "$out"

  echo "== mpirun -n 3: refused, naming the counts (mpirun ends the others at the first)"
  out=$(timeout -k 5 60 mpirun -n 3 --oversubscribe -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT="$(port)" \
    "$hetmesh" run --config "$config" 2>&1) && fail "mpirun -n 3 of a 4-instance job succeeded"
  count=$(grep -c "openmpi started 3 processes (OMPI_COMM_WORLD_SIZE=3); the job has 2 attention + 2 ffn = 4 instances" <<<"$out")
  ((count >= 1)) || fail "mpirun -n 3: no process said why: $out"
else
  fail "no mpirun (Debian's openmpi-bin; ci/install-deps.sh installs it)"
fi

if command -v torchrun >/dev/null; then
  echo "== torchrun --nproc_per_node 4"
  # --redirects/--tee: Debian's torchrun (torch 1.13) fails with its defaults on Python 3.11.
  out=$(timeout -k 5 120 torchrun --nproc_per_node 4 --master_port "$(port)" --redirects 2 --tee 1 \
    --log_dir "$scratch/torchrun" --no_python "$hetmesh" run --config "$config" 2>&1) ||
    fail "torchrun failed: $out"
  verified "torchrun" "$out"
else
  fail "no torchrun (Debian's python3-torch)"
fi

echo "== no launcher: refused"
out=$(env -u RANK -u OMPI_COMM_WORLD_RANK -u SLURM_PROCID "$hetmesh" run --config "$config" 2>&1) &&
  fail "hetmesh run without a launcher succeeded"
grep -q "no launcher's variables here" <<<"$out" || fail "no launcher: not said: $out"

((failures == 0)) && echo "launchers_test: all passed"
exit $((failures > 0))
