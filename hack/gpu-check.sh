#!/usr/bin/env bash
# gpu-check.sh: a READ-ONLY check of lifecycle-agent's GPU support on a
# machine with a real NVIDIA GPU (NVML, nvidia-smi).
#
# It builds nothing: it runs the prebuilt, stripped binaries of
# `make gpu-check-bin` from $GPU_CHECK_DIR (default bin/gpu-check; under
# 64 MiB together, so they can be carried to a GPU machine without Go or
# network):
#   lifecycle-agent --version, doctor, gpu inventory [--json], gpu xids,
#     gpu reset --dry-run --gpus all, gpu reset --dry-run --gpus 0 --drain
#                              every read-only agent command that touches GPUs
#   gpucheck holders           processes holding /dev/nvidia* (before and after)
#   gpucheck compare           the agent's inventory against `nvidia-smi -q -x`,
#                              field by field: count, UUIDs, PCI, persistence,
#                              MIG, ECC, retired pages, row remapping, fabric,
#                              recovery action
#   gpucheck time              NVML init, health sweeps, XID event registration
#                              and shutdown, timed in-process
# and compares a read-only nvidia-smi query taken before and after, to show
# that nothing changed.
#
# It never resets a GPU and never changes MIG mode, clocks, persistence mode
# or any service: every command it runs only reads. There is no destructive
# part: a real reset runs only through a gpu-reset LifecycleEvent, on an
# operator's own idle node (docs/gpu.md). On a borrowed GPU machine run this
# script and nothing else.
#
# On a GPU Operator node the driver, nvidia-smi and their libraries live in
# the driver pod, whose root the host sees at /run/nvidia/driver: set
# DRIVER_ROOT (or pass --driver-root DIR) and every nvidia-smi runs as
# `chroot DIR nvidia-smi`, and the agent loads NVML from DIR
# (LIFECYCLE_AGENT_GPU_DRIVER_ROOT, gpu.driverRoot). Without it, a host
# with no nvidia-smi but a /run/nvidia/driver holding one uses that root.
#
# Output goes to stdout and, file by file, to $OUT (default: a temp dir).
# Exit status: 0 all checks passed; 1 a check failed; 3 no NVML on this host.
set -uo pipefail

cd "$(dirname "$0")/.." || exit 1
DRIVER_ROOT=${DRIVER_ROOT:-}
case ${1:-} in
--driver-root)
	DRIVER_ROOT=${2:?--driver-root needs a directory}
	shift 2
	;;
--driver-root=*)
	DRIVER_ROOT=${1#--driver-root=}
	shift
	;;
"") ;;
*)
	echo "gpu-check.sh: unknown argument $1 (usage: gpu-check.sh [--driver-root DIR])" >&2
	exit 2
	;;
esac
if [ -z "$DRIVER_ROOT" ] && ! command -v nvidia-smi >/dev/null && [ -x /run/nvidia/driver/usr/bin/nvidia-smi ]; then
	DRIVER_ROOT=/run/nvidia/driver
fi
if [ -n "$DRIVER_ROOT" ]; then
	if [ ! -x "$DRIVER_ROOT/usr/bin/nvidia-smi" ]; then
		echo "gpu-check.sh: driver root $DRIVER_ROOT has no usr/bin/nvidia-smi" >&2
		exit 2
	fi
	export LIFECYCLE_AGENT_GPU_DRIVER_ROOT=$DRIVER_ROOT
fi
# nvidia-smi: the host's, or the driver root's run inside it (as the agent's
# route nvidia-smi-in:<root> and NVIDIA's own remediation tools run it).
nvidia-smi() {
	if [ -n "$DRIVER_ROOT" ]; then
		chroot "$DRIVER_ROOT" nvidia-smi "$@"
	else
		command nvidia-smi "$@"
	fi
}
have_smi() { [ -n "$DRIVER_ROOT" ] || command -v nvidia-smi >/dev/null; }
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
DIR=${GPU_CHECK_DIR:-bin/gpu-check}
BIN=$DIR/lifecycle-agent
HELPER=$DIR/gpucheck
failures=0

step() { printf '\n== %s\n' "$*"; }
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# run NAME CMD...: run a read-only command, keep its output in $OUT/NAME.out
# and its exit code in $rc; never aborts the script.
run() {
	local name=$1
	shift
	echo "+ $*"
	timeout 300 "$@" >"$OUT/$name.out" 2>"$OUT/$name.err"
	rc=$?
	cat "$OUT/$name.out"
	if [ -s "$OUT/$name.err" ]; then
		sed 's/^/stderr: /' "$OUT/$name.err"
	fi
	echo "(exit $rc)"
}

# Read-only nvidia-smi fields whose change would mean the script changed
# the GPU. Fields a driver does not know make nvidia-smi fail; fall back to
# a smaller set.
smi_state() {
	have_smi || return 0
	nvidia-smi --query-gpu=index,uuid,pci.bus_id,persistence_mode,mig.mode.current,compute_mode,clocks.applications.graphics,clocks.applications.memory,power.limit \
		--format=csv,noheader 2>/dev/null ||
		nvidia-smi --query-gpu=index,uuid,pci.bus_id,persistence_mode,mig.mode.current --format=csv,noheader 2>/dev/null
}

step "prebuilt binaries ($DIR)"
for b in "$BIN" "$HELPER"; do
	if [ ! -x "$b" ]; then
		echo "FAIL: $b missing: this script builds nothing; run \`make gpu-check-bin\` first (GPU_CHECK_DIR=$DIR)"
		exit 1
	fi
done
ls -l "$BIN" "$HELPER"
run version "$BIN" --version
[ "$rc" -eq 0 ] || fail "the binary does not start (BIND_NOW? build with -tags kustomize_disable_go_plugin_support)"

step "host (read-only)"
uname -a
echo "driver root: ${DRIVER_ROOT:-none, the host driver}"
if have_smi; then
	run nvidia-smi-L nvidia-smi -L
	nvidia-smi --query-gpu=index,uuid,name,pci.bus_id,driver_version,persistence_mode,mig.mode.current,ecc.errors.uncorrected.volatile.total,retired_pages.pending \
		--format=csv 2>/dev/null || true
else
	echo "nvidia-smi not on PATH (the gpu-reset driver then resets through NVML only when gpu.resetMethod says so)"
fi
smi_state >"$OUT/state-before.csv"
run holders-before "$HELPER" holders
[ "$rc" -eq 0 ] || fail "gpucheck holders exited $rc"

step "lifecycle-agent doctor"
run doctor "$BIN" doctor

step "lifecycle-agent gpu inventory"
run inventory "$BIN" gpu inventory
case $rc in
0) ;;
3)
	echo "no NVML on this host: nothing more to check"
	exit 3
	;;
*) fail "gpu inventory exited $rc" ;;
esac
run inventory-json "$BIN" gpu inventory --json
[ "$rc" -eq 0 ] || fail "gpu inventory --json exited $rc"

step "lifecycle-agent gpu xids (this boot's kernel log, as the agent judges it)"
run xids "$BIN" gpu xids
[ "$rc" -eq 0 ] || fail "gpu xids exited $rc"

step "lifecycle-agent gpu reset --dry-run (checks only; no reset)"
run dry-run-all "$BIN" gpu reset --dry-run --gpus all
case $rc in
0) echo "a gpu-reset event for all GPUs would proceed" ;;
1) echo "a gpu-reset event for all GPUs would be refused now (blockers above)" ;;
*) fail "gpu reset --dry-run --gpus all exited $rc" ;;
esac
run dry-run-0-drain "$BIN" gpu reset --dry-run --gpus 0 --drain
[ "$rc" -le 1 ] || fail "gpu reset --dry-run --gpus 0 --drain exited $rc"

step "the agent's inventory against nvidia-smi -q -x"
if have_smi && nvidia-smi -q -x >"$OUT/smi.xml" 2>"$OUT/smi.err"; then
	run compare "$HELPER" compare "$OUT/inventory-json.out" "$OUT/smi.xml"
	[ "$rc" -eq 0 ] || fail "the agent's inventory differs from nvidia-smi's ($rc)"
else
	fail "nvidia-smi -q -x failed or is missing: nothing to compare with"
fi

step "timings"
run time "$HELPER" time -sweeps 5
[ "$rc" -eq 0 ] || fail "gpucheck time exited $rc"
TIMEFORMAT="  %Rs wall"
for i in 1 2 3; do
	echo "lifecycle-agent gpu inventory --json, whole process, run $i:"
	time "$BIN" gpu inventory --json >/dev/null 2>&1
done
if have_smi; then
	echo "nvidia-smi -q, for comparison:"
	time nvidia-smi -q >/dev/null 2>&1
fi

step "nothing changed"
run holders-after "$HELPER" holders
smi_state >"$OUT/state-after.csv"
if ! diff -u "$OUT/state-before.csv" "$OUT/state-after.csv"; then
	fail "GPU state changed during a read-only check"
else
	echo "GPU state unchanged ($(wc -l <"$OUT/state-after.csv") GPU(s) compared)"
fi

step "result"
echo "outputs in $OUT"
if [ "$failures" -gt 0 ]; then
	echo "$failures check(s) failed"
	exit 1
fi
echo "all checks passed"
