#!/usr/bin/env bash
# prepare.sh — what make demo and make sandbox run before hack/demo, each
# step announced, with a heartbeat while it runs (hack/heartbeat.sh):
#
#   1. the Go modules the agent and the demo need, fetched once into Go's
#      module cache (only if some are missing; their "go: downloading"
#      lines are kept in a file, shown if the fetch fails);
#   2. make build: bin/lifecycle-agent and bin/kubectl-lifecycle;
#   3. hack/kubebin.sh: kube-apiserver and etcd, built once per version and
#      cached (no kube-controller-manager: the demo needs none).
#
# On a machine with everything cached it prints three short lines.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# shellcheck source=hack/heartbeat.sh
. "$ROOT/hack/heartbeat.sh"
log() { echo "[demo] $*" >&2; }
cd "$ROOT"
GO="${GO:-go}"
TAGS=kustomize_disable_go_plugin_support
PKGS=(./cmd/... ./hack/demo)

if ! GOPROXY=off GOFLAGS="${GOFLAGS:-} -mod=readonly" "$GO" list -tags "$TAGS" -deps "${PKGS[@]}" >/dev/null 2>&1; then
  dl="$(mktemp)"
  trap 'rm -f "$dl"' EXIT
  log "fetching the Go modules of the agent and the demo into $("$GO" env GOMODCACHE) (once)"
  fetch() { "$GO" list -tags "$TAGS" -deps "${PKGS[@]}" >/dev/null 2>"$dl"; }
  timed demo "fetching the agent's Go modules" fetch || { cat "$dl" >&2; exit 1; }
  log "$(grep -c '^go: downloading' "$dl" || true) modules downloaded"
fi
log "building the agent and the kubectl plugin into bin/ (make build; cold: minutes, the longest step after the control plane; then seconds)"
timed demo "building bin/lifecycle-agent and bin/kubectl-lifecycle" make --no-print-directory build >/dev/null
hack/kubebin.sh >/dev/null
