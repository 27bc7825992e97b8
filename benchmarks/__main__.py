"""python -m benchmarks <suite> [options]: one entry point for every benchmark suite.

"python -m benchmarks --help" lists the suites; "python -m benchmarks <suite> --help" their options (no
GPU needed: a suite imports CuPy only once its arguments are read). Profiles are options of the suite they
profile (--profile [NAME]). benchmarks/run_gpu.sh and benchmarks/run_multigpu.sh run them on a GPU machine.
"""

from __future__ import annotations

import argparse
import importlib
import sys

#: suite -> (module of this package, what it measures); every module has main(argv) -> rows or exit code
SUITES = {
    "reduce": ("bench_reduce", "sums against CuPy, torch and the copy roof; float32 vs float64 accumulators "
                               "(--profile small: where a small sum's microseconds go)"),
    "scan": ("bench_scan", "cumsum against CuPy, torch and the copy roof; free vs fixed look-back "
                           "(--profile: one scan and one reduce for ncu)"),
    "stats": ("bench_stats", "argmax, var, nansum, nanmax, any, count_nonzero against CuPy and torch "
                             "(--profile call | kernels)"),
    "segments": ("bench_segments", "segmented sums and scans against CuPy and torch "
                                   "(--profile kernels | call)"),
    "groupby": ("bench_groupby", "group-by reductions (sorted, unsorted, a field by month and by day) against "
                                 "the copy roof"),
    "exact": ("bench_exact", "exact sums and cumsums against the plain ones, CPU or GPU "
                             "(--profile shapes | terms | ncu | call | scan)"),
    "fusion": ("bench_fusion", "sums and cumsums of elementwise expressions read through the steps vs unfused, "
                               "dask.array and the copy roof"),
    "cub": ("bench_cub", "CUB through cuda.compute beside ours, CuPy and torch"),
    "first-call": ("first_call", "first call in a fresh process with empty caches, against CuPy's"),
    "multigpu": ("multigpu", "multireduce vs dask.array across GPUs: held, expression, some-axes, lazy and "
                             "graph paths, peak memory, --scaling (--profile phases | held)"),
    "multigpu-stats": ("multigpu_stats", "argmax, var and exact sums and scans across GPUs vs dask.array"),
    "soak": ("soak", "client processes sending checked requests in rounds, memory per worker "
                     "(--memory-probe: what leaves GPU memory behind)"),
    "sweep-scan": ("sweep_scan", "every look-back tile shape of the scan"),
    "sweep-exact-scan": ("sweep_exact_scan", "the exact cumsum's pass-2 shapes, bit-checked"),
}
#: commands that read what suites wrote rather than measure
OTHER = {"summary": ("summary", "the single-GPU goals table from reduce's and scan's JSON in a folder")}


def _listing() -> str:
    width = max(map(len, [*SUITES, *OTHER]))
    lines = ["suites:"] + [f"  {name:<{width}}  {text}" for name, (_, text) in SUITES.items()]
    lines += ["", "other commands:"] + [f"  {name:<{width}}  {text}" for name, (_, text) in OTHER.items()]
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    known = {**SUITES, **OTHER}
    if argv and argv[0] in known:
        module = importlib.import_module(f"benchmarks.{known[argv[0]][0]}")
        result = module.main(argv[1:])
        return result if isinstance(result, int) else 0
    top = argparse.ArgumentParser(prog="python -m benchmarks", usage="python -m benchmarks <suite> [options]",
                                  description=__doc__.split("\n\n")[1], epilog=_listing(),
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
    top.add_argument("suite", metavar="<suite>", help="one of the suites below")
    args = top.parse_args(argv[:1])
    top.error(f"<suite>: expected one of {', '.join(known)}; got {args.suite!r}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
