#!/usr/bin/env bash
# Start this node's workers: one dask-cuda worker per GPU, or CPU workers where there is no GPU.
#   deploy/start-workers.sh CONFIG [NODE_NAME]     (NODE_NAME defaults to the host name)
here=$(cd "$(dirname "$0")" && pwd); . "$here/_common.sh"
mr_load_config "${1:?usage: deploy/start-workers.sh CONFIG [NODE_NAME]}"
node=${2:-$(hostname)}
mr_wait_for_file "$MR_SCHEDULER_FILE" 60 "$MR_RUN_DIR/scheduler.log"
kind=$MR_WORKER_KIND
if [ "$kind" = auto ]; then
  if "$MR_PYTHON" -c "import dask_cuda, cupy, sys; sys.exit(0 if cupy.cuda.runtime.getDeviceCount() else 1)" 2>/dev/null; then
    kind=gpu
  else
    kind=cpu
  fi
fi
log="$MR_RUN_DIR/workers-$node.log"
# workers and nannies bind only this interface (dask's default would be every interface)
whost=${MR_WORKER_HOST_OVERRIDE:-$("$MR_PYTHON" -m multireduce.deploy worker-host "$MR_CONFIG")} || exit 2
listen=(--host "$whost" --dashboard-address "$MR_WORKER_DASHBOARD")
if [ "$kind" = gpu ]; then
  extra=()
  # CuPy allocates through the RMM pool too: beside it, CuPy's own pool would hold memory RMM cannot use
  [ -n "$MR_RMM_POOL_SIZE" ] && extra+=(--rmm-pool-size "$MR_RMM_POOL_SIZE" --rmm-allocator-external-lib-list cupy)
  [ -n "$MR_DEVICE_MEMORY_LIMIT" ] && extra+=(--device-memory-limit "$MR_DEVICE_MEMORY_LIMIT")
  [ "$MR_ENABLE_SPILLING" = 0 ] && extra+=(--device-memory-limit 0)
  setsid "$MR_PYTHON" -m dask cuda worker --scheduler-file "$MR_SCHEDULER_FILE" --name "$node" \
    --memory-limit "$MR_MEMORY_LIMIT" --nthreads "$MR_NTHREADS" "${listen[@]}" ${extra[@]+"${extra[@]}"} $(mr_tls_args worker) \
    > "$log" 2>&1 < /dev/null &
else
  n=$MR_NWORKERS; [ "$n" = auto ] && n=1
  setsid "$MR_PYTHON" -m dask worker --scheduler-file "$MR_SCHEDULER_FILE" --name "$node" --nworkers "$n" \
    --nthreads "$MR_NTHREADS" --memory-limit "$MR_MEMORY_LIMIT" "${listen[@]}" \
    $(mr_tls_args worker) > "$log" 2>&1 < /dev/null &
fi
echo $! > "$MR_RUN_DIR/workers-$node.pid"
echo "$kind workers of node $node started (pid $(cat "$MR_RUN_DIR/workers-$node.pid"), log $log)"
if [ "${MR_FOREGROUND:-0}" = 1 ]; then wait; fi  # under srun or a service manager: stay with the process
