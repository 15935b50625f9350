# shellcheck shell=bash
# heartbeat.sh — sourced by hack/kubebin.sh, hack/nodebin.sh, hack/prombin.sh and
# hack/demo/prepare.sh, so that a long build is never silent:
#
#   timed TAG WHAT CMD [ARG...]
#
# runs CMD; while it runs, prints "[TAG] still WHAT: 2m30s" on stderr every
# HEARTBEAT_SECONDS (default 30); after, "[TAG] WHAT: done in 3m12s (CPU
# 5m40s)" (or "failed after"). The CPU time (CMD's and its children's, user
# and system) is what the step costs on an idle machine: on a busy one the
# wall time grows, not it. Returns CMD's status. CMD should be a command,
# not a shell function (set -e does not apply inside a function called
# here).

# dur SECONDS: 45s, 2m05s.
dur() { if (($1 >= 60)); then printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); else printf '%ds' "$1"; fi; }

# cpu: sets CPU to the CPU seconds of this shell's waited-for children so
# far (called as a command: in $(...) it would count a subshell's).
cpu() {
  local f
  f="$(mktemp)"
  times >"$f"
  CPU="$(awk 'NR == 2 { s = 0; for (i = 1; i <= 2; i++) { split($i, a, /[ms]/); s += a[1] * 60 + a[2] } printf "%d\n", s + 0.5 }' "$f")"
  rm -f "$f"
}

timed() {
  local tag=$1 what=$2 t0 c0 hb rc=0 took
  shift 2
  t0=$(date +%s)
  cpu
  c0=$CPU
  # The ticker stops with this script (kill -0) even if killed before the
  # end; its sleep holds no copy of stderr, so a caller reading stderr
  # through a pipe (testenv) sees EOF as soon as the script exits.
  (
    while sleep "${HEARTBEAT_SECONDS:-30}" >/dev/null 2>&1 && kill -0 $$ 2>/dev/null; do
      echo "[$tag] still $what: $(dur $(($(date +%s) - t0)))" >&2
    done
  ) &
  hb=$!
  "$@" || rc=$?
  kill "$hb" 2>/dev/null || true
  wait "$hb" 2>/dev/null || true
  cpu
  took="$(dur $(($(date +%s) - t0))) (CPU $(dur $((CPU - c0))))"
  if ((rc == 0)); then
    echo "[$tag] $what: done in $took" >&2
  else
    echo "[$tag] $what: failed after $took" >&2
  fi
  return "$rc"
}
