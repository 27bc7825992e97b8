#!/usr/bin/env bash
# One device call: install the carried wheels, run the GPU test suite and the benchmarks, print a
# short table last. Full logs go to $OUT. Each step is a suite of `python -m benchmarks` (its --help
# says what it measures) or pytest.
#   bash benchmarks/run_gpu.sh [STEPS] [extra pytest args...]
# STEPS: "all" (= "tests bench") or a quoted list of tests (the whole GPU suite; FOCUS="files" narrows it),
# bench (reduce, scan, summary; BENCH_ARGS="--quick" narrows it), sweep (sweep-scan), small (reduce --profile small), profile (ncu on
# scan --profile), segprofile (ncu on segments --profile kernels), segcall (segments --profile call),
# statscall (stats --profile call), groupby (the GPU group-by tests and the groupby suite; GROUPBY_ARGS replaces
# "--quick --cases field"), statskernels (stats --profile kernels), pending (the exact sum and
# scan tests alone, Dask arrays of CuPy chunks included), stats (statistics GPU tests and the stats suite),
# statsbench (the stats suite alone), seg (segments), exact (exact --gpu-exact --quick; EXACT_ARGS="--logs
# 26,28" replaces --quick), exactfull (exact --gpu-exact, 2^20..2^30), exactsweep (sweep-exact-scan;
# EXACTSWEEP_ARGS="--quick" narrows it; table and JSON in $OUT), exactterms (exact --profile terms),
# exactcall (exact --profile call), exactscan (exact --profile scan), exactprofile (exact --profile shapes,
# and ncu on exact --profile ncu), exactscanprofile (ncu on the exact cumsum's pass 1, carries, pass 2 and retry in exact
# --profile scan), lookback (scan --lookback-only, reduce --accumulate-only), first
# (first-call, with and without the prebuilt kernels), fusion (sums of expressions read through the steps;
# FUSION_ARGS="--quick" narrows it), cub (installs .whl-cccl/ first if it is there;
# CUB_ARGS="--quick" or "--sizes 26 --dtypes float32" narrow it).
set -uo pipefail
what=${1:-all}; shift || true
[ "$what" = all ] && what="tests bench"
has() { case " $what " in *" $1 "*) return 0;; esac; return 1; }
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
# ncu over the kernels matching REGEX in `python3 -m benchmarks SUITE [ARGS]`, all to $OUT/LOG; the profile
# steps read the same six sections, and MORE_SECTIONS adds to them.
#   ncu_run LIMIT_S REGEX LAUNCH_SKIP LAUNCH_COUNT LOG SUITE [ARGS...]
ncu_run() {
  local limit=$1 regex=$2 skip=$3 count=$4 log=$5; shift 5
  # shellcheck disable=SC2086  # MORE_SECTIONS is a list of flags
  timeout "$limit" ncu --kernel-name regex:"$regex" --launch-skip "$skip" --launch-count "$count" \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
    --section WarpStateStats --section SchedulerStats ${MORE_SECTIONS:-} \
    python3 -m benchmarks "$@" > "$OUT/$log" 2>&1 || rc=1
}
if has sweep; then
  timeout 300 python3 -m benchmarks sweep-scan > "$OUT/sweep-scan.log" 2>&1 || rc=1
  grep -E "x copy" "$OUT/sweep-scan.log"; tail -n 2 "$OUT/sweep-scan.log" | grep -v "x copy"
fi
if has small; then
  timeout 120 python3 -m benchmarks reduce --profile small > "$OUT/profile-small.log" 2>&1 || rc=1
  grep -E "^\|" "$OUT/profile-small.log" || tail -n 20 "$OUT/profile-small.log"
fi
if has fusion; then
  timeout 400 python3 -m benchmarks fusion ${FUSION_ARGS:-} > "$OUT/fusion.log" 2>&1 || rc=1
  grep -E "^\|" "$OUT/fusion.log" || tail -n 30 "$OUT/fusion.log"
fi
if has groupby; then
  timeout 200 python3 -m pytest tests/gpu/test_gpu_groupby_rows.py tests/gpu/test_gpu_groupby.py -q -p no:cacheprovider \
    > "$OUT/groupby-tests.log" 2>&1 || rc=1
  tail -n 1 "$OUT/groupby-tests.log"
  timeout 300 python3 -m benchmarks groupby ${GROUPBY_ARGS:---quick --cases field} > "$OUT/groupby.log" 2>&1 || rc=1
  grep -E "^\|" "$OUT/groupby.log" || tail -n 20 "$OUT/groupby.log"
fi
if has first; then
  { timeout 400 python3 -m benchmarks first-call; timeout 400 python3 -m benchmarks first-call --no-prebuilt; } \
    > "$OUT/first-call.log" 2>&1 || rc=1
  cat "$OUT/first-call.log"
fi
if has profile; then
  ncu_run 240 "scan_lookback|reduce_vectorized" 2 2 ncu.txt scan --profile
  grep -E "scan_lookback|reduce_vectorized|Memory Throughput|DRAM Throughput|Duration|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|Stall|stall|Eligible Warps|No Eligible" "$OUT/ncu.txt" | head -60
fi
if has segprofile; then
  ncu_run 400 "segment_" 0 30 ncu-segments.txt segments --profile kernels
  grep -E "segment_|Memory Throughput|DRAM Throughput|Duration|Achieved Occupancy|Registers Per|Block Limit|Warp Cycles Per Issued|No Eligible" "$OUT/ncu-segments.txt" | head -150
fi
if has stats; then
  timeout 200 python3 -m pytest tests/gpu/test_gpu_statistics.py -m "gpu and not large" -q -p no:cacheprovider -p no:benchmark > "$OUT/gpu-stats.log" 2>&1 || rc=1
  grep -E "^(FAILED|ERROR)|Error|assert" "$OUT/gpu-stats.log" | head -20; tail -n 3 "$OUT/gpu-stats.log"
fi
if has stats || has statsbench; then
  timeout 200 python3 -m benchmarks stats > "$OUT/bench-stats.log" 2>&1 || rc=1
  tail -n 30 "$OUT/bench-stats.log"
fi
if has pending; then
  # the exact sum and scan tests without the rest of the suite: the exact Dask cumsum through ExactScanPlan
  # (the Dask-of-CuPy tests of test_gpu_exact_scan.py) and the single-array exact sums and scans
  { python3 -m pytest tests/gpu/test_gpu_exact_scan.py tests/gpu/test_gpu_exact.py tests/gpu/test_gpu_exact_sum.py \
      -m "gpu and not large" -n 8 -q -p no:cacheprovider -p no:benchmark; } > "$OUT/pending.log" 2>&1 || rc=1
  grep -E "^(FAILED|ERROR)| passed| failed" "$OUT/pending.log" | head -30
fi
if has statscall; then
  timeout 120 python3 -m benchmarks stats --profile call > "$OUT/profile-stats-call.log" 2>&1 || rc=1
  grep -E "^\|" "$OUT/profile-stats-call.log"
fi
if has statskernels; then
  timeout 300 python3 -m benchmarks stats --profile kernels > "$OUT/profile-stats-kernels.log" 2>&1 || rc=1
  grep -E "^\|" "$OUT/profile-stats-kernels.log" | head -80
fi
if has segcall; then
  timeout 120 python3 -m benchmarks segments --profile call > "$OUT/profile-segment-call.log" 2>&1 || rc=1
  head -n 60 "$OUT/profile-segment-call.log"
fi
if has seg; then
  timeout 180 python3 tools/compile_kernels.py --arch sm_90 --only segment > "$OUT/segment-compile.log" 2>&1 || { rc=1; tail -n 20 "$OUT/segment-compile.log"; }
  OUT=$OUT timeout 300 python3 -m benchmarks segments > "$OUT/bench-segments.log" 2>&1 || rc=1
  tail -n 45 "$OUT/bench-segments.log"
fi
if has exact; then
  timeout 300 python3 -m benchmarks exact --gpu-exact ${EXACT_ARGS:---quick} > "$OUT/bench-exact.log" 2>&1 || rc=1
  tail -n 25 "$OUT/bench-exact.log"
fi
if has exactfull; then
  timeout 420 python3 -m benchmarks exact --gpu-exact > "$OUT/bench-exact-full.log" 2>&1 || rc=1
  tail -n 52 "$OUT/bench-exact-full.log"
fi
if has exactsweep; then
  # the whole table (one row per variant, dtype, data and size) and the JSON stay in $OUT; the best per dtype
  # and size, any mismatch or failure, and the shipped shape's rows print here
  timeout 540 python3 -m benchmarks sweep-exact-scan --out "$OUT/sweep-exact-scan.json" ${EXACTSWEEP_ARGS:-} \
    > "$OUT/sweep-exact-scan.log" 2>&1 || rc=1
  sed -n '/^Best bitwise/,$p' "$OUT/sweep-exact-scan.log" > "$OUT/sweep-exact-scan.md"
  grep -E "^(compiled [0-9]+ modules|!!)" "$OUT/sweep-exact-scan.log" | head -20
  sed -n '/^Best bitwise/,/^$/p;/^| dtype | n |/,/^$/p' "$OUT/sweep-exact-scan.log" | head -12
  grep -E -A1 "^\| dtype \| data" "$OUT/sweep-exact-scan.log" | head -2
  grep -E "\(default\)|\| library \|" "$OUT/sweep-exact-scan.log" | head -24
  tail -n 3 "$OUT/sweep-exact-scan.log"
fi
if has exactcall; then
  timeout 120 python3 -m benchmarks exact --profile call > "$OUT/profile-exact-call.log" 2>&1 || rc=1
  head -n 70 "$OUT/profile-exact-call.log"
fi
if has exactscan; then
  timeout 200 python3 -m benchmarks exact --profile scan > "$OUT/profile-exact-scan.log" 2>&1 || rc=1
  grep -E "^\|" "$OUT/profile-exact-scan.log"
fi
if has exactterms; then
  timeout 400 python3 -m benchmarks exact --profile terms > "$OUT/profile-exact-terms.log" 2>&1 || rc=1
  tail -n 12 "$OUT/profile-exact-terms.log"
fi
if has exactscanprofile; then
  MORE_SECTIONS="--section ComputeWorkloadAnalysis --section InstructionStats" \
    ncu_run 300 "exact_tile_words|exact_words_cumsum|exact_scan_tiles|exact_scan_retry" 0 4 ncu-exact-scan.txt exact --profile scan
  grep -E "exact_tile_words|exact_words_cumsum|exact_scan_tiles|exact_scan_retry|DRAM Throughput|Compute \(SM\)|Duration|Achieved Occupancy|Registers Per|Local Memory Spilling|Warp Cycles Per Issued|No Eligible|FP64|Executed Ipc|Issue Slots Busy|Stall" "$OUT/ncu-exact-scan.txt" | head -80
fi
if has exactprofile; then
  timeout 300 python3 -m benchmarks exact --profile shapes > "$OUT/profile-exact.log" 2>&1 || rc=1
  tail -n 16 "$OUT/profile-exact.log"
  MORE_SECTIONS="--section ComputeWorkloadAnalysis --section InstructionStats" \
    ncu_run 200 "exact_sum_rows" 1 3 ncu-exact.txt exact --profile ncu
  grep -E "exact_sum_rows|Memory Throughput|DRAM Throughput|Compute \(SM\)|Duration|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|No Eligible|FP64|Executed Ipc" "$OUT/ncu-exact.txt" | head -60
fi
if has lookback; then
  { timeout 200 python3 -m benchmarks scan --lookback-only; timeout 200 python3 -m benchmarks reduce --accumulate-only; } \
    > "$OUT/bench-lookback.log" 2>&1 || rc=1
  tail -n 40 "$OUT/bench-lookback.log"
fi
if has cub; then
  # cuda.compute goes into a folder of its own, --no-deps: --target would otherwise pull numpy and
  # typing_extensions, which are already installed and not in .whl-cccl
  if ls .whl-cccl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site-cccl \
      --find-links .whl-cccl cuda-cccl cuda-core cuda-bindings cuda-pathfinder > "$OUT/cub-install.log" 2>&1 \
      || { rc=1; tail -n 5 "$OUT/cub-install.log"; }
    export PYTHONPATH=/tmp/site-cccl:$PYTHONPATH
  fi
  timeout 500 python3 -m benchmarks cub ${CUB_ARGS:-} --json "$OUT/bench_cub.json" > "$OUT/bench-cub.log" 2>&1 || rc=1
  tail -n 60 "$OUT/bench-cub.log"
fi
if has tests; then
  start=$(date +%s)
  python3 -m pytest ${FOCUS:-tests/gpu} -m "gpu and not large" -n 12 -q -p no:cacheprovider -p no:benchmark --timeout 900 "$@" > "$OUT/gpu-tests.log" 2>&1 || rc=1
  python3 -m pytest ${FOCUS:-tests/gpu} -m large -q -p no:cacheprovider -p no:benchmark --timeout 900 "$@" > "$OUT/gpu-large.log" 2>&1 || rc=1
  echo "gpu tests took $(( $(date +%s) - start )) s"
  grep -E "^(FAILED|ERROR)" "$OUT/gpu-tests.log" | head -30
  tail -n 3 "$OUT/gpu-tests.log"; tail -n 3 "$OUT/gpu-large.log"
fi
if has bench; then
  # shellcheck disable=SC2086  # BENCH_ARGS is a list of options (--quick: two sizes)
  python3 -m benchmarks reduce ${BENCH_ARGS:-} > "$OUT/bench-reduce.log" 2>&1 || { rc=1; tail -20 "$OUT/bench-reduce.log"; }
  # shellcheck disable=SC2086
  python3 -m benchmarks scan ${BENCH_ARGS:-} > "$OUT/bench-scan.log" 2>&1 || { rc=1; tail -20 "$OUT/bench-scan.log"; }
  python3 -m benchmarks summary "$OUT" || rc=1
fi
# the device returns at most 8 files: more than that travel as one archive
if [ "$(ls -A "$OUT" | wc -l)" -gt 8 ]; then
  (cd "$OUT" && tar czf ../multireduce-logs.tgz . && find . -mindepth 1 -delete && mv ../multireduce-logs.tgz logs.tgz)
fi
exit $rc
