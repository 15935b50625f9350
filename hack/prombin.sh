#!/usr/bin/env bash
# prombin.sh — build (once, cached outside the clone) a real Prometheus from
# the Go module proxy, at the version pinned by test/prombin/go.mod.
#
# Prints the path of the binary on stdout; logs on stderr (a heartbeat
# every 30 s while it builds: hack/heartbeat.sh).
#
# Environment:
#   PROMBIN_CACHE_DIR  cache root (default ${XDG_CACHE_HOME:-$HOME/.cache}/lifecycle-agent/prombin)
#
# Cold build on 2 cores: about 12 CPU-minutes (22 min of wall time beside
# another build): too much for make test's CI budget, so only
# `make test-prometheus` uses it. Cached: 0 s.
set -euo pipefail
log() { echo "[prombin] $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=hack/heartbeat.sh
. "$ROOT/hack/heartbeat.sh"
MOD="$ROOT/test/prombin"
CACHE="${PROMBIN_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/lifecycle-agent/prombin}"
for t in go flock sha256sum; do command -v "$t" >/dev/null || die "$t not found"; done

VERSION="$(grep -Eo "github.com/prometheus/prometheus v[^ ]+" "$MOD/go.mod" | head -1 | cut -d" " -f2)"
[[ -n "$VERSION" ]] || die "no github.com/prometheus/prometheus requirement in $MOD/go.mod"
KEY="$VERSION-$(cat "$MOD/go.mod" "$MOD/go.sum" | sha256sum | cut -c1-12)"
BIN="$CACHE/$KEY/bin/prometheus"

mkdir -p "$CACHE"
exec 9>"$CACHE/.build.lock"
flock 9
if [[ -x "$BIN" ]]; then
  log "cached: $BIN"
else
  log "building prometheus $VERSION (the real server of make test-prometheus) into $BIN, once per version (cold: about 12 CPU-minutes)"
  mkdir -p "$(dirname "$BIN")"
  cd "$MOD"
  export GOFLAGS="-mod=readonly"
  timed prombin "building prometheus" go build -trimpath -ldflags "-s -w" -o "$BIN.tmp" github.com/prometheus/prometheus/cmd/prometheus ||
    die "prometheus build failed"
  mv "$BIN.tmp" "$BIN"
fi
echo "$BIN"
