#!/usr/bin/env bash
# `hetmesh run` started by real launchers (docs/launching.md): Open MPI's mpirun, torchrun (from
# Debian's python3-torch) and Slurm's srun (a slurmctld, a slurmd and munged of this test's own,
# on loopback, as root) each start the four processes of a 2A2F demo job on this host, each
# process takes its instance from the launcher's variables, rank 0 hosts the store, and each A
# verifies its final hidden states against the single-process reference. A launcher that starts
# a number of processes other than the job's is refused at once, naming the counts.
#
#   launchers_test.sh HETMESH CONFIG
set -uo pipefail
hetmesh=$1 config=$2
scratch=$(mktemp -d)
daemons=()
stop_daemons() {
  [[ -n ${SLURM_CONF:-} ]] && scancel --user root >/dev/null 2>&1  # tasks of a timed-out srun
  for pid_file in "${daemons[@]}"; do
    [[ -f $pid_file ]] && kill "$(cat "$pid_file")" 2>/dev/null
  done
  sleep 0.2
  rm -rf "$scratch"
}
trap stop_daemons EXIT
trap 'exit 1' INT TERM  # ctest's timeout: the daemons go too (the EXIT trap)
cd "$scratch" || exit 1
failures=0
fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}
# Below the kernel's ephemeral range: a port there is never handed to another test's client
# socket or bind-to-0 between the check and the listen (once, srun's port was: CI failed).
ephemeral_low=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
port() {  # a port nothing listens on now, nor on the next
  local p  # the next: under torchrun, hetmesh's store takes MASTER_PORT + 1 (once taken: CI failed)
  for _ in $(seq 1 50); do
    p=$((10000 + RANDOM % (ephemeral_low - 10002)))
    [[ -z $(ss -Hltn "( sport = :$p or sport = :$((p + 1)) )" 2>/dev/null) ]] && break
  done
  echo "$p"
}
verified() {  # $1 = what ran, $2 = its output: both As verified
  local count
  count=$(grep -c "verified: final hidden states" <<<"$2")
  [[ $count == 2 ]] || fail "$1: $count of 2 attention instances verified: $2"
}
# torchrun --redirects 2 keeps each rank's stderr in LOG_DIR/<run>/attempt_0/<rank>/stderr.log.
stderr_of_ranks() {
  local log
  while IFS= read -r log; do
    printf '\n--- %s:\n%s' "${log#"$1"/}" "$(tail -n 30 "$log")"
  done < <(find "$1" -name stderr.log | sort)
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
    fail "torchrun failed: $out$(stderr_of_ranks "$scratch/torchrun")"
  verified "torchrun" "$out"
else
  fail "no torchrun (Debian's python3-torch)"
fi

# A Slurm cluster of this machine alone: munged with a key of its own, slurmctld and slurmd with
# a config of their own (SLURM_CONF), no cgroups; as root, which slurmd needs.
start_slurm() {
  local dir=$scratch/slurm$1 host
  host=$(hostname -s)
  mkdir -p "$dir"/{munge,state,spool,log}
  mungekey --create --keyfile="$dir/munge/munge.key" --force >/dev/null 2>&1 &&
    chmod 400 "$dir/munge/munge.key" || return 1
  munged --force --socket="$dir/munge/socket" --key-file="$dir/munge/munge.key" \
    --log-file="$dir/munge/log" --pid-file="$dir/munge/pid" --seed-file="$dir/munge/seed" || return 1
  daemons+=("$dir/munge/pid")
  local control slurmd_port
  control=$(port)
  slurmd_port=$(port)
  cat >"$dir/slurm.conf" <<CONF
ClusterName=hetmesh-test
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$control
SlurmdPort=$slurmd_port
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/socket
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
NodeName=$host NodeAddr=127.0.0.1 CPUs=$(nproc) State=UNKNOWN
PartitionName=test Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:8
CONF
  export SLURM_CONF=$dir/slurm.conf
  slurmctld -f "$SLURM_CONF" && daemons+=("$dir/slurmctld.pid") || return 1
  slurmd -f "$SLURM_CONF" && daemons+=("$dir/slurmd.pid") || return 1
  for _ in $(seq 1 300); do  # until the node is idle (at most 30 s: two busy CPUs are slow)
    [[ $(sinfo -h -o %t 2>/dev/null) == idle ]] && return 0
    sleep 0.1
  done
  echo "slurm: the node did not come up: $(sinfo 2>&1; tail -n 5 "$dir"/log/*.log)"
  return 1
}
# A second try on other ports, after the first try's daemons are gone (a port taken in between).
start_slurm_twice() {
  start_slurm 1 && return 0
  [[ -n ${SLURM_CONF:-} ]] && scancel --user root >/dev/null 2>&1
  for pid_file in "${daemons[@]}"; do
    [[ -f $pid_file ]] && kill "$(cat "$pid_file")" 2>/dev/null
  done
  daemons=()
  sleep 1
  echo "slurm: trying again on other ports"
  start_slurm 2
}

if [[ $(id -u) != 0 ]]; then
  fail "srun: slurmd needs root to start tasks here (CI runs as root)"
elif ! command -v slurmctld >/dev/null; then
  fail "no slurmctld (Debian's slurm-wlm; ci/install-deps.sh installs it)"
elif start_slurm_twice; then
  echo "== srun --ntasks 4"
  out=$(MASTER_ADDR=127.0.0.1 MASTER_PORT=$(port) timeout -k 5 120 srun --ntasks 4 --overcommit \
    "$hetmesh" run --config "$config" 2>&1) || fail "srun --ntasks 4 failed: $out"
  verified "srun --ntasks 4" "$out"
  echo "== srun --ntasks 3: refused, naming the counts"
  out=$(MASTER_ADDR=127.0.0.1 MASTER_PORT=$(port) timeout -k 5 60 srun --ntasks 3 --overcommit \
    "$hetmesh" run --config "$config" 2>&1) && fail "srun --ntasks 3 of a 4-instance job succeeded"
  grep -q "slurm started 3 processes (SLURM_NTASKS=3)" <<<"$out" ||
    fail "srun --ntasks 3: no process said why: $out"
else
  fail "the test's Slurm cluster did not start"
fi

echo "== no launcher: refused"
out=$(env -u RANK -u OMPI_COMM_WORLD_RANK -u SLURM_PROCID -u SLURM_CONF "$hetmesh" run --config "$config" 2>&1) &&
  fail "hetmesh run without a launcher succeeded"
grep -q "no launcher's variables here" <<<"$out" || fail "no launcher: not said: $out"

((failures == 0)) && echo "launchers_test: all passed"
exit $((failures > 0))
