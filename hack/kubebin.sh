#!/usr/bin/env bash
# kubebin.sh — build (once, cached outside the clone) a real kube-apiserver
# and etcd, and with --with-controller-manager kube-controller-manager,
# from the Go module proxy, at the version pinned by test/kubebin/go.mod
# (which matches the agent's client-go).
#
#   hack/kubebin.sh                            kube-apiserver, etcd (make demo, make sandbox)
#   hack/kubebin.sh --with-controller-manager  also kube-controller-manager (make kubebin;
#                                              testenv when Options.ControllerManager is set)
#
# Prints the directory holding the binaries on stdout; logs on stderr: one
# line before a build (what, why, where, about how long), a heartbeat every
# HEARTBEAT_SECONDS (30) while it runs, its time after; one line if cached.
# All three binaries share one directory, $CACHE/<k8s version>-<hash of
# test/kubebin/go.mod and go.sum>/bin: a directory built before the
# controller-manager became optional (all three in it) is used as it is,
# and asking for the controller-manager later builds only it.
#
# Environment:
#   KUBEBIN_CACHE_DIR  cache root (default ${XDG_CACHE_HOME:-$HOME/.cache}/lifecycle-agent/kubebin)
#
# Cold (empty module and build caches) on 2 cores: see the timings in the
# README's first section; cached: under a second.
set -euo pipefail
log() { echo "[kubebin] $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=hack/heartbeat.sh
. "$ROOT/hack/heartbeat.sh"
MOD="$ROOT/test/kubebin"
CACHE="${KUBEBIN_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/lifecycle-agent/kubebin}"
KCM=0
for a in "$@"; do
  case "$a" in
    --with-controller-manager) KCM=1 ;;
    *) die "usage: $0 [--with-controller-manager]" ;;
  esac
done
for t in go flock sha256sum; do command -v "$t" >/dev/null || die "$t not found"; done

VERSION="$(awk '$1=="k8s.io/kubernetes"{print $2; exit}' "$MOD/go.mod")"
[[ -n "$VERSION" ]] || die "no k8s.io/kubernetes requirement in $MOD/go.mod"
KEY="$VERSION-$(cat "$MOD/go.mod" "$MOD/go.sum" | sha256sum | cut -c1-12)"
BIN="$CACHE/$KEY/bin"
MINOR="$(echo "$VERSION" | cut -d. -f2)"
LDFLAGS="-s -w -X k8s.io/component-base/version.gitVersion=$VERSION \
 -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$MINOR \
 -X k8s.io/component-base/version.gitTreeState=clean"

# name -> package; etcd's package builds an executable named "server".
declare -A PKG=([kube-apiserver]=k8s.io/kubernetes/cmd/kube-apiserver
  [etcd]=go.etcd.io/etcd/server/v3
  [kube-controller-manager]=k8s.io/kubernetes/cmd/kube-controller-manager)
WANT=(kube-apiserver etcd)
((KCM)) && WANT+=(kube-controller-manager)

mkdir -p "$CACHE"
exec 9>"$CACHE/.build.lock"
flock 9 # one builder at a time; parallel callers wait, then reuse
NEED=() PKGS=()
for n in "${WANT[@]}"; do
  [[ -x "$BIN/$n" ]] || { NEED+=("$n"); PKGS+=("${PKG[$n]}"); }
done
if ((${#NEED[@]} == 0)); then
  log "cached: $BIN ($(IFS=+; echo "${WANT[*]}"))"
  echo "$BIN"
  exit 0
fi

what="$(IFS=+; echo "${NEED[*]}")"
why="the real control plane that make demo, make sandbox and the tests start"
# Cold: empty module and build caches (the README has the measured figures).
cold="cold: kube-apiserver+etcd took 18 CPU-minutes, so 9 min or more on 2 cores"
if ((KCM)); then
  why="$why (kube-controller-manager: the tests that start it, testenv's Options.ControllerManager)"
fi
[[ " ${NEED[*]} " == *" kube-apiserver "* ]] || { why="the tests that start it (testenv's Options.ControllerManager)"; cold="kube-controller-manager alone, kube-apiserver's packages built: a few minutes"; }
log "building $what $VERSION: $why;"
log "  cached in $BIN, once per version ($cold; less with Go's caches warm)"
cd "$MOD"
# The module's go.sum is committed: never write go.mod or go.sum here.
export GOFLAGS="${GOFLAGS:+$GOFLAGS }-mod=readonly"
work="$CACHE/$KEY/.build.$$"
dl="$(mktemp)"
trap 'rm -rf "$dl" "$work"' EXIT

# The modules first, if some are not in Go's module cache yet: their "go:
# downloading" lines are kept in a file, shown only if the fetch fails.
if ! GOPROXY=off go list -deps "${PKGS[@]}" >/dev/null 2>&1; then
  download() { go list -deps "${PKGS[@]}" >/dev/null 2>"$dl"; }
  timed kubebin "downloading the modules of $what into $(go env GOMODCACHE)" download ||
    { cat "$dl" >&2; die "module download failed (needs the module proxy: $(go env GOPROXY))"; }
  log "$(grep -c '^go: downloading' "$dl" || true) modules downloaded"
fi

# One go build for every binary needed: they share most packages and Go
# compiles each once, in parallel, and links them in parallel.
mkdir -p "$work" "$BIN"
timed kubebin "building $what" go build -trimpath -ldflags "$LDFLAGS" -o "$work/" "${PKGS[@]}" || die "$what build failed"
[[ ! -e "$work/server" ]] || mv "$work/server" "$work/etcd"
for n in "${NEED[@]}"; do
  [[ -x "$work/$n" ]] || die "go build made no $n"
  mv "$work/$n" "$BIN/$n"
done
echo "$BIN"
