#!/usr/bin/env bash
# Start the scheduler this config describes, in the background; returns once it accepts connections.
#   deploy/start-scheduler.sh CONFIG
here=$(cd "$(dirname "$0")" && pwd); . "$here/_common.sh"
mr_load_config "${1:?usage: deploy/start-scheduler.sh CONFIG}"
proto=tcp; [ "$MR_TLS" = 1 ] && proto=tls
rm -f "$MR_SCHEDULER_FILE"
log="$MR_RUN_DIR/scheduler.log"
# setsid: its own process group, so stop.sh can end it and everything it started
setsid "$MR_PYTHON" -m dask scheduler --protocol "$proto" --host "$MR_HOST" --port "$MR_PORT" \
  --dashboard-address "$MR_DASHBOARD" --scheduler-file "$MR_SCHEDULER_FILE" $(mr_tls_args scheduler) \
  > "$log" 2>&1 < /dev/null &
echo $! > "$MR_RUN_DIR/scheduler.pid"
mr_wait_for_file "$MR_SCHEDULER_FILE" 60 "$log"
echo "scheduler at $("$MR_PYTHON" -m multireduce.deploy address "$MR_CONFIG") (pid $(cat "$MR_RUN_DIR/scheduler.pid"), log $log)"
if [ "${MR_FOREGROUND:-0}" = 1 ]; then wait; fi  # under srun or a service manager: stay with the process
