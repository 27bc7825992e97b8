# Sourced by the deploy scripts: read the config into MR_* variables and pick the Python.
set -euo pipefail
MR_PYTHON=${MR_PYTHON:-python3}
mr_load_config() {
  local config=${1:?config file (deploy/cluster.toml) required}
  local env
  env=$("$MR_PYTHON" -m multireduce.deploy env "$config") || exit 2
  eval "$env"
  mkdir -p "$MR_RUN_DIR"
}
mr_tls_args() {  # $1: scheduler | worker
  if [ "$MR_TLS" = 1 ]; then
    local cert key
    if [ "$1" = scheduler ]; then cert=$MR_TLS_SCHEDULER_CERT; key=$MR_TLS_SCHEDULER_KEY
    else cert=$MR_TLS_WORKER_CERT; key=$MR_TLS_WORKER_KEY; fi
    for f in "$MR_TLS_CA_FILE" "$cert" "$key"; do
      [ -f "$f" ] || { echo "missing TLS file $f: run deploy/make-certs.sh" >&2; exit 2; }
    done
    echo "--tls-ca-file $MR_TLS_CA_FILE --tls-cert $cert --tls-key $key"
  fi
}
mr_wait_for_file() {  # $1 file, $2 seconds, $3 log to show on failure
  local i=0
  while [ ! -s "$1" ]; do
    i=$((i + 1)); [ $i -gt $(( $2 * 10 )) ] && { echo "timed out waiting for $1; log:" >&2; tail -30 "$3" >&2; exit 1; }
    sleep 0.1
  done
}
