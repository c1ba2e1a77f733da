#!/bin/sh
# PID 1 of the rxe VM (busybox ash). Built into the initramfs by ci/rxe-vm.sh, which keys its
# cache on a hash of this file: edit freely, the next run rebuilds the initramfs.
#
# It loads the modules listed in /etc/modules.load, mounts the host's / (9p, read-only) as the
# lower layer of a writable overlay at /host, mounts the results share (and any --rw shares) at the
# same absolute paths they have on the host, creates rxe0 on a veth pair, then runs the command
# script the host wrote into the results share, chrooted into /host. It records the exit code in
# the results share and powers off. The host watches the status files under rxe-vm/status/.
#
# Nothing here may block forever: the host kills the VM on its deadlines, and if this script dies
# the kernel panics (init exited) and -no-reboot with panic=-1 ends qemu.

export PATH=/bin
# The kernel gives init no console when the initramfs has no /dev/console: open it ourselves.
mount -t devtmpfs devtmpfs /dev
exec </dev/console >/dev/console 2>&1

log() { echo "rxe-vm[vm]: $*"; }

status=""  # rxe-vm/status inside the results share, once it is mounted

# Record why we failed where the host can read it, then power off. The host turns a missing
# exit-code file plus this error file into a clear message.
fail() {
  log "FAILED: $*"
  if [ -n "$status" ]; then
    echo "$*" >"$status/error"
    sync
  fi
  poweroff -f
  sleep 30  # poweroff -f does not return; if it ever does, exiting init panics the kernel
  exit 1
}

mount -t proc proc /proc
mount -t sysfs sysfs /sys
case " $(cat /proc/cmdline) " in *" rxevm.debug "*) set -x ;; esac
log "kernel $(uname -r) up"

# --- modules -------------------------------------------------------------------------------------
# One module name a line, in load order (the host resolved the files and dependencies). A module
# that fails to load is reported and skipped: what matters is checked below (9p, rxe).
while read -r mod; do
  [ -n "$mod" ] || continue
  out=$(insmod "/lib/modules/$mod.ko" 2>&1) || log "insmod $mod: ${out:-failed}"
done </etc/modules.load
# "quiet" kept the boot silent; from here on show info messages (rxe's, and errors from tests).
echo 7 >/proc/sys/kernel/printk

# --- shares --------------------------------------------------------------------------------------
p9opts=trans=virtio,version=9p2000.L,msize=512000
mkdir -p /results
mount -t 9p -o "$p9opts" results /results || fail "cannot mount the results share (9p)"
status=/results/rxe-vm/status
[ -d "$status" ] || fail "the results share has no rxe-vm/status directory"
: >"$status/booted"
log "booted"

# Per-run settings the host wrote: RXE_RESULTS, RXE_RW_COUNT, RXE_RW_<n>, RXE_SCRIPT, RXE_IP.
[ -r /results/rxe-vm/vm.conf ] || fail "rxe-vm/vm.conf is missing from the results share"
# shellcheck disable=SC1091 # written by the host at run time
. /results/rxe-vm/vm.conf

mkdir -p /hostro /upper /host
mount -t 9p -o "$p9opts,ro" hostroot /hostro || fail "cannot mount the host root share (9p)"

# A writable root whose writes are thrown away: tests may write next to their binaries (ctest
# writes Testing/, tools write ~/.cache) without touching the host. Fall back to the read-only
# share (plus the tmpfs mounts below) if this kernel cannot overlay 9p.
mount -t tmpfs -o mode=0755 tmpfs /upper
mkdir -p /upper/data /upper/work
if mount -t overlay -o lowerdir=/hostro,upperdir=/upper/data,workdir=/upper/work overlay /host 2>/dev/null; then
  log "host root: 9p (read-only) + overlay (writes are discarded)"
else
  log "host root: 9p, read-only (overlay unavailable)"
  mount -o bind /hostro /host
fi

mount -t proc proc /host/proc
mount -t sysfs sysfs /host/sys
mkdir -p /dev/pts /dev/shm
mount -t devpts -o newinstance,ptmxmode=0666 devpts /dev/pts
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
mount -o rbind /dev /host/dev  # the same devtmpfs: /dev/infiniband/uverbs0 shows up in both
# /run belongs to the host's services; /tmp must be empty and writable even without the overlay.
mount -t tmpfs -o mode=0755 tmpfs /host/run
mount -t tmpfs -o mode=1777 tmpfs /host/tmp

# The results share and the --rw shares appear at their host paths (mounted after the tmpfs
# mounts, so paths under /tmp work). mkdir goes to the tmpfs or overlay.
bind_share() {  # host_path mounted_share
  mkdir -p "/host$1" 2>/dev/null
  mount -o bind "$2" "/host$1" || fail "cannot mount a share at $1"
}
bind_share "$RXE_RESULTS" /results
i=1
while [ "$i" -le "${RXE_RW_COUNT:-0}" ]; do
  path=""
  eval "path=\${RXE_RW_$i}"
  mkdir -p "/rw$i"
  mount -t 9p -o "$p9opts" "rw$i" "/rw$i" || fail "cannot mount the --rw share $path (9p)"
  bind_share "$path" "/rw$i"
  i=$((i + 1))
done

# --- soft-RoCE -----------------------------------------------------------------------------------
# busybox has no rdma, and its ip names veth peers wrongly: use the host's iproute2 through the
# chroot. Through env, because this static busybox runs its own applet for a bare "ip" even in
# the chroot (it prefers applets).
# rxe cannot bind to lo, so it sits on one end of a veth pair; both ends must be up for carrier.
# rxe0 serves every process (rxe loops back internally); GID 1 is ::ffff:$RXE_IP. rxe1, on a
# second pair at $RXE_IP2, is a second NIC for rails.
hostcmd() { chroot /host /usr/bin/env PATH=/usr/sbin:/usr/bin:/sbin:/bin "$@"; }
# One ip process for all of it: every exec in the chroot reads its binary and libraries over 9p,
# which costs a few tenths of a second under TCG. MTU 9000 lets rxe use a 4096-byte RoCE MTU, as
# on a jumbo-frame RoCE fabric (it would be 1024 at 1500).
out=$(hostcmd ip -batch - 2>&1 <<EOF
link set lo up
link add veth0 mtu 9000 type veth peer name veth1 mtu 9000
addr add $RXE_IP/24 dev veth0
link set veth1 up
link set veth0 up
link add veth2 mtu 9000 type veth peer name veth3 mtu 9000
addr add $RXE_IP2/24 dev veth2
link set veth3 up
link set veth2 up
EOF
) || fail "cannot set up lo and the veth pairs: $out"
[ -d /sys/module/rdma_rxe ] || fail "rdma_rxe is not loaded (see the insmod messages above)"
# A second rxe device on a second veth pair: a second NIC, for rails (one taken down by a test).
for pair in rxe0:veth0:uverbs0 rxe1:veth2:uverbs1; do
  rxe=${pair%%:*} netdev=${pair#*:} netdev=${netdev%%:*} uverbs=${pair##*:}
  out=$(hostcmd rdma link add "$rxe" type rxe netdev "$netdev" 2>&1) || fail "rdma link add $rxe: $out"
  # The IPv4-mapped GID appears when the address event reaches rxe; wait for it briefly.
  n=0
  until grep -q ":ffff:" "/sys/class/infiniband/$rxe/ports/1/gids/1" 2>/dev/null; do
    n=$((n + 1))
    [ "$n" -le 50 ] || fail "$rxe has no IPv4-mapped GID at index 1: $(cat "/sys/class/infiniband/$rxe/ports/1/gids/1" 2>&1)"
    sleep 0.1
  done
  [ -e "/dev/infiniband/$uverbs" ] || fail "$rxe is up but /dev/infiniband/$uverbs is missing"
  log "$rxe on $netdev, GID index 1 = $(cat "/sys/class/infiniband/$rxe/ports/1/gids/1")"
done
: >"$status/rxe-ready"

# --- the command ---------------------------------------------------------------------------------
log "running $RXE_SCRIPT"
chroot /host /bin/bash "$RXE_SCRIPT" </dev/null
rc=$?
log "command exited with $rc"
echo "$rc" >"$status/exit-code.tmp" && mv "$status/exit-code.tmp" "$status/exit-code"
sync
poweroff -f
sleep 30
