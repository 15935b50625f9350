#!/usr/bin/env bash
# kubebin.sh — build (once, cached outside the clone) a real kube-apiserver,
# etcd and kube-controller-manager from the Go module proxy, at the version
# pinned by test/kubebin/go.mod (which matches the agent's client-go).
#
# Prints the directory holding the three binaries on stdout; logs on stderr.
#
# Environment:
#   KUBEBIN_CACHE_DIR  cache root (default ${XDG_CACHE_HOME:-$HOME/.cache}/lifecycle-agent/kubebin)
#
# Cold build on 2 cores: 4-8 minutes (GOCACHE cold); cached: 0 s.
set -euo pipefail
log() { echo "[kubebin] $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MOD="$ROOT/test/kubebin"
CACHE="${KUBEBIN_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/lifecycle-agent/kubebin}"
for t in go flock sha256sum; do command -v "$t" >/dev/null || die "$t not found"; done

VERSION="$(awk '$1=="k8s.io/kubernetes"{print $2; exit}' "$MOD/go.mod")"
[[ -n "$VERSION" ]] || die "no k8s.io/kubernetes requirement in $MOD/go.mod"
KEY="$VERSION-$(cat "$MOD/go.mod" "$MOD/go.sum" | sha256sum | cut -c1-12)"
BIN="$CACHE/$KEY/bin"
MINOR="$(echo "$VERSION" | cut -d. -f2)"
LDFLAGS="-s -w -X k8s.io/component-base/version.gitVersion=$VERSION \
 -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$MINOR \
 -X k8s.io/component-base/version.gitTreeState=clean"

mkdir -p "$CACHE"
exec 9>"$CACHE/.build.lock"
flock 9   # one builder at a time; parallel callers wait, then reuse
if [[ -x "$BIN/kube-apiserver" && -x "$BIN/etcd" && -x "$BIN/kube-controller-manager" ]]; then
  log "cached: $BIN"
else
  log "building kube-apiserver, kube-controller-manager and etcd $VERSION into $BIN (cold: 4-8 min on 2 cores)"
  mkdir -p "$BIN"
  t0=$SECONDS
  cd "$MOD"
  # GOFLAGS=-mod=mod: the module's go.sum is committed; never write go.mod here.
  export GOFLAGS="-mod=readonly"
  for p in k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager; do
    n="$(basename "$p")"
    [[ -x "$BIN/$n" ]] || { go build -trimpath -ldflags "$LDFLAGS" -o "$BIN/$n.tmp" "$p" && mv "$BIN/$n.tmp" "$BIN/$n"; } || die "$n build failed"
  done
  [[ -x "$BIN/etcd" ]] || { go build -trimpath -ldflags "-s -w" -o "$BIN/etcd.tmp" go.etcd.io/etcd/server/v3 && mv "$BIN/etcd.tmp" "$BIN/etcd"; } || die "etcd build failed"
  log "built in $((SECONDS - t0))s"
fi
echo "$BIN"
