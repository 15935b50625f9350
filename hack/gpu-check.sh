#!/usr/bin/env bash
# gpu-check.sh: a READ-ONLY check of lifecycle-agent's GPU support on a
# machine with a real NVIDIA GPU (NVML, nvidia-smi).
#
# It builds the binary (with -tags kustomize_disable_go_plugin_support; or
# uses $LIFECYCLE_AGENT_BIN), then runs:
#   lifecycle-agent doctor                          (may still be a stub: tolerated)
#   lifecycle-agent gpu inventory [--json]          NVML inventory and health
#   lifecycle-agent gpu reset --dry-run --gpus all  the gpu-reset checks, up to
#                                                   but NOT including the reset
# and compares a read-only nvidia-smi query taken before and after, to show
# that nothing changed.
#
# It never resets a GPU and never changes MIG mode, clocks, persistence mode
# or any service: every command it runs only reads. (It does not even try
# `gpu reset` without --dry-run; the cmd tests check that refusal.)
#
# Output goes to stdout and, file by file, to $OUT (default: a temp dir).
# Exit status: 0 all checks passed; 1 a check failed; 3 no NVML on this host.
set -uo pipefail

cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
export CGO_CFLAGS="-O2 -g -Wno-deprecated-declarations"
failures=0

step() { printf '\n== %s\n' "$*"; }
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# run NAME CMD...: run a read-only command, keep its output in $OUT/NAME.out
# and its exit code in $rc; never aborts the script.
run() {
	local name=$1
	shift
	echo "+ $*"
	"$@" >"$OUT/$name.out" 2>"$OUT/$name.err"
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
	command -v nvidia-smi >/dev/null || return 0
	nvidia-smi --query-gpu=index,uuid,pci.bus_id,persistence_mode,mig.mode.current,compute_mode,clocks.applications.graphics,clocks.applications.memory,power.limit \
		--format=csv,noheader 2>/dev/null ||
		nvidia-smi --query-gpu=index,uuid,pci.bus_id,persistence_mode,mig.mode.current --format=csv,noheader 2>/dev/null
}

step "build"
BIN=${LIFECYCLE_AGENT_BIN:-}
if [ -z "$BIN" ]; then
	BIN="$OUT/lifecycle-agent"
	if ! go build -tags kustomize_disable_go_plugin_support -o "$BIN" ./cmd/lifecycle-agent; then
		echo "FAIL: go build"
		exit 1
	fi
fi
run version "$BIN" --version
[ "$rc" -eq 0 ] || fail "the binary does not start (BIND_NOW? build with -tags kustomize_disable_go_plugin_support)"

step "host (read-only)"
uname -a
if command -v nvidia-smi >/dev/null; then
	run nvidia-smi-L nvidia-smi -L
	nvidia-smi --query-gpu=index,uuid,name,pci.bus_id,driver_version,persistence_mode,mig.mode.current,ecc.errors.uncorrected.volatile.total,retired_pages.pending \
		--format=csv 2>/dev/null || true
else
	echo "nvidia-smi not on PATH (the gpu-reset driver then resets through NVML)"
fi
smi_state >"$OUT/state-before.csv"

step "lifecycle-agent doctor (a stub is tolerated)"
run doctor "$BIN" doctor
if grep -q "not implemented" "$OUT/doctor.err"; then
	echo "doctor is still a stub; continuing"
fi

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
if [ "$rc" -ne 0 ]; then
	fail "gpu inventory --json exited $rc"
elif command -v python3 >/dev/null; then
	python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print("inventory: %d GPU(s), nvswitch=%s, condition %s/%s" % (len(d["gpus"]), d["nvswitch"], d["condition"]["status"], d["condition"]["reason"]))' \
		"$OUT/inventory-json.out" || fail "gpu inventory --json is not the expected JSON"
fi

step "lifecycle-agent gpu reset --dry-run (checks only; no reset)"
run dry-run-all "$BIN" gpu reset --dry-run --gpus all
case $rc in
0) echo "a gpu-reset event for all GPUs would proceed" ;;
1) echo "a gpu-reset event for all GPUs would be refused now (blockers above)" ;;
*) fail "gpu reset --dry-run --gpus all exited $rc" ;;
esac
run dry-run-0-drain "$BIN" gpu reset --dry-run --gpus 0 --drain
[ "$rc" -le 1 ] || fail "gpu reset --dry-run --gpus 0 --drain exited $rc"

step "nothing changed"
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
