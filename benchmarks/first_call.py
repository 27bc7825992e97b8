"""First-call cost: each built-in reduction and scan in a fresh process with empty kernel caches, against
CuPy's own function in the same conditions, and what ``import multireduce`` adds to ``import cupy``.

    python -m benchmarks first-call [--dtype float32] [--n 1048576] [--no-prebuilt]

Every measurement runs in its own subprocess whose CUPY_CACHE_DIR (and MULTIREDUCE_KERNEL_CACHE) is a new
empty directory, so nothing compiled by an earlier run is reused. "first call" is the wall time of the
first call plus a device synchronize; "second call" the same for the next call; "NVRTC runs" counts the
compiles during both (0 for ours: the built-ins and what finishes them are prebuilt). ``--no-prebuilt`` sets
MULTIREDUCE_NO_PREBUILT=1, to see what the run-time compiler costs without the shipped binaries.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks import harness as h

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import cupy
t1 = time.perf_counter()
import multireduce as mr
t2 = time.perf_counter()
which, name, dtype, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
x = (cupy.random.random(n) * 2 + 0.5).astype(dtype)
cupy.cuda.get_current_stream().synchronize()
fn = getattr(mr if which == "multireduce" else cupy, name)
from cupy.cuda import compiler  # every NVRTC run, ours and CuPy's elementwise kernels, goes through here
compiles = []
compile_using_nvrtc = compiler.compile_using_nvrtc
compiler.compile_using_nvrtc = lambda *a, **k: compiles.append(1) or compile_using_nvrtc(*a, **k)
offsets = cupy.arange(0, n, 997, dtype=cupy.int64)  # the segment functions' starts
call = (lambda: fn(x, offsets)) if name.startswith("segment_") else (lambda: fn(x))
times = []
for _ in range(2):
    s = time.perf_counter()
    call()
    cupy.cuda.get_current_stream().synchronize()
    times.append(time.perf_counter() - s)
from multireduce import kernels
print(json.dumps({"import_cupy": t1 - t0, "import_multireduce": t2 - t1, "first": times[0],
                  "second": times[1], "nvrtc": len(compiles), "prebuilt_modules": sum(map(bool, kernels._prebuilt_modules.values()))}))
"""

FUNCTIONS = ["sum", "prod", "min", "max", "mean", "cumsum", "cumprod", "argmax", "var", "nansum", "nanmax", "any",
             "count_nonzero", "segment_reduce", "segment_scan"]
#: no CuPy function of that name: the CuPy column stays empty
NO_CUPY = {"segment_reduce", "segment_scan"}


def run(which: str, name: str, dtype: str, n: int, prebuilt: bool) -> dict:
    with tempfile.TemporaryDirectory(prefix="mr-first-call-") as cache:
        env = {**os.environ, "CUPY_CACHE_DIR": cache, "MULTIREDUCE_KERNEL_CACHE": cache,
               "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        if not prebuilt:
            env["MULTIREDUCE_NO_PREBUILT"] = "1"
        proc = subprocess.run([sys.executable, "-c", CHILD, which, name, dtype, str(n)], env=env,
                              capture_output=True, text=True, timeout=600)
        if proc.returncode:
            raise RuntimeError(f"{which}.{name}: {proc.stderr[-3000:]}")
        return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = h.parser("first-call", __doc__)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--n", type=int, default=1 << 20)
    parser.add_argument("--no-prebuilt", action="store_true")
    parser.add_argument("--functions", default=",".join(FUNCTIONS), help="comma-separated subset of: " + ", ".join(FUNCTIONS))
    args = parser.parse_args(argv)
    header = (f"function ({args.dtype}, n={args.n})", "multireduce first ms", "CuPy first ms", "ratio",
              "multireduce second ms", "prebuilt modules loaded", "NVRTC runs (ours / CuPy's)")
    print(h.md_table(header, []), end="")
    imports = []
    for name in args.functions.split(","):
        ours = run("multireduce", name, args.dtype, args.n, not args.no_prebuilt)
        imports.append(ours["import_multireduce"])
        theirs = None if name in NO_CUPY else run("cupy", name, args.dtype, args.n, True)
        cells = (name, f"{ours['first'] * 1e3:.1f}",
                 f"{theirs['first'] * 1e3:.1f}" if theirs else "-",
                 (f"{ours['first'] / theirs['first']:.2f}" if theirs["first"] > 0 else "inf") if theirs else "-",
                 f"{ours['second'] * 1e3:.2f}", ours["prebuilt_modules"],
                 f"{ours['nvrtc']} / {theirs['nvrtc'] if theirs else '-'}")
        print(h.md_table(header, [cells]).splitlines()[-1], flush=True)
    imports.sort()
    print(f"\nimport multireduce after import cupy: median {imports[len(imports) // 2]:.3f} s "
          f"(min {imports[0]:.3f}, max {imports[-1]:.3f})")
    return 0

