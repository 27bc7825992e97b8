#!/usr/bin/env bash
# One device call: install the carried wheels, run the GPU test suite and the benchmarks, print a
# short table last. Full logs go to $OUT.
#   bash benchmarks/run_gpu.sh [tests|bench|all] [extra pytest args...]
set -uo pipefail
what=${1:-all}; shift || true
OUT=${OUT:-/tmp/multireduce-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:$PWD || exit 1
else
  export PYTHONPATH=$PWD
fi
export MULTIREDUCE_KERNEL_CACHE=${MULTIREDUCE_KERNEL_CACHE:-/tmp/multireduce-kernels}
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv; \
  python3 -c "import cupy, numpy, dask; print('cupy', cupy.__version__, 'numpy', numpy.__version__, 'dask', dask.__version__)"; } 2>&1 | tee "$OUT/env.txt"
rc=0
if [ "$what" = tests ] || [ "$what" = all ]; then
  start=$(date +%s)
  python3 -m pytest tests/gpu -m "gpu and not large" -n 12 -q -p no:cacheprovider -p no:benchmark --timeout 900 "$@" > "$OUT/gpu-tests.log" 2>&1 || rc=1
  python3 -m pytest tests/gpu -m large -q -p no:cacheprovider -p no:benchmark --timeout 900 "$@" > "$OUT/gpu-large.log" 2>&1 || rc=1
  echo "gpu tests took $(( $(date +%s) - start )) s"
  grep -E "^(FAILED|ERROR)" "$OUT/gpu-tests.log" | head -30
  tail -n 3 "$OUT/gpu-tests.log"; tail -n 3 "$OUT/gpu-large.log"
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
  python3 benchmarks/bench_reduce.py > "$OUT/bench-reduce.log" 2>&1 || { rc=1; tail -20 "$OUT/bench-reduce.log"; }
  python3 benchmarks/bench_scan.py > "$OUT/bench-scan.log" 2>&1 || { rc=1; tail -20 "$OUT/bench-scan.log"; }
  python3 benchmarks/summary.py "$OUT" || rc=1
fi
exit $rc
