#!/usr/bin/env bash
# Stop every scheduler and worker this config's run folder knows of; nothing is left behind.
#   deploy/stop.sh CONFIG
here=$(cd "$(dirname "$0")" && pwd); . "$here/_common.sh"
mr_load_config "${1:?usage: deploy/stop.sh CONFIG}"
shopt -s nullglob
pids=()
ours() {  # a pid file can outlive its process and the pid be reused: signal only our dask processes
  local pid=$1 cmd
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  cmd=$(tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null) || return 1
  [[ $cmd == *" -m dask "* && $cmd == *"--scheduler-file $MR_SCHEDULER_FILE"* ]]
}
for f in "$MR_RUN_DIR"/workers-*.pid "$MR_RUN_DIR"/scheduler.pid; do
  pid=$(cat "$f")
  if ! ours "$pid"; then
    echo "skipping $f: pid $pid is not a dask process of this config (stale pid file)" >&2
    rm -f "$f"; continue
  fi
  pids+=("$pid")
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
