#!/usr/bin/env bash
# Runs a command inside a throwaway qemu VM whose (Debian) kernel has soft-RoCE, so CI can run real
# libibverbs tests on a host whose kernel has no RDMA. The VM sees the host's / (read-only, with
# a discarded writable overlay), the results directory and any --rw directories at their host
# paths, and two rxe devices: rxe0 on veth0 (10.99.0.1, GID index 1), and rxe1 on veth2
# (10.99.1.1), a second NIC for rails. See ci/rxe-vm/README.md.
#
#   bash ci/rxe-vm.sh [options] -- COMMAND [ARGS...]
#
#   --timeout SECONDS       kill the VM after this long, boot included (default 900)
#   --boot-timeout SECONDS  fail if the VM has not booted after this long (default 120)
#   --results DIR           writable in the VM at the same path; console log and status go to
#                           DIR/rxe-vm/ (default: a new directory under /tmp, kept)
#   --rw DIR                another host directory writable in the VM at the same path (repeatable)
#   --kernel VERSION        use linux-image-VERSION instead of linux-image-amd64's current one
#
# Environment: HETMESH_CACHE (cache root, default ~/.cache/hetmesh; the VM's files go to
# $HETMESH_CACHE/rxe-vm/), HETMESH_RXE_KERNEL (as --kernel), HETMESH_RXE_VM_DEBUG=1 (whole boot log,
# init traced). The command sees the host's exported environment plus HETMESH_RXE_VM=1,
# HETMESH_RXE_DEVICE=rxe0, HETMESH_RXE_GID_INDEX=1, HETMESH_RXE_IP=10.99.0.1, HETMESH_RXE_RESULTS.
#
# Exit status: the command's, or 124 when the VM ran out of time, or 125 when the harness or the VM
# failed before the command finished (the message says which, the console log stays).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
readonly here
readonly init_src=$here/rxe-vm/init.sh
readonly packages=(qemu-system-x86 busybox-static rdma-core ibverbs-providers ibverbs-utils perftest
  cpio iproute2 xz-utils)
# Load order from DESIGN.md §6, plus overlay. A module's own dependencies (its .modinfo) are loaded
# before it whatever this order says: 6.1's virtio needs virtio_ring first. rdma_rxe asks the
# crypto API for crc32 at run time, which is no module dependency: without crc32_generic it fails
# with "failed to init crc32". rdma_ucm (with rdma_cm) is for libfabric's verbs provider, which
# resolves addresses through librdmacm. Names missing from a kernel are skipped, except rdma_rxe.
readonly modules=(crc32_generic virtio virtio_ring virtio_pci_modern_dev virtio_pci_legacy_dev
  virtio_pci 9pnet 9pnet_virtio netfs fscache 9p overlay ib_core ib_uverbs udp_tunnel ip6_udp_tunnel
  rdma_rxe rdma_ucm veth)
readonly vm_ip=10.99.0.1 vm_ip2=10.99.1.1  # rxe0's and rxe1's

timeout_s=900
boot_timeout_s=120
results=""
rw_dirs=()
kernel_version=${HETMESH_RXE_KERNEL:-}
kernel_pinned=$kernel_version
cache_root=${HETMESH_CACHE:-$HOME/.cache/hetmesh}/rxe-vm

qemu_pid=""
tail_pid=""

log() { echo "rxe-vm: $*" >&2; }
die() {
  log "error: $*"
  exit 125
}
usage() {  # exit_status: the text is the comment at the top of this file
  sed -n '/^#   bash/,/^set -euo/p' "$0" | sed -n 's/^# \{0,1\}//p' >&"$(($1 ? 2 : 1))"
  exit "$1"
}

as_root() {
  if [[ $(id -u) -eq 0 ]]; then "$@"; else sudo "$@"; fi
}

apt_get() {
  # Bounded: a held dpkg lock or a dead mirror must not hang CI.
  DEBIAN_FRONTEND=noninteractive as_root timeout 900 apt-get -o DPkg::Lock::Timeout=300 "$@"
}

parse_args() {
  while (($#)); do
    case $1 in
      --timeout) timeout_s=${2:?--timeout needs a value}; shift 2 ;;
      --boot-timeout) boot_timeout_s=${2:?--boot-timeout needs a value}; shift 2 ;;
      --results) results=${2:?--results needs a directory}; shift 2 ;;
      --rw) rw_dirs+=("${2:?--rw needs a directory}"); shift 2 ;;
      --kernel) kernel_version=${2:?--kernel needs a version}; kernel_pinned=1; shift 2 ;;
      -h | --help) usage 0 ;;
      --) shift; break ;;
      *) log "unknown option: $1"; usage 2 ;;
    esac
  done
  (($#)) || { log "no command given"; usage 2; }
  [[ $timeout_s =~ ^[0-9]+$ && $boot_timeout_s =~ ^[0-9]+$ ]] || die "timeouts must be whole seconds"
  command_argv=("$@")
}

# --- host packages -------------------------------------------------------------------------------

ensure_packages() {
  local missing=() p
  for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  ((${#missing[@]})) || return 0
  log "installing ${missing[*]}"
  apt_get update -qq || log "apt-get update failed; trying the package lists we have"
  apt_get install -y -qq --no-install-recommends "${missing[@]}" >&2 ||
    die "cannot install ${missing[*]} (is Debian's package registry reachable?)"
  command -v qemu-system-x86_64 >/dev/null || die "qemu-system-x86_64 is missing after installing qemu-system-x86"
}

# --- kernel --------------------------------------------------------------------------------------

# Prints the version of the kernel linux-image-amd64 depends on now, e.g. 6.1.0-57-amd64.
current_kernel_version() {
  apt-cache depends linux-image-amd64 2>/dev/null |
    awk '$1 == "Depends:" && $2 ~ /^linux-image-.*-amd64$/ { sub(/^linux-image-/, "", $2); print $2; exit }'
}

# Newest kernel already complete in the cache, for when the registry cannot be asked.
newest_cached_kernel() {
  local d
  for d in "$cache_root"/*/.complete; do [[ -e $d ]] && basename "$(dirname "$d")"; done | sort -V | tail -n1
}

resolve_kernel_version() {
  [[ -z $kernel_pinned ]] || return 0
  kernel_version=$(current_kernel_version)
  if [[ -z $kernel_version ]]; then
    apt_get update -qq || true
    kernel_version=$(current_kernel_version)
  fi
  if [[ -z $kernel_version ]]; then
    kernel_version=$(newest_cached_kernel)
    [[ -n $kernel_version ]] || die "apt-cache depends linux-image-amd64 names no kernel, and none is cached"
    log "warning: cannot ask apt for the current kernel; using the cached $kernel_version"
  fi
}

download_kernel_deb() {  # dir
  # As root, apt's _apt sandbox user cannot write under $HOME: download as root instead.
  (cd "$1" && apt_get -o APT::Sandbox::User=root download "linux-image-$kernel_version" >&2)
}

# Downloads linux-image-$kernel_version into the cache once: the .deb (kept, so the initramfs can
# be rebuilt offline), vmlinuz and the kernel config, and leaves the unpacked package in root/ for
# build_initramfs. A kernel superseded in Debian is dropped from the cache.
fetch_kernel() {
  local retry=${1:-1} dir=$cache_root/$kernel_version
  if [[ ! -e $dir/.complete ]]; then
    rm -rf "$dir"
    mkdir -p "$dir/download"
    log "fetching linux-image-$kernel_version into $dir"
    if ! download_kernel_deb "$dir/download"; then
      rm -rf "$dir"
      [[ -z $kernel_pinned ]] || die "cannot download linux-image-$kernel_version (is Debian's package registry reachable?)"
      if ((retry)); then
        # Stale package lists name a kernel the mirror no longer has: refresh, ask again.
        log "download failed; updating the package lists and retrying"
        apt_get update -qq || true
        kernel_version=$(current_kernel_version)
        [[ -n $kernel_version ]] || die "apt-cache depends linux-image-amd64 names no kernel"
        fetch_kernel 0
        return
      fi
      local cached
      cached=$(newest_cached_kernel)
      [[ -n $cached ]] || die "cannot download linux-image-$kernel_version (is Debian's package registry reachable?), and no kernel is cached"
      log "warning: cannot download linux-image-$kernel_version; using the cached $cached"
      kernel_version=$cached
      dir=$cache_root/$kernel_version
    fi
  fi
  if [[ ! -e $dir/.complete ]]; then
    local deb
    deb=$(ls "$dir"/download/*.deb)
    rm -rf "$dir/root"
    dpkg -x "$deb" "$dir/root" || die "dpkg -x $deb failed"
    [[ -f $dir/root/boot/vmlinuz-$kernel_version ]] || die "$deb holds no boot/vmlinuz-$kernel_version"
    cp "$dir/root/boot/vmlinuz-$kernel_version" "$dir/vmlinuz"
    cp "$dir/root/boot/config-$kernel_version" "$dir/config" 2>/dev/null || true
    mv "$deb" "$dir/"
    rmdir "$dir/download"
    touch "$dir/.complete"
  fi
  # Drop superseded kernels, but only those no run has used for a day: a concurrent run may be
  # booting one right now.
  touch "$dir/.last-used"
  local old
  for old in "$cache_root"/*-amd64; do
    [[ -d $old && $old != "$dir" ]] || continue
    if [[ -z $(find "$old/.last-used" -mmin -1440 2>/dev/null) ]]; then
      log "removing the kernel $(basename "$old") from the cache (unused for a day)"
      rm -rf "$old"
    fi
  done
}

# --- initramfs -----------------------------------------------------------------------------------

# Prints the path of module NAME under the module tree, nothing if this kernel has no such file.
module_path() {
  local name=$1 moddir=$2 alt=${1//_/-}
  find "$moddir/kernel" \( -name "$name.ko" -o -name "$name.ko.*" -o -name "$alt.ko" -o -name "$alt.ko.*" \) \
    -print 2>/dev/null | head -n1
}

module_builtin() {
  grep -Eq "/(${1}|${1//_/-})\.ko$" "$2/modules.builtin" 2>/dev/null
}

# Prints module file $1 decompressed: busybox insmod wants a plain ELF, and Debian compresses
# modules from some version on (6.1 does not).
module_cat() {
  case $1 in
    *.ko) cat "$1" ;;
    *.ko.xz) xz -dc "$1" ;;
    *.ko.gz) gzip -dc "$1" ;;
    *.ko.zst) zstd -qdc "$1" ;;
    *) die "unknown module format: $1" ;;
  esac
}

# Queues module NAME for loading after the modules it depends on (its .modinfo "depends=", which
# is what modules.dep is made from; the .deb ships no modules.dep and depmod may be missing).
# Copies each queued module into $stage/lib/modules/NAME.ko.
declare -A queued=()
load_order=()
queue_module() {
  local name=$1 moddir=$2 stage=$3 file deps dep
  [[ -z ${queued[$name]:-} ]] || return 0
  queued[$name]=1
  file=$(module_path "$name" "$moddir")
  if [[ -z $file ]]; then
    if module_builtin "$name" "$moddir"; then
      log "module $name: built into $kernel_version"
    elif [[ $name == rdma_rxe ]]; then
      die "kernel $kernel_version has no rdma_rxe module: soft-RoCE is impossible with it"
    else
      log "module $name: not in kernel $kernel_version, skipped"
    fi
    return 0
  fi
  module_cat "$file" >"$stage/lib/modules/$name.ko"
  deps=$(tr '\0' '\n' <"$stage/lib/modules/$name.ko" | awk -F= '$1 == "depends" && !n++ { print $2 }')
  for dep in ${deps//,/ }; do queue_module "$dep" "$moddir" "$stage"; done
  load_order+=("$name")
}

# Builds (once per kernel, init script and module list) the initramfs: busybox, the modules and
# init.sh as /init. Prints its path.
build_initramfs() {
  local kdir=$cache_root/$kernel_version
  local moddir=$kdir/root/lib/modules/$kernel_version
  local key
  key=$( (cat "$init_src"; printf '%s\n' "${modules[@]}"; dpkg-query -W -f='${Version}' busybox-static) |
    sha256sum | cut -c1-16)
  local initrd=$kdir/initrd-$key.cpio.gz
  if [[ -s $initrd ]]; then
    rm -rf "$kdir/root"
    touch "$initrd"  # its mtime says when it was last used
    echo "$initrd"
    return 0
  fi
  log "building the initramfs ($initrd)"
  # Leftovers of an interrupted build, and initramfs images of other init scripts unused for a day
  # (not younger ones: another checkout may be booting one).
  rm -rf "$kdir"/stage.*
  find "$kdir" -maxdepth 1 -name 'initrd-*.cpio.gz' -mmin +1440 -delete
  local stage
  stage=$(mktemp -d "$kdir/stage.XXXXXX")
  mkdir -p "$stage"/{bin,dev,proc,sys,etc,lib/modules}
  cp "$(command -v busybox)" "$stage/bin/busybox"
  local applet
  for applet in $(busybox --list); do
    [[ $applet == busybox ]] || ln -sf busybox "$stage/bin/$applet"
  done
  install -m 0755 "$init_src" "$stage/init"

  [[ -d $kdir/root ]] || dpkg -x "$kdir"/linux-image-*.deb "$kdir/root" || die "cannot unpack the kernel package"
  local name
  for name in "${modules[@]}"; do queue_module "$name" "$moddir" "$stage"; done
  printf '%s\n' "${load_order[@]}" >"$stage/etc/modules.load"
  log "modules: $(tr '\n' ' ' <"$stage/etc/modules.load")"

  (cd "$stage" && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc -R 0:0 --quiet | gzip -6) >"$initrd.tmp"
  mv "$initrd.tmp" "$initrd"
  rm -rf "$stage" "$kdir/root"
  echo "$initrd"
}

# --- the run -------------------------------------------------------------------------------------

# Single-quotes $1 for the VM's busybox sh.
shq() { printf "'%s'" "${1//\'/\'\\\'\'}"; }

# qemu's option syntax doubles commas inside values.
qemu_path() { printf '%s' "${1//,/,,}"; }

# Writes the command script (bash, run chrooted in the VM) and the VM's settings.
write_run_files() {
  local script=$results/rxe-vm/run.sh name
  {
    echo "#!/bin/bash"
    echo "# Written by ci/rxe-vm.sh; run by the VM's init, chrooted into the host's /."
    # The host's exported environment, less what only makes sense in the host's session.
    for name in $(compgen -e); do
      case $name in
        PWD | OLDPWD | SHLVL | _ | SSH_* | XDG_RUNTIME_DIR | DBUS_SESSION_BUS_ADDRESS | DISPLAY | \
          WAYLAND_DISPLAY | TMUX* | STY | WINDOWID | BASH_FUNC_*) continue ;;
      esac
      [[ $name =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] || continue
      printf 'export %s=%q\n' "$name" "${!name}"
    done
    printf 'export HETMESH_RXE_VM=1 HETMESH_RXE_DEVICE=rxe0 HETMESH_RXE_GID_INDEX=1 HETMESH_RXE_IP=%s\n' "$vm_ip"
    printf 'export HETMESH_RXE_RESULTS=%q\n' "$results"
    printf 'cd %q || exit 125\n' "$PWD"
    printf 'exec'
    printf ' %q' "${command_argv[@]}"
    printf '\n'
  } >"$script"
  {
    echo "RXE_RESULTS=$(shq "$results")"
    echo "RXE_SCRIPT=$(shq "$script")"
    echo "RXE_IP=$vm_ip"
    echo "RXE_IP2=$vm_ip2"
    echo "RXE_RW_COUNT=${#rw_dirs[@]}"
    local i
    for i in "${!rw_dirs[@]}"; do echo "RXE_RW_$((i + 1))=$(shq "${rw_dirs[i]}")"; done
  } >"$results/rxe-vm/vm.conf"
}

# The VM mounts tmpfs on /tmp and /run, hiding the host's: the working directory must not be
# under them unless a share brings it back.
check_cwd_visible() {
  local d
  case $PWD/ in /tmp/* | /run/*) ;; *) return 0 ;; esac
  for d in "$results" "${rw_dirs[@]}"; do
    [[ $PWD/ == "$d"/* ]] && return 0
  done
  die "the working directory $PWD is under /tmp or /run, which the VM replaces with tmpfs: run from elsewhere or pass --rw $PWD"
}

# shellcheck disable=SC2317 # called from the EXIT trap
cleanup() {
  [[ -n $qemu_pid ]] && kill_qemu
  if [[ -n $tail_pid ]]; then
    kill "$tail_pid" 2>/dev/null || true
    wait "$tail_pid" 2>/dev/null || true
  fi
}

kill_qemu() {
  local pid=$qemu_pid i
  qemu_pid=""
  kill -TERM "$pid" 2>/dev/null || return 0
  for i in 1 2 3 4 5 6 7 8 9 10; do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.5
  done
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}

# Boots the VM, streams its console, enforces the deadlines. Sets vm_rc to the exit status.
run_vm() {
  local initrd=$1 kdir=$cache_root/$kernel_version
  local status=$results/rxe-vm/status console=$results/rxe-vm/console.log
  # HETMESH_RXE_VM_DEBUG=1: the whole boot log, and the VM's init traces its commands.
  local kernel_args=quiet
  [[ ${HETMESH_RXE_VM_DEBUG:-0} == 0 ]] || kernel_args="loglevel=7 rxevm.debug"
  # shellcheck disable=SC2054 # the commas belong to qemu's option syntax
  local args=(
    -accel tcg -cpu max -m 2048 -smp 2
    -nographic -monitor none -serial stdio -no-reboot -nic none
    -kernel "$kdir/vmlinuz" -initrd "$initrd"
    -append "console=ttyS0 panic=-1 $kernel_args"
    -fsdev "local,id=hostroot,path=/,security_model=none,readonly=on,multidevs=remap"
    -device virtio-9p-pci,fsdev=hostroot,mount_tag=hostroot
    -fsdev "local,id=results,path=$(qemu_path "$results"),security_model=none,multidevs=remap"
    -device virtio-9p-pci,fsdev=results,mount_tag=results
  )
  local i
  for i in "${!rw_dirs[@]}"; do
    args+=(-fsdev "local,id=rw$((i + 1)),path=$(qemu_path "${rw_dirs[i]}"),security_model=none,multidevs=remap"
      -device "virtio-9p-pci,fsdev=rw$((i + 1)),mount_tag=rw$((i + 1))")
  done

  : >"$console"
  local start=$SECONDS
  # stdin from /dev/null: qemu leaves the terminal alone and nothing can type into the VM.
  qemu-system-x86_64 "${args[@]}" </dev/null >>"$console" 2>&1 &
  qemu_pid=$!
  tail -n +1 -f --pid="$qemu_pid" "$console" &
  tail_pid=$!

  local booted=0 done_at="" verdict=""
  while kill -0 "$qemu_pid" 2>/dev/null; do
    local elapsed=$((SECONDS - start))
    if ((!booted)) && [[ -e $status/booted ]]; then
      booted=1
      log "VM booted in ${elapsed}s"
    fi
    if ((!booted && elapsed >= boot_timeout_s)); then
      verdict="boot-timeout"
      break
    fi
    if ((elapsed >= timeout_s)); then
      verdict="timeout"
      break
    fi
    # The command finished: give poweroff a few seconds, then stop waiting for it.
    if [[ -e $status/exit-code && -z $done_at ]]; then done_at=$SECONDS; fi
    if [[ -n $done_at ]] && ((SECONDS - done_at >= 15)); then
      log "warning: the VM did not power off after the command; killing it"
      break
    fi
    sleep 0.25
  done
  local qrc=0
  if kill -0 "$qemu_pid" 2>/dev/null; then
    kill_qemu
  else
    wait "$qemu_pid" || qrc=$?
    qemu_pid=""
  fi
  # tail follows qemu's pid and stops about a second after it, having printed the last lines.
  wait "$tail_pid" 2>/dev/null || true
  tail_pid=""

  if [[ $verdict == boot-timeout ]]; then
    fail_with 125 "the VM did not boot within ${boot_timeout_s}s (--boot-timeout); it was killed"
  elif [[ $verdict == timeout ]]; then
    fail_with 124 "timed out after ${timeout_s}s (--timeout); the VM was killed"
  elif [[ -s $status/exit-code ]]; then
    vm_rc=$(<"$status/exit-code")
    log "command exited with $vm_rc after $((SECONDS - start))s in the VM"
  elif [[ -s $status/error ]]; then
    fail_with 125 "the VM failed: $(<"$status/error")"
  elif ((!booted)); then
    fail_with 125 "qemu exited (status $qrc) before the VM booted"
  else
    fail_with 125 "the VM stopped (qemu status $qrc) before the command finished"
  fi
}

fail_with() {
  vm_rc=$1
  log "error: $2"
  log "console log: $results/rxe-vm/console.log"
}

main() {
  parse_args "$@"
  ensure_packages
  resolve_kernel_version
  mkdir -p "$cache_root"
  # One run at a time fills the cache; concurrent runs wait here instead of racing.
  exec 9>"$cache_root/.lock"
  flock -w 1200 9 || die "timed out waiting for the cache lock $cache_root/.lock"
  fetch_kernel
  local initrd
  initrd=$(build_initramfs)
  flock -u 9

  if [[ -z $results ]]; then
    results=$(mktemp -d /tmp/rxe-vm.XXXXXX)
  else
    mkdir -p "$results"
  fi
  results=$(realpath "$results")
  local i
  for i in "${!rw_dirs[@]}"; do
    [[ -d ${rw_dirs[i]} ]] || die "--rw ${rw_dirs[i]}: no such directory"
    rw_dirs[i]=$(realpath "${rw_dirs[i]}")
  done
  check_cwd_visible
  rm -rf "$results/rxe-vm"
  mkdir -p "$results/rxe-vm/status"
  write_run_files

  log "kernel $kernel_version, results in $results"
  trap cleanup EXIT
  trap 'log "interrupted"; exit 130' INT
  trap 'log "terminated"; exit 143' TERM
  run_vm "$initrd"
  exit "$vm_rc"
}

main "$@"
