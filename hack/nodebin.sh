#!/usr/bin/env bash
# nodebin.sh — build (once, cached outside the clone) what the VM tests' real
# Kubernetes node runs beside the agent (issue 18): the kubelet at the test
# control plane's version (module test/kubebin), containerd v2 with its runc
# shim and ctr, runc, the CNI plugins bridge/host-local/loopback, and two
# image tarballs for `ctr images import` — the sandbox (pause) image and the
# workload image that records SIGTERM on a hostPath (module test/nodebin, built
# with go-containerregistry). Test infrastructure only: never in the package.
#
# Prints the cache directory on stdout (bin/, cni/, images/); logs on stderr.
#
# Why containerd from source: the kubelet 1.37 needs a CRI runtime of
# containerd 2.x (RuntimeConfig, cgroup driver from the runtime); Debian 12's
# containerd is 1.6. runc is built with cgo (libcontainer/nsenter) and the
# seccomp tag against Debian's libseccomp (libseccomp-dev here; the guest's
# libseccomp2 comes with systemd): containerd gives every sandbox the
# RuntimeDefault profile, which a runc without seccomp refuses.
#
# Environment:
#   NODEBIN_CACHE_DIR  cache root (default ${XDG_CACHE_HOME:-$HOME/.cache}/lifecycle-agent/nodebin)
#
# The terminal talks (issue 43): one line before the build (what, why,
# where, about how long), a heartbeat every HEARTBEAT_SECONDS (30) per part
# while it builds, each part's time after it; one line if cached.
#
# The cache key hashes what decides the output: the Go version, both
# modules' go.mod and go.sum, test/nodebin's files, and the build recipe
# below (the lines between "recipe begin" and "recipe end", comments left
# out). An edit to the logging or the comments elsewhere keeps the cache.
#
# Cold build on 2 cores: about 8 minutes (kubelet 4-5, containerd 3); cached: 0 s.
set -euo pipefail
log() { echo "[nodebin] $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=hack/heartbeat.sh
. "$ROOT/hack/heartbeat.sh"
KMOD="$ROOT/test/kubebin"
NMOD="$ROOT/test/nodebin"
CACHE="${NODEBIN_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/lifecycle-agent/nodebin}"
for t in go flock sha256sum gcc pkg-config; do command -v "$t" >/dev/null || die "$t not found (apt-get install -y gcc pkg-config)"; done
pkg-config --exists libseccomp || die "libseccomp not found (runc's seccomp support): apt-get install -y libseccomp-dev"

VERSION="$(awk '$1=="k8s.io/kubernetes"{print $2; exit}' "$KMOD/go.mod")"
[[ -n "$VERSION" ]] || die "no k8s.io/kubernetes requirement in $KMOD/go.mod"
recipe() { sed -n '/^# recipe begin/,/^# recipe end/p' "$ROOT/hack/nodebin.sh" | grep -v '^[[:space:]]*#'; }
KEY="$VERSION-$( { go env GOVERSION; recipe; cat "$KMOD/go.mod" "$KMOD/go.sum"; find "$NMOD" -type f | sort | xargs cat; } | sha256sum | cut -c1-12)"
OUT="$CACHE/$KEY"
MINOR="$(echo "$VERSION" | cut -d. -f2)"
KLDFLAGS="-s -w -X k8s.io/component-base/version.gitVersion=$VERSION \
 -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$MINOR \
 -X k8s.io/component-base/version.gitTreeState=clean"

mkdir -p "$CACHE"
exec 9>"$CACHE/.build.lock"
flock 9   # one builder at a time; parallel callers wait, then reuse
if [[ -f "$OUT/done" ]]; then
  log "cached: $OUT"
  echo "$OUT"; exit 0
fi
log "building the test node's kubelet $VERSION, containerd, runc, CNI plugins and images into $OUT"
log "  why: the VM tests run a real Kubernetes node beside the agent; Debian's containerd is too old for kubelet 1.37"
log "  about 8 min on 2 cores (kubelet 4-5, containerd 3); built once per key, then cached"
t0=$SECONDS
rm -rf "$OUT.tmp"; mkdir -p "$OUT.tmp"/{bin,cni,images,tools}
export GOFLAGS="-mod=readonly" CGO_CFLAGS="${CGO_CFLAGS:--O2 -g -Wno-deprecated-declarations}"
T="$OUT.tmp"
# recipe begin
cd "$KMOD"
timed nodebin "kubelet" go build -trimpath -ldflags "$KLDFLAGS" -o "$T/bin/kubelet" k8s.io/kubernetes/cmd/kubelet || die "kubelet build failed"
cd "$NMOD"
timed nodebin "containerd, its shim and ctr" go build -trimpath -ldflags "-s -w" -o "$T/bin/" github.com/containerd/containerd/v2/cmd/containerd \
  github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 github.com/containerd/containerd/v2/cmd/ctr || die "containerd build failed"
timed nodebin "runc (seccomp)" go build -trimpath -tags seccomp -ldflags "-s -w" -o "$T/bin/" github.com/opencontainers/runc || die "runc build failed"
timed nodebin "CNI plugins" env CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$T/cni/" github.com/containernetworking/plugins/plugins/ipam/host-local \
  github.com/containernetworking/plugins/plugins/main/bridge github.com/containernetworking/plugins/plugins/main/loopback || die "CNI build failed"
timed nodebin "pause and workload" env CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$T/tools/" ./pause ./workload || die "pause/workload build failed"
go build -trimpath -o "$T/tools/mkimages" ./mkimages || die "mkimages build failed"
# The references are what the guest's containerd config (sandbox image) and the tests' pods name.
"$T/tools/mkimages" -out "$T/images" \
  "pause=$T/tools/pause=lifecycle.test/pause:1" "workload=$T/tools/workload=lifecycle.test/workload:1" || die "mkimages failed"
# recipe end
touch "$OUT.tmp/done"
rm -rf "$OUT"; mv "$OUT.tmp" "$OUT"
# older builds (another key) are dropped: about 200 MiB each
find "$CACHE" -mindepth 1 -maxdepth 1 -type d ! -name "$KEY" -exec rm -rf {} +
log "built in $(dur $((SECONDS - t0))): $OUT"
echo "$OUT"
