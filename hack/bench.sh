#!/usr/bin/env bash
# bench.sh — `make bench`: every benchmark of docs/benchmarks.md, against a
# real control plane (test/testenv) on this machine, then rewrites the
# results table of docs/benchmarks.md from the JSON results.
#
# Takes about 40 minutes on 2 cores (39m10s at 260fc3f; the idle footprint
# alone is 12 minutes; the first run also builds kubectl, ~6 minutes). The
# machine should be otherwise idle: every figure is wall-clock time or CPU on shared cores.
#
# Environment:
#   BENCH_OUT            JSON results directory (default .cache/bench-results/<UTC time>)
#   BENCH_ONLY           scenarios to run (default: all, in this order)
#                        claim scale shutdown startup idle drain writes journal
#   BENCH_IDLE_DURATION  idle footprint window (default 10m)
#   BENCH_SCALE_N        agent counts for scale (default 10,100,1000)
#   BENCH_SCALE_DIAG     also run scale at 1000 with apiTimeout=10m (default 0; it found
#                        the watch cut by the client timeout, fixed since)
#   BENCH_NO_DOC=1       do not touch docs/benchmarks.md
#   KUBECTL              a kubectl binary to use instead of building one
#   KUBECTL_CACHE_DIR    cache root for the built kubectl
#                        (default ${XDG_CACHE_HOME:-$HOME/.cache}/lifecycle-agent/kubectl)
set -euo pipefail
log() { echo "[bench] $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
GO="${GO:-go}"
TAGS=kustomize_disable_go_plugin_support
export CGO_CFLAGS="${CGO_CFLAGS:--O2 -g -Wno-deprecated-declarations}"
OUT="${BENCH_OUT:-$ROOT/.cache/bench-results/$(date -u +%Y%m%dT%H%M%SZ)}"
ONLY="${BENCH_ONLY:-claim scale shutdown startup idle drain writes journal}"
IDLE="${BENCH_IDLE_DURATION:-10m}"
SCALE_N="${BENCH_SCALE_N:-10,100,1000}"
SCALE_DIAG="${BENCH_SCALE_DIAG:-0}"

[[ -x bin/lifecycle-agent ]] || die "bin/lifecycle-agent not found: run make build (make bench does)"
log "building bin/lifecycle-bench"
# Stamped with the commit (each JSON result and the table's run column name
# it); where git cannot stamp it (no .git, another owner), unstamped. Go's
# stamp misses a git worktree (its .git is a file), so the commit git names
# goes in too (-X main.commit; "-dirty" when the tree differs from it), and
# is used where Go's stamp is missing.
named=$(git rev-parse --short=7 HEAD 2>/dev/null || true)
if [[ -n "$named" ]] && [[ -n "$(git status --porcelain 2>/dev/null)" ]]; then named="$named-dirty"; fi
build_bench() { "$GO" build "$1" -tags "$TAGS" -ldflags "-X main.commit=$named" -o bin/lifecycle-bench ./bench/cmd/lifecycle-bench; }
if ! build_bench -buildvcs=true 2>/dev/null; then
  log "WARNING: cannot stamp bin/lifecycle-bench with Go's VCS stamp; the results name ${named:-no commit} (from git)"
  build_bench -buildvcs=false
fi

# kubectl at the agent's client-go version (k8s.io/client-go v0.X.Y is
# Kubernetes v1.X.Y), from k8s.io/kubernetes/cmd/kubectl. The module
# test/kubebin pins k8s.io/kubernetes; its go.sum lacks kubectl's own
# dependencies, so the build runs in a copy of the module outside the clone
# (the copy's go.sum gets them; nothing in the repository is written).
build_kubectl() {
  local cg kv cache key bin tmp
  cg="$(awk '$1=="k8s.io/client-go"{print $2; exit}' go.mod)"
  kv="$(awk '$1=="k8s.io/kubernetes"{print $2; exit}' test/kubebin/go.mod)"
  [[ "v1${cg#v0}" == "$kv" ]] || die "client-go $cg does not match test/kubebin's k8s.io/kubernetes $kv"
  cache="${KUBECTL_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/lifecycle-agent/kubectl}"
  key="$kv-$(cat test/kubebin/go.mod test/kubebin/go.sum | sha256sum | cut -c1-12)"
  bin="$cache/$key/kubectl"
  mkdir -p "$cache"
  exec 8>"$cache/.build.lock"
  flock 8
  if [[ ! -x "$bin" ]]; then
    log "building kubectl $kv into $bin (first time: ~6 min on 2 cores)"
    tmp="$(mktemp -d)"
    cp test/kubebin/go.mod test/kubebin/go.sum "$tmp/"
    sed -i 's#^module .*#module local/kubectlbuild#' "$tmp/go.mod"
    printf 'package kubectlbuild\n' >"$tmp/doc.go"
    mkdir -p "$cache/$key"
    (cd "$tmp" && GOFLAGS=-mod=mod "$GO" build -trimpath -ldflags "-s -w \
      -X k8s.io/component-base/version.gitVersion=$kv -X k8s.io/component-base/version.gitMajor=1 \
      -X k8s.io/component-base/version.gitMinor=$(echo "$kv" | cut -d. -f2) -X k8s.io/component-base/version.gitTreeState=clean" \
      -o "$bin.tmp" k8s.io/kubernetes/cmd/kubectl) || { rm -rf "$tmp"; die "kubectl build failed"; }
    mv "$bin.tmp" "$bin"
    rm -rf "$tmp"
  fi
  exec 8>&-
  echo "$bin"
}

mkdir -p "$OUT"
log "results: $OUT"
failed=()
run() { # scenario args...
  log "=== $* ($(date -u +%H:%M:%SZ), load $(cut -d' ' -f1-3 /proc/loadavg))"
  if ! bin/lifecycle-bench -out "$OUT" "$@"; then
    failed+=("$1")
    log "$1 FAILED (continuing)"
  fi
}
for s in $ONLY; do
  case "$s" in
    claim)    run claim -events 200 -gap 1s
              run claim -events 200 -gap 0 ;;
    scale)    run scale -n "$SCALE_N" -watch filtered,unfiltered -samples 200
              if [[ "$SCALE_DIAG" == 1 ]]; then run scale -n 1000 -watch filtered -samples 200 -api-timeout 10m; fi ;;
    shutdown) run shutdown -n 200 ;;
    startup)  run startup -history 0,100,1000,10000 -runs 10 ;;
    idle)     run idle -duration "$IDLE" ;;
    drain)    run drain -kubectl "${KUBECTL:-$(build_kubectl)}" -apps 20 -replicas 10 -min-available 9 -repeats 2 ;;
    writes)   run writes ;;
    journal)  run journal -events 10000 -timed 1000 ;;
    *) die "unknown scenario $s" ;;
  esac
done

if [[ "${BENCH_NO_DOC:-}" != 1 ]]; then
  bin/lifecycle-bench report -in "$OUT" -doc docs/benchmarks.md
fi
if ((${#failed[@]})); then
  die "failed: ${failed[*]} (results of the others are in $OUT)"
fi
log "done: $OUT"
