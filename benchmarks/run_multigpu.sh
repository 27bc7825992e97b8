#!/usr/bin/env bash
# One device call on a machine with several GPUs: install the carried wheels (the Dask stack and
# dask-cuda), run the multi-GPU tests, start a TLS cluster with GPU workers through deploy/ and use it,
# then the multi-GPU benchmarks. Short table last; logs in $OUT.
#   bash benchmarks/run_multigpu.sh [PHASES] [multigpu suite args...]
# PHASES: "all" (= "tests soak bench") or a quoted list of tests (multi-GPU, spill, fault and OOM tests, the
# deploy/ TLS cluster), soak (a short soak: 4 clients x MR_SOAK_REQUESTS), soakfull (the full soak: 4 clients x 500,
# 1 KB - 1 GB, in 10 rounds; no new round past MR_SOAK_TIMEOUT - 60 s), bench (multigpu --quick, multigpu-stats
# --exact), paths (multigpu --paths all on every GPU: expressions, some axes, lazy sources, the graph, peak
# memory, beside the held rows), axes (multigpu --paths axes on every GPU: the field's time mean, monthly
# climatology, daily maximum and total, and the tall matrix), scaling (multigpu --scaling), profile (multigpu
# --profile phases, --profile held), calls (multigpu --profile expr, --profile axes and --profile tall: expressions
# over a held array, the field's mean over time and the tall matrix's persisted row sums, each call split into
# the workers' work, the replies, the registration of outputs and the client's own time), notebook (notebooks/xarray_climatology.ipynb through tools/run_notebook.py).
# Each phase fits one device call (<= 10 minutes); soakfull, bench, paths and scaling take one each. Every
# benchmark is `python -m benchmarks SUITE` (--help lists the options).
set -uo pipefail
what=${1:-all}; shift || true
[ "$what" = all ] && what="tests soak bench"
has() { case " $what " in *" $1 "*) return 0;; esac; return 1; }
OUT=${OUT:-/tmp/multireduce-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 MULTIREDUCE_KERNEL_CACHE=/tmp/multireduce-kernels
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl $(ls .whl/ucx/*.whl 2>/dev/null) || exit 1
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=index,name,memory.total --format=csv | tee "$OUT/env.txt"
rc=0
if has tests; then
timeout 420 python3 -m pytest tests/multi_gpu tests/test_placement.py tests/test_faults.py tests/test_direct.py tests/test_scan_placement.py \
  tests/gpu/test_oom.py tests/gpu/test_gpu_exact.py \
  -m "slow or not slow" -q -p no:cacheprovider -p no:benchmark -p no:logging --timeout 240 -rfEs > "$OUT/multi-gpu-tests.log" 2>&1 || rc=1
tail -n 3 "$OUT/multi-gpu-tests.log"; grep -E "^(FAILED|ERROR)|^E  " "$OUT/multi-gpu-tests.log" | head -30
# deploy/: TLS scheduler + GPU workers, a client with the certificate runs sum and cumsum
d=/tmp/mr-deploy; rm -rf $d; mkdir -p $d
bash deploy/make-certs.sh $d/certs > /dev/null
printf '[scheduler]\nhost = "127.0.0.1"\nport = 0\ndashboard = "127.0.0.1:0"\n[tls]\nenabled = true\n[workers]\nkind = "gpu"\n' > $d/c.toml
{ bash deploy/start-scheduler.sh $d/c.toml && bash deploy/start-workers.sh $d/c.toml gpu-node && python3 - <<'PY'
import cupy, dask.array as da, numpy as np, multireduce as mr
from multireduce.deploy import connect
with connect("/tmp/mr-deploy/c.toml", timeout=60) as c:
    n = cupy.cuda.runtime.getDeviceCount()
    c.wait_for_workers(n, timeout=120)
    ws = c.scheduler_info()["workers"]
    print("deploy: workers", len(ws), sorted(w["name"] for w in ws.values()))
    x = np.random.default_rng(0).integers(-1000, 1000, size=(1 << 24) + 3)
    d = c.persist(da.from_array(x, chunks=1 << 21).map_blocks(cupy.asarray))
    s = c.compute(mr.sum(d)).result(); cs = c.compute(mr.cumsum(d)).result()
    print("deploy: sum ok", int(s) == x.sum(), "cumsum ok", bool((cupy.asnumpy(cs) == np.cumsum(x)).all()), type(cs).__name__)
PY
} > "$OUT/deploy.log" 2>&1 || rc=1
bash deploy/stop.sh $d/c.toml >> "$OUT/deploy.log" 2>&1
grep -E "^deploy:|scheduler at|workers of node|stopped|Error" "$OUT/deploy.log" | head
cp $d/run/*.log "$OUT/" 2>/dev/null
fi
if has soak || has soakfull; then
# soak: 4 client processes, every result checked, memory sampled after the warm-up and after
# every round; no new round starts 60 s before the timeout, so a long soak still reports the rounds it finished
if has soakfull; then soak_s=${MR_SOAK_TIMEOUT:-560} requests=500 rounds=10; else
  soak_s=${MR_SOAK_TIMEOUT:-150} requests=${MR_SOAK_REQUESTS:-100} rounds=${MR_SOAK_ROUNDS:-5}; fi
timeout $soak_s python3 -m benchmarks soak --clients 4 --requests $requests --max-bytes ${MR_SOAK_MAX_BYTES:-1e9} \
  --rounds $rounds --deadline $((soak_s > 120 ? soak_s - 60 : soak_s / 2)) --out "$OUT/soak.json" > "$OUT/soak.log" 2>&1 || rc=1
grep -E "^soak:" "$OUT/soak.log" | tail -n 12
python3 - "$OUT/soak.json" <<'PY' || tail -n 25 "$OUT/soak.log"
import json, sys
r = json.load(open(sys.argv[1]))
keys = ("ok", "complete", "done", "clients", "requests", "workers", "warmup_requests", "errors", "requests_per_s", "gpu_used_persisted_bytes", "gpu_used_peak_bytes", "distributed_bookkeeping_growth",
        "small_request_per_s", "leaks", "unbounded_cache_growth", "gpu_scope", "stopped_at_deadline")
print(json.dumps({k: r.get(k) for k in keys}, default=str))
print("growth MB:", json.dumps({w: {m: round(v / 2**20, 1) for m, v in g.items()} for w, g in r["growth_bytes"].items()}))
PY
fi
if has bench; then
timeout ${MR_BENCH_TIMEOUT:-300} python3 -m benchmarks multigpu --quick "$@" > "$OUT/bench-multigpu.log" 2>&1 || { rc=1; tail -20 "$OUT/bench-multigpu.log"; }
cp docs/bench_multigpu_latest.* "$OUT/" 2>/dev/null
timeout ${MR_STATS_TIMEOUT:-200} python3 -m benchmarks multigpu-stats --exact --gpus 1,$(nvidia-smi -L | wc -l) --per-gpu-gib 8 --chunk-log2 26,28 \
  > "$OUT/bench-multigpu-stats.log" 2>&1 || { rc=1; tail -20 "$OUT/bench-multigpu-stats.log"; }
cp docs/bench_multigpu_stats.* "$OUT/" 2>/dev/null
cat "$OUT/bench_multigpu_latest.md" "$OUT/bench_multigpu_stats.md" 2>/dev/null | tail -n 60
fi
if has paths; then
# the new rows beside the held ones, Dask's placement, 8 GiB per GPU, chunks 2^24 / 2^26 / 2^28; the short
# table printed last, the full one and the memory table in $OUT/bench_multigpu_latest.md
timeout ${MR_PATHS_TIMEOUT:-500} python3 -m benchmarks multigpu --paths all --placements dask --repeats 3 --timeout-s 30 \
  --budget-s ${MR_PATHS_BUDGET:-360} "$@" > "$OUT/bench-multigpu-paths.log" 2>&1 || rc=1
cp docs/bench_multigpu_latest.* "$OUT/" 2>/dev/null
sed -n '/^Peak memory/,$p' "$OUT/bench-multigpu-paths.log"
fi
if has axes; then
timeout ${MR_AXES_TIMEOUT:-500} python3 -m benchmarks multigpu --paths axes --placements dask --repeats 3 --timeout-s 60 \
  --no-task-stream "$@" > "$OUT/bench-multigpu-axes.log" 2>&1 || rc=1
cp docs/bench_multigpu_latest.* "$OUT/" 2>/dev/null
sed -n '/rows, .* not ok/,$p' "$OUT/bench-multigpu-axes.log"
fi
if has calls; then
timeout 240 python3 -m benchmarks multigpu --profile expr "$@" > "$OUT/profile-expr.log" 2>&1 || rc=1
timeout 240 python3 -m benchmarks multigpu --profile axes "$@" > "$OUT/profile-axes.log" 2>&1 || rc=1
timeout 240 python3 -m benchmarks multigpu --profile tall "$@" > "$OUT/profile-tall.log" 2>&1 || rc=1
grep -h "^x:\|^field\|^|" "$OUT/profile-expr.log" "$OUT/profile-axes.log" "$OUT/profile-tall.log" | awk '!seen[$0]++'
fi
if has notebook; then
# notebooks/xarray_climatology.ipynb as a script (the image has no Jupyter): a year of a 0.25-degree grid on
# every GPU, our climatology beside xarray's own group-by on the whole field; figures to $OUT
timeout ${MR_NOTEBOOK_TIMEOUT:-400} python3 tools/run_notebook.py notebooks/xarray_climatology.ipynb --out "$OUT" \
  > "$OUT/notebook-xarray-climatology.log" 2>&1 || { rc=1; tail -n 30 "$OUT/notebook-xarray-climatology.log"; }
grep -vE "^\[figure" "$OUT/notebook-xarray-climatology.log" | grep -E "multireduce|matches|grid|workers|cell" | tail -n 25
fi
if has scaling; then
timeout ${MR_SCALING_TIMEOUT:-540} python3 -m benchmarks multigpu --scaling --repeats 3 --timeout-s 30 \
  --budget-s ${MR_SCALING_BUDGET:-400} "$@" > "$OUT/bench-multigpu-scaling.log" 2>&1 || rc=1
cp docs/bench_multigpu_scaling.* "$OUT/" 2>/dev/null
sed -n '/rows, .* not ok/,$p' "$OUT/bench-multigpu-scaling.log"
fi
if has profile; then
timeout 200 python3 -m benchmarks multigpu --profile phases > "$OUT/profile-multigpu.log" 2>&1 || rc=1
tail -n 40 "$OUT/profile-multigpu.log"
# the direct paths (held .compute() / .persist()) phase by phase, beside Dask's per-task floor
for c in 26 28; do timeout 90 python3 -m benchmarks multigpu --profile held --chunk-log2 $c > "$OUT/profile-held-$c.log" 2>&1 || rc=1; done
grep -h "^|\|workers," "$OUT"/profile-held-*.log
fi
# the device returns at most 8 files: more than that travel as one archive
if [ "$(ls -A "$OUT" | wc -l)" -gt 8 ]; then
  (cd "$OUT" && tar czf ../multireduce-logs.tgz . && find . -mindepth 1 -delete && mv ../multireduce-logs.tgz logs.tgz)
fi
exit $rc
