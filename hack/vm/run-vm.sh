#!/bin/bash
# run-vm.sh - boot the VM image from build-image.sh, drive it over ssh (127.0.0.1 hostfwd), reboot, reset, stop.
# Adapted from shared/recipes/vm. test/vm (the Go harness) runs `launch` and drives the rest itself; by hand:
#
#   run-vm.sh start                 fresh qcow2 overlay on top of the cached base image, boot, wait for ssh
#   run-vm.sh power-on              boot again on the existing overlay (after poweroff-and-wait or stop), wait for ssh
#   run-vm.sh launch                what start does up to the qemu exec, in the foreground, without waiting
#                                   (VM_REUSE_DISK=1: keep the overlay, as power-on does)
#   run-vm.sh ssh CMD...            run CMD in the guest as root (stdin forwarded), exit code propagated
#   run-vm.sh cp-in SRC... DST      scp host -> guest           run-vm.sh cp-out SRC DST   guest -> host
#   run-vm.sh reboot                'systemctl reboot' in guest, wait until boot_id changed and ssh is back
#   run-vm.sh wait-boot N           wait for boot marker number N+1 on the serial console, then ssh (a reboot the
#                                   guest started itself; N = `run-vm.sh boots` before it)
#   run-vm.sh boots                 how many boots (CI-READY markers) the serial log shows
#   run-vm.sh hard-reset            QEMU system_reset (power cut: no orderly shutdown, unsynced data lost), wait for ssh
#   run-vm.sh poweroff-and-wait     'systemctl poweroff' in guest, wait until qemu has exited (fails after
#                                   VM_SHUTDOWN_TIMEOUT); the overlay is kept for power-on
#   run-vm.sh stop                  orderly poweroff (timeout), then kill our qemu (by its pidfile) if needed
#   run-vm.sh kill                  QMP quit, then SIGKILL our qemu (by its pidfile)
#   run-vm.sh run SCRIPT [ARGS]     one-shot: start, copy SCRIPT in, run it, stop; exit code = SCRIPT's
#   run-vm.sh status
# Besides ssh, $VM_SHARE (default $VM_RUN_DIR/share) is mounted in the guest at /mnt/ci (virtio-9p).
#
# Network: QEMU user networking with restrict=on: the guest reaches nothing but what is forwarded here.
#   hostfwd 127.0.0.1:<VM_SSH_PORT> -> guest :22 (ssh, scp)
#   VM_API_FORWARD=127.0.0.1:PORT   guestfwd 10.0.2.100:6443 -> the host's 127.0.0.1:PORT (one relay process per
#                                   connection, hack/vm/relay); the image's /etc/hosts names 10.0.2.100 `kubernetes`,
#                                   a name in the test apiserver's serving certificate -> https://kubernetes:6443
#
# Env: VM_CACHE_DIR (${XDG_CACHE_HOME:-$HOME/.cache}/lifecycle-agent/vm), VM_RUN_DIR ($VM_CACHE_DIR/run), VM_MEM (1024),
#      VM_SMP (2), VM_ACCEL (auto|kvm|tcg), VM_CPU (default: host for kvm, max for tcg), VM_BOOT (pvh|bzimage),
#      VM_APPEND (extra kernel args), VM_SSH_PORT (auto), VM_BOOT_TIMEOUT (300), VM_CMD_TIMEOUT (900),
#      VM_SHUTDOWN_TIMEOUT (120), VM_SHARE, VM_API_FORWARD, VM_RELAY (relay binary; default: built with go into
#      $VM_CACHE_DIR/bin), VM_QEMU_EXTRA
# Host packages (Debian): qemu-system-x86 qemu-utils openssh-client python3 (+ go for the relay).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE=${VM_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/lifecycle-agent/vm}
RUN=${VM_RUN_DIR:-$CACHE/run}
SHARE=${VM_SHARE:-$RUN/share}
BOOT_TIMEOUT=${VM_BOOT_TIMEOUT:-300}
CMD_TIMEOUT=${VM_CMD_TIMEOUT:-900}
SHUTDOWN_TIMEOUT=${VM_SHUTDOWN_TIMEOUT:-120}
API_GUEST_ADDR=10.0.2.100   # /etc/hosts in the image (build-image.sh) maps it to `kubernetes`
API_GUEST_PORT=6443

log() { echo "[run-vm $(date +%T)] $*" >&2; }
die() { log "ERROR: $*"; [ -f "$RUN/serial.log" ] && { echo "--- last serial lines ($RUN/serial.log) ---" >&2; tail -n 25 "$RUN/serial.log" | tr -d '\r' >&2; }; exit 1; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN{printf "%.1f", b-a}'; }

qpid() { cat "$RUN/qemu.pid" 2>/dev/null || true; }
alive() { local p; p=$(qpid); [ -n "$p" ] && kill -0 "$p" 2>/dev/null; }
port() { cat "$RUN/ssh.port"; }
SSHOPTS=(-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR -o BatchMode=yes
         -o ConnectTimeout=10 -o ServerAliveInterval=5 -o ServerAliveCountMax=6 -i "$CACHE/id_ed25519"
         -o ControlMaster=auto -o ControlPath="$RUN/ssh.mux" -o ControlPersist=300)   # mux: ~0.1 s/command instead of ~1.3 s under TCG
mux_close() { ssh -o ControlPath="$RUN/ssh.mux" -O exit root@127.0.0.1 >/dev/null 2>&1 || true; rm -f "$RUN/ssh.mux"; }
gssh() { ssh "${SSHOPTS[@]}" -p "$(port)" root@127.0.0.1 "$@"; }
# boot markers: not always at the start of a line (the autologin shell's prompt may come first)
ready_count() { grep -a -o 'CI-READY [0-9a-f-]\{36\} uptime=' "$RUN/serial.log" 2>/dev/null | wc -l; }

qmp() {  # qmp COMMAND  -> send one QMP command to our qemu
  python3 - "$RUN/qmp.sock" "$1" <<'EOF'
import json, socket, sys
s = socket.socket(socket.AF_UNIX); s.settimeout(10); s.connect(sys.argv[1]); f = s.makefile('rw')
f.readline(); f.write(json.dumps({"execute": "qmp_capabilities"}) + "\n"); f.flush(); f.readline()
f.write(json.dumps({"execute": sys.argv[2]}) + "\n"); f.flush(); print(f.readline().strip())
EOF
}

# wait until the serial console shows more than $1 CI-READY markers and ssh works
wait_ready() {
  local before=$1 t0=$2 deadline=$(( $(date +%s) + BOOT_TIMEOUT ))
  while [ "$(ready_count)" -le "$before" ]; do
    alive || die "qemu exited during boot"
    [ "$(date +%s)" -lt "$deadline" ] || die "timeout (${BOOT_TIMEOUT}s) waiting for CI-READY on serial"
    sleep 0.5
  done
  log "CI-READY on serial after $(since "$t0") s: $(grep -a -o 'CI-READY [0-9a-f-]\{36\} uptime=[0-9.]*' "$RUN/serial.log" | tail -1)"
  until gssh true 2>/dev/null; do
    alive || die "qemu exited"
    [ "$(date +%s)" -lt "$deadline" ] || die "timeout waiting for ssh"
    sleep 1
  done
  log "ssh ready after $(since "$t0") s"
}

accel() {
  local a=${VM_ACCEL:-auto}
  if [ "$a" = auto ]; then
    # real hardware KVM only; nested PVM ("kvm_pvm" module, e.g. inside Firecracker) exists but is far slower than TCG
    if [ -r /dev/kvm ] && [ -w /dev/kvm ] && { [ -d /sys/module/kvm_intel ] || [ -d /sys/module/kvm_amd ]; }; then a=kvm; else a=tcg; fi
  fi
  echo "$a"
}

relay_bin() {  # the guestfwd relay: VM_RELAY, or built from hack/vm/relay into the cache (keyed by its source)
  if [ -n "${VM_RELAY:-}" ]; then echo "$VM_RELAY"; return; fi
  local key; key=$(sha256sum "$HERE/relay/main.go" | cut -c1-12)
  local bin="$CACHE/bin/relay-$key"
  if [ ! -x "$bin" ]; then
    command -v go >/dev/null || die "VM_API_FORWARD needs the relay: set VM_RELAY or install Go"
    mkdir -p "$CACHE/bin"
    (cd "$HERE/relay" && CGO_ENABLED=0 go build -o "$bin.tmp" .) >&2 || die "go build hack/vm/relay failed"
    mv -f "$bin.tmp" "$bin"
  fi
  echo "$bin"
}

# launch DAEMONIZE: create (or, with VM_REUSE_DISK=1, keep) the overlay and start qemu
cmd_launch() {
  local daemonize=$1
  for t in qemu-system-x86_64:qemu-system-x86 qemu-img:qemu-utils ssh:openssh-client python3:python3; do
    command -v "${t%%:*}" >/dev/null || die "${t%%:*} not found: apt-get install -y ${t#*:}"
  done
  [ -f "$CACHE/base.qcow2" ] || die "no image in $CACHE; run hack/vm/build-image.sh first"
  alive && die "VM already running (pid $(qpid)); run-vm.sh stop first"
  mkdir -p "$RUN" "$SHARE"
  rm -f "$RUN/qmp.sock" "$RUN/qemu.pid"
  mux_close
  if [ "${VM_REUSE_DISK:-0}" = 1 ]; then
    [ -f "$RUN/disk.qcow2" ] && [ -f "$RUN/ssh.port" ] || die "no overlay in $RUN to power on; use start"
  else
    rm -f "$RUN/disk.qcow2" "$RUN/serial.log" "$RUN/qemu.log" "$RUN/relay.log"
    qemu-img create -q -f qcow2 -F qcow2 -b "$CACHE/base.qcow2" "$RUN/disk.qcow2"
    echo "${VM_SSH_PORT:-$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')}" > "$RUN/ssh.port"
  fi
  local p; p=$(port)
  local net="user,id=n0,restrict=on,hostfwd=tcp:127.0.0.1:$p-:22"
  if [ -n "${VM_API_FORWARD:-}" ]; then
    case "$VM_API_FORWARD" in 127.0.0.1:[0-9]*) ;; *) die "VM_API_FORWARD must be 127.0.0.1:PORT, not $VM_API_FORWARD" ;; esac
    local relay; relay=$(relay_bin)
    case "$relay$RUN" in *,*|*\ *) die "the relay path and VM_RUN_DIR must not contain commas or spaces" ;; esac
    net="$net,guestfwd=tcp:$API_GUEST_ADDR:$API_GUEST_PORT-cmd:$relay -log $RUN/relay.log $VM_API_FORWARD"
  fi
  local a; a=$(accel)
  local acc cpu
  if [ "$a" = kvm ]; then acc="kvm"; cpu=${VM_CPU:-host}; else acc="tcg,thread=multi,tb-size=512"; cpu=${VM_CPU:-max}; fi
  local kargs=(-kernel "$CACHE/vmlinux" -initrd "$CACHE/initrd")
  [ "${VM_BOOT:-pvh}" = bzimage ] && kargs=(-kernel "$CACHE/vmlinuz" -initrd "$CACHE/initrd")
  local dm=()
  [ "$daemonize" = 1 ] && dm=(-daemonize)
  now > "$RUN/start.ts"
  log "starting qemu (accel=$acc cpu=$cpu mem=${VM_MEM:-1024} smp=${VM_SMP:-2} ssh=127.0.0.1:$p api=${VM_API_FORWARD:-none} run=$RUN)"
  # net.ifnames=0: the NIC stays eth0. With the rename to ens2, systemd-networkd 252 sometimes starts its
  # DHCPv4 client during the rename ("Failed to configure DHCPv4 client: Device or resource busy") and the
  # link stays down for the whole boot: seen after a reboot in scenario (d), which then cannot reach the API.
  # VM_QEMU_EXTRA is split on purpose (extra options); commas inside qemu option values are qemu's syntax.
  # shellcheck disable=SC2054,SC2206
  qemu=(qemu-system-x86_64 -name lifecycle-agent-vm -nodefaults -no-user-config -display none
    -accel "$acc" -cpu "$cpu" -m "${VM_MEM:-1024}" -smp "${VM_SMP:-2}"
    "${kargs[@]}" -append "root=/dev/vda rw console=ttyS0,115200 loglevel=4 systemd.show_status=1 mitigations=off net.ifnames=0 ${VM_APPEND:-}"
    -drive file="$RUN/disk.qcow2",if=virtio,format=qcow2,cache=writeback
    -netdev "$net" -device virtio-net-pci,netdev=n0,romfile=
    -virtfs local,path="$SHARE",mount_tag=ci,security_model=none,id=ci
    -device virtio-rng-pci
    -chardev file,id=ser0,path="$RUN/serial.log",append=on -serial chardev:ser0
    -qmp unix:"$RUN/qmp.sock",server=on,wait=off
    -pidfile "$RUN/qemu.pid" "${dm[@]}" -D "$RUN/qemu.log" ${VM_QEMU_EXTRA:-})
  if [ "$daemonize" = 1 ]; then
    "${qemu[@]}" || die "qemu failed to start (see $RUN/qemu.log)"
  else
    exec "${qemu[@]}"
  fi
}

cmd_start() {
  cmd_launch 1
  wait_ready 0 "$(cat "$RUN/start.ts")"
}

cmd_power_on() {
  local before; before=$(ready_count)
  VM_REUSE_DISK=1 cmd_launch 1
  wait_ready "$before" "$(cat "$RUN/start.ts")"
}

cmd_reboot() {
  alive || die "VM not running"
  local before old t0; before=$(ready_count); old=$(gssh cat /proc/sys/kernel/random/boot_id)
  t0=$(now)
  log "rebooting (boot_id $old)"
  timeout 30 ssh "${SSHOPTS[@]}" -p "$(port)" root@127.0.0.1 'systemctl reboot' || true
  mux_close
  wait_ready "$before" "$t0"
  local new; new=$(gssh cat /proc/sys/kernel/random/boot_id)
  [ "$new" != "$old" ] || die "boot_id did not change"
  log "reboot complete in $(since "$t0") s (boot_id $new)"
}

cmd_hard_reset() {
  alive || die "VM not running"
  local before t0; before=$(ready_count); t0=$(now)
  mux_close
  qmp system_reset >/dev/null
  wait_ready "$before" "$t0"
  log "hard reset complete in $(since "$t0") s (boot_id $(gssh cat /proc/sys/kernel/random/boot_id))"
}

wait_exit() {  # wait_exit PID T0 -> 0 when qemu exited within SHUTDOWN_TIMEOUT
  local p=$1 t0=$2 deadline=$(( $(date +%s) + SHUTDOWN_TIMEOUT ))
  while kill -0 "$p" 2>/dev/null && [ "$(date +%s)" -lt "$deadline" ]; do sleep 0.2; done
  if kill -0 "$p" 2>/dev/null; then return 1; fi
  log "powered off in $(since "$t0") s"
}

cmd_poweroff_and_wait() {
  alive || die "VM not running"
  local p t0; p=$(qpid); t0=$(now)
  timeout 30 ssh "${SSHOPTS[@]}" -p "$(port)" root@127.0.0.1 'systemctl poweroff' || true
  mux_close
  wait_exit "$p" "$t0" || die "guest did not power off within ${SHUTDOWN_TIMEOUT}s (qemu pid $p still running)"
  rm -f "$RUN/qemu.pid"
}

cmd_kill() {
  alive || { log "not running"; return 0; }
  local p; p=$(qpid)
  qmp quit >/dev/null 2>&1 || true
  for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$p" 2>/dev/null || break; sleep 0.2; done
  kill -9 "$p" 2>/dev/null || true
  mux_close
  rm -f "$RUN/qemu.pid"
}

cmd_stop() {
  alive || { log "not running"; return 0; }
  local p t0; p=$(qpid); t0=$(now)
  timeout 30 ssh "${SSHOPTS[@]}" -p "$(port)" root@127.0.0.1 'systemctl poweroff' >/dev/null 2>&1 || qmp system_powerdown >/dev/null 2>&1 || true
  if ! wait_exit "$p" "$t0"; then
    log "guest did not power off within ${SHUTDOWN_TIMEOUT}s; quitting qemu pid $p"
    cmd_kill
  fi
  mux_close
  rm -f "$RUN/qemu.pid"
}

cmd_wait_boot() {
  local before=${1:?usage: run-vm.sh wait-boot N (N = run-vm.sh boots before the reboot)}
  wait_ready "$before" "$(now)"
}

cmd_run() {
  local script=$1; shift
  [ -f "$script" ] || die "no such script: $script"
  cmd_start
  local rc=0
  trap 'cmd_stop' EXIT
  gssh 'mkdir -p /root/ci' && scp -q "${SSHOPTS[@]}" -P "$(port)" "$script" root@127.0.0.1:/root/ci/script
  timeout "$CMD_TIMEOUT" ssh "${SSHOPTS[@]}" -p "$(port)" root@127.0.0.1 bash /root/ci/script "$@" || rc=$?
  log "script exit code $rc"
  return $rc
}

case "${1:-}" in
  start) cmd_start ;;
  launch) cmd_launch 0 ;;
  power-on) cmd_power_on ;;
  ssh) shift; alive || die "VM not running"; timeout "$CMD_TIMEOUT" ssh "${SSHOPTS[@]}" -p "$(port)" root@127.0.0.1 "$@" ;;
  cp-in) shift; n=$#; dst=${!n}; set -- "${@:1:$((n-1))}"; scp -q "${SSHOPTS[@]}" -P "$(port)" "$@" root@127.0.0.1:"$dst" ;;
  cp-out) shift; scp -q "${SSHOPTS[@]}" -P "$(port)" root@127.0.0.1:"$1" "$2" ;;
  reboot) cmd_reboot ;;
  wait-boot) shift; cmd_wait_boot "$@" ;;
  boots) ready_count ;;
  hard-reset) cmd_hard_reset ;;
  poweroff-and-wait) cmd_poweroff_and_wait ;;
  stop) cmd_stop ;;
  kill) cmd_kill ;;
  run) shift; cmd_run "$@" ;;
  status) if alive; then echo "running pid=$(qpid) ssh=127.0.0.1:$(port) run=$RUN"; else echo stopped; exit 1; fi ;;
  *) sed -n '2,31p' "$0"; exit 2 ;;
esac
