"""The kernels ship in the wheel, and every instantiation the dtype table produces compiles (nvcc for
sm_80 and sm_90, and NVRTC as CuPy uses it) on machines without a GPU: a recorded full compile that must
match today's sources, and the full compile itself on request."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_wheel_contains_the_cuda_sources(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w",
                    str(tmp_path), str(ROOT)], check=True, timeout=300)
    (wheel,) = tmp_path.glob("multireduce-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for header in ["multireduce.cuh", "catalogue.cuh", "common.cuh", "block.cuh", "reduce.cuh", "scan.cuh",
                   "catalogue/reduce.cuh", "catalogue/scan.cuh"]:
        assert f"multireduce/_cuda/{header}" in names
    assert "multireduce/_prebuilt/index.json" in names
    for opname in ("sum", "prod", "min", "max"):
        assert f"multireduce/_prebuilt/{opname}.fatbin" in names
    from multireduce import kernels

    for entry in kernels.STANDALONE:
        assert f"multireduce/_cuda/{entry}" in names
        assert f"multireduce/_prebuilt/module-{entry.replace('.cuh', '')}.fatbin" in names


def _kernel_names(text: str) -> set[str]:
    import re

    return set(re.findall(r"__global__ void (?:__launch_bounds__\([^)]*\)\)? *)?\s*(\w+)\(", text))


def test_kernel_sources_inline_every_header_and_keep_the_catalogue_apart():
    """The production source (what algorithm="auto" compiles) holds no teaching kernel, and each group of
    name expressions instantiates only kernels of its own source."""
    import re

    import numpy as np

    from multireduce import kernels
    from multireduce.operators import get_operator
    from multireduce.tuning import policy

    production, catalogue = kernels.kernel_source(), kernels.kernel_source(kernels.CATALOGUE_ENTRY)
    for text in (production, catalogue):
        assert '#include "' not in text
        assert "struct half" in text and "block_reduce_ordered" in text
    prod_kernels, cat_kernels = _kernel_names(production), _kernel_names(catalogue)
    assert {"reduce_vectorized", "reduce_ordered_multi_block", "reduce_rows", "reduce_columns", "scan_lookback",
            "scan_columns"} <= prod_kernels
    assert not prod_kernels & cat_kernels, "a kernel is defined in both sources"
    p, op = policy(9), get_operator("sum")
    T = A = kernels.ctype(np.float32)
    shape = p.scan_shape(4, 4, 4)
    for group, defined in [(kernels.reduce_names(T, A, op.cuda_functor, p), prod_kernels),
                           (kernels.scan_names(T, A, A, op.cuda_functor, p, shape), prod_kernels),
                           (kernels.reduce_catalogue_names(T, A, op.cuda_functor, p), cat_kernels),
                           (kernels.scan_catalogue_names(T, A, A, op.cuda_functor, p), cat_kernels)]:
        assert group.entry == (kernels.ENTRY if defined is prod_kernels else kernels.CATALOGUE_ENTRY)
        for role, expression in group.names.items():
            name = re.match(r"mr::(\w+)<", expression).group(1)
            assert name in defined, f"{role}: {name} is not defined in {group.entry}"
    # every catalogue algorithm's kernel is in the catalogue group, never in the production one
    from multireduce.catalogue import REDUCE_ALGORITHMS

    production_roles = set(kernels.reduce_names(T, A, op.cuda_functor, p).names)
    catalogue_roles = set(kernels.reduce_catalogue_names(T, A, op.cuda_functor, p).names)
    assert set(REDUCE_ALGORITHMS) <= production_roles | catalogue_roles
    assert production_roles.isdisjoint(catalogue_roles)


def test_instantiation_groups_cover_both_sources():
    from multireduce import kernels
    from multireduce.tuning import policy

    groups = kernels.all_instantiations(policy(9))
    assert {(op, entry) for op, entry, _ in groups} == {
        (op, entry) for op in ("sum", "prod", "min", "max") for entry in (kernels.ENTRY, kernels.CATALOGUE_ENTRY)} | {
        (op, kernels.ENTRY) for op in ("nansum", "nanprod", "nanmin", "nanmax")}
    for op, entry, expressions in groups:
        assert expressions and len(set(expressions)) == len(expressions)
        assert all(("scan_lookback" in e or "reduce_vectorized" in e or "_rows<" in e or "_columns<" in e
                    or "ordered_multi_block" in e) == (entry == kernels.ENTRY) for e in expressions), (op, entry)


def _compile_tool():
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import compile_kernels
    finally:
        sys.path.pop(0)
    return compile_kernels


def test_every_instantiation_compiled_since_the_kernels_last_changed():
    """Every instantiation of today's kernel sources (functors and instantiation list included) compiled
    with nvcc for sm_80 and sm_90 when tools/kernels-compiled.json was written; a kernel change fails here
    until that full check has run again where nvcc is (it takes minutes, so not on every test run)."""
    tool = _compile_tool()
    stamp = tool.read_stamp()
    key = tool.units_key(tool.translation_units())
    assert stamp.get("key") == key, (
        "the kernel sources or their instantiations changed since every instantiation last compiled: run "
        "`python tools/build_prebuilt.py` (or `python tools/compile_kernels.py` alone), which needs nvcc, "
        f"compiles them all and refreshes {tool.STAMP.relative_to(ROOT)}")
    assert set(tool.STAMP_ARCHS) <= set(stamp["archs"]), stamp["archs"]


@pytest.mark.timeout(3600)
def test_every_instantiation_compiles():
    """The full nvcc (and NVRTC, where libnvrtc is) compile of every instantiation, on request:
    MULTIREDUCE_COMPILE_KERNELS=1. It refreshes tools/kernels-compiled.json when everything compiles."""
    if os.environ.get("MULTIREDUCE_COMPILE_KERNELS") != "1":
        stamp = _compile_tool().read_stamp()
        pytest.skip(f"compiles for minutes; the last full compile ({stamp.get('nvcc', 'no record')}, "
                    f"{', '.join(stamp.get('archs', []))}) is checked against today's sources by the test above; "
                    "MULTIREDUCE_COMPILE_KERNELS=1 compiles them again")
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not installed here")
    args = [sys.executable, str(ROOT / "tools" / "compile_kernels.py"), "--arch", "sm_80", "--arch", "sm_90"]
    if _compile_tool().find_nvrtc():
        args.append("--nvrtc")
    proc = subprocess.run(args, capture_output=True, text=True, timeout=3500)
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-20000:]
    assert "0 translation units failed" in proc.stdout


def test_prebuilt_kernels_match_the_current_source():
    """The shipped binaries were built from today's production source and cover every production
    instantiation; otherwise run `python tools/build_prebuilt.py` (a stale binary is never loaded, but
    every first call would wait for NVRTC)."""
    import json

    from multireduce import kernels
    from multireduce.operators import get_operator
    from multireduce.tuning import policy

    index = json.loads((kernels.PREBUILT_DIR / "index.json").read_text())
    total = 0
    for opname, entry, expressions in kernels.all_instantiations(policy(9), candidates=False):
        if entry != kernels.ENTRY:
            continue
        built = index[opname]
        assert built["key"] == kernels.prebuilt_key(get_operator(opname)), \
            f"{opname}: kernels changed since the prebuilt binaries were made: run tools/build_prebuilt.py"
        missing = sorted(set(expressions) - set(built["mangled"]))
        assert not missing, f"{opname}: {len(missing)} instantiations not prebuilt, e.g. {missing[0]}"
        assert all(m.startswith("_ZN2mr") for m in built["mangled"].values())
        assert {"sm_80", "sm_90"} <= set(built["archs"]) and built["ptx"] == "compute_80"
        total += (kernels.PREBUILT_DIR / built["file"]).stat().st_size
    for entry in kernels.STANDALONE:
        built = index.get("module:" + entry)
        assert built is not None, f"{entry}: not prebuilt: run tools/build_prebuilt.py"
        assert built["key"] == kernels.standalone_key(entry), \
            f"{entry}: changed since the prebuilt binaries were made: run tools/build_prebuilt.py"
        missing = sorted(set(kernels.standalone_instantiations(entry)) - set(built["mangled"]))
        assert not missing, f"{entry}: {len(missing)} instantiations not prebuilt, e.g. {missing[0]}"
        total += (kernels.PREBUILT_DIR / built["file"]).stat().st_size
    from multireduce.backends import cupy_segment

    for what, prefix, groups, key in (
            ("segment kernels", cupy_segment.PREBUILT_PREFIX, cupy_segment.all_segment_instantiations(),
             cupy_segment.prebuilt_key),
            ("row-segment kernels", cupy_segment.ROWS_PREBUILT_PREFIX, cupy_segment.all_rows_instantiations(),
             cupy_segment.rows_prebuilt_key)):
        for opname, expressions in groups:
            built = index.get(prefix + opname)
            assert built is not None, f"{opname}'s {what}: not prebuilt: run tools/build_prebuilt.py"
            assert built["key"] == key(get_operator(opname)), \
                f"{opname}'s {what} changed since the prebuilt binaries were made: run tools/build_prebuilt.py"
            missing = sorted(set(expressions) - set(built["mangled"]))
            assert not missing, f"{opname}'s {what}: {len(missing)} not prebuilt, e.g. {missing[0]}"
            total += (kernels.PREBUILT_DIR / built["file"]).stat().st_size
    assert total < 24e6, f"prebuilt binaries take {total / 1e6:.1f} MB"


@pytest.mark.parametrize("wide", [False, True])
def test_prebuilt_finishing_kernels_cover_every_eager_reduction(monkeypatch, wide):
    """Every (accumulator, result) pair a built-in reduction of CuPy data resolves to, any dtype= included,
    names a finishing kernel (cast, mean's division) that the prebuilt list holds: one CuPy would compile
    at first call otherwise. The names come from kernels.finish_names, as in cupy_backend.finish."""
    import numpy as np

    from multireduce import api, dtypes, kernels
    from multireduce.operators import get_operator

    monkeypatch.setattr(dtypes, "WIDE_FLOAT32_ON_GPU", wide)
    built = set(kernels.standalone_instantiations(kernels.FINISH_ENTRY))
    asked = set()
    for name, mean in [("sum", False), ("prod", False), ("min", False), ("max", False), ("sum", True)]:
        op = get_operator(name)
        kinds = dtypes.ARITHMETIC_KINDS if mean else op.kinds
        for dtype in dtypes.GPU_DTYPES:
            if dtype.kind not in kinds:
                continue
            for requested in (None,) + tuple(d for d in dtypes.GPU_DTYPES if d.kind in kinds):
                # a dict split_every is unhashable: the resolver's cache is bypassed, so `wide` is seen
                plans, *_ = api._resolve_reduction("cupy", op, dtype, 1, None, requested, False, {0: 4}, "auto",
                                                   mean, None, "test")
                asked.add(kernels.finish_names(plans[-1].acc_dtype, plans[-1].out_dtype)["finish"])
    assert "mr::reduce_finish<float, float, mr::half>" in asked and "mr::reduce_finish<double, double, double>" in asked
    assert asked <= built, sorted(asked - built)
    assert ("mr::reduce_finish<double, double, float>" in asked) == wide
