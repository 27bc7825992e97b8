"""Dask's array expressions (``array.query-planning``, opt-in in dask today): every public function either
works as with classic dask arrays or raises a TypeError that names the setting. The setting is read when
dask.array is first imported, so each case runs in a fresh interpreter."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("dask.array")

SCRIPT = textwrap.dedent("""
    import dask
    dask.config.set({"array.query-planning": True})
    import dask.array as da
    import numpy as np
    import multireduce as mr

    x = da.from_array(np.random.default_rng(0).standard_normal(1000), chunks=100)
    assert type(x).__module__.startswith("dask.array._array_expr"), type(x)
    calls = {
        "reduce": lambda: mr.reduce(x, "sum"), "scan": lambda: mr.scan(x, "sum"),
        "segment_reduce": lambda: mr.segment_reduce(x, [0, 10, 500]),
        "segment_scan": lambda: mr.segment_scan(x, [0, 10, 500]),
        "sum_exact": lambda: mr.sum(x, exact=True), "sum_compute": lambda: mr.sum(x, compute=True),
        "cumsum_exact": lambda: mr.cumsum(x, exact=True),
        "groupby_reduce": lambda: mr.groupby_reduce(x, np.arange(1000) % 7, "sum"),
        "persist": lambda: mr.persist(x, balanced=False),
    }
    skip = {"reduce", "scan", "segment_reduce", "segment_scan", "groupby_reduce", "persist", "register_operator",
            "unregister_operator",
            "operators", "Operator", "algorithms", "__version__"}
    calls.update({name: (lambda f=getattr(mr, name): f(x)) for name in mr.__all__ if name not in skip})
    clear = 0
    for name, call in sorted(calls.items()):
        try:
            result = call()
            value = result.compute() if hasattr(result, "compute") else result
        except TypeError as error:
            assert "array.query-planning" in str(error), (name, error)
            clear += 1
        else:
            print("works", name, np.asarray(value).shape)
    print("clear", clear, "of", len(calls))
""")


def test_every_function_works_or_names_the_setting():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("clear ") and int(last.split()[1]) + done.stdout.count("works ") == int(last.split()[-1])
