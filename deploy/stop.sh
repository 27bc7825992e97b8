#!/usr/bin/env bash
# Stop every scheduler and worker this config's run folder knows of; nothing is left behind.
#   deploy/stop.sh CONFIG
here=$(cd "$(dirname "$0")" && pwd); . "$here/_common.sh"
mr_load_config "${1:?usage: deploy/stop.sh CONFIG}"
shopt -s nullglob
pids=()
for f in "$MR_RUN_DIR"/workers-*.pid "$MR_RUN_DIR"/scheduler.pid; do
  pid=$(cat "$f"); pids+=("$pid")
  kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true   # the whole process group
  rm -f "$f"
done
for _ in $(seq 1 150); do   # up to 15 s for a clean shutdown
  alive=0
  for pid in ${pids[@]+"${pids[@]}"}; do pgrep -g "$pid" >/dev/null 2>&1 && alive=1; done
  [ $alive = 0 ] && break
  sleep 0.1
done
for pid in ${pids[@]+"${pids[@]}"}; do kill -KILL -- "-$pid" 2>/dev/null || true; done
rm -f "$MR_SCHEDULER_FILE"
echo "stopped ${#pids[@]} process groups"
