#!/bin/bash
# mon.sh: every 30 s, the idle agent's cgroup memory and the binary's folios
while P=$(pgrep -f "^bin/lifecycle-agent|/bin/lifecycle-agent " | head -1); [ -n "$P" ]; do
  CG=$(ls -d /sys/fs/cgroup/memory/process_api/*/lifecycle-bench-idle-* 2>/dev/null | head -1)
  echo "== $(date +%T) pid $P majflt $(awk '{print $12}' /proc/$P/stat) $(egrep '^(cache|rss|mapped_file) ' $CG/memory.stat | tr '\n' ' ')"
  /tmp/kpf/kpf $(readlink /proc/$P/exe) $P | grep -v sink
  sleep 30
done
