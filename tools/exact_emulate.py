"""Build and drive tools/exact_host_emulator.cpp: the words of kernels/exact.cuh for one row, and the exact
cumsum of kernels/exact_scan.cuh, computed on the host by the kernels' own device functions
(tests/test_exact_emulated.py, tests/test_exact_scan_emulated.py; no GPU needed).

    python tools/exact_emulate.py     (builds it and prints the words of a small float32 row)
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "tools" / "exact_host_emulator.cpp"
KERNEL = ROOT / "kernels" / "exact.cuh"
SCAN_KERNEL = ROOT / "kernels" / "exact_scan.cuh"  # included by exact.cuh
_CODES = {np.dtype(np.float16): "e", np.dtype(np.float32): "f", np.dtype(np.float64): "d"}


def compiler() -> str | None:
    return shutil.which(os.environ.get("CXX", "g++"))


def build() -> Path:
    """The emulator binary, cached in the temp dir under a hash of its two sources."""
    cxx = compiler()
    if cxx is None:
        raise RuntimeError("no C++ compiler (g++) on PATH")
    kernel, scan, source = KERNEL.read_bytes(), SCAN_KERNEL.read_bytes(), SOURCE.read_bytes()
    key = hashlib.sha256(kernel + b"\0" + scan + b"\0" + source + cxx.encode()).hexdigest()[:16]
    binary = Path(tempfile.gettempdir()) / f"mr_exact_emulator_{key}"
    if binary.exists():
        return binary
    with tempfile.TemporaryDirectory() as tmp:
        # exact.cuh's #include "common.cuh" finds this empty file: the emulator's shims stand in for it
        (Path(tmp) / "exact.cuh").write_bytes(kernel)
        (Path(tmp) / "exact_scan.cuh").write_bytes(scan)
        (Path(tmp) / "common.cuh").write_text("#pragma once\n")
        partial = Path(tmp) / "emulator"
        subprocess.run([cxx, "-std=c++17", "-O2", "-ffp-contract=off", "-fno-strict-aliasing", "-I", tmp,
                        "-o", str(partial), str(SOURCE)], check=True, capture_output=True, text=True)
        shutil.move(str(partial), binary)  # atomic enough for parallel test runs: same content either way
    return binary


def emulate_words(x: np.ndarray, grid: int = 1, block: int = 256, terms: int = 4, unroll: int = 4,
                  byte_offset: int = 0) -> np.ndarray:
    """The (KWORDS + 1,) int64 words the kernel gives for the 1-d row ``x`` with ``grid`` blocks of ``block``
    threads, ``terms`` expansion terms, ``unroll`` packs per load batch, the row starting ``byte_offset``
    bytes past a 16-byte boundary (terms 2/3/4/6/8 and unroll 1/2/4/8 are compiled in)."""
    x = np.ascontiguousarray(x)
    code = _CODES[x.dtype]
    run = subprocess.run([str(build()), code, str(x.size), str(grid), str(block), str(terms),
                          str(unroll), str(byte_offset)],
                         input=x.tobytes(), capture_output=True, check=True)
    return np.array([int(v) for v in run.stdout.split()], dtype=np.int64)


def emulate_round(words: np.ndarray, dt, skipnan: bool = False, divisor: int = 1) -> np.ndarray:
    """kernels/exact.cuh round_words of each row of ``words`` ((rows, KWORDS + 1) int64) over ``divisor``
    (1: a sum; the count: a mean) for the float dtype ``dt``: float32 as exact_round_rows<float> stores it
    (FromRounded<float>, from the bits), else the float64 values (what the kernel converts to ``dt``)."""
    words = np.ascontiguousarray(words, dtype=np.int64)
    fi = np.finfo(dt)
    run = subprocess.run([str(build()), "round", str(fi.nmant + 1), str(fi.minexp), str(int(skipnan)),
                          str(int(divisor)), str(words.shape[0])], input=words.tobytes(), capture_output=True,
                         check=True)
    fields = np.array([int(v) for v in run.stdout.split()], dtype=np.int64).reshape(-1, 2)
    if np.dtype(dt) == np.float32:  # the kernel's own float store (FromRounded<float>), not NumPy's cast
        return fields[:, 1].astype(np.uint32).view(np.float32)
    return fields[:, 0].copy().view(np.float64)


def emulate_scan(x: np.ndarray, out_dtype=None, block: int = 256, items: int = 16,
                 skipnan: bool = False, carry=None) -> tuple[np.ndarray, int]:
    """The exact cumsum of the 1-d ``x`` as kernels/exact_scan.cuh computes it with tiles of ``block`` (a
    multiple of 32) x ``items`` elements (1, 2, 3, 4, 8, 16 or 32): (outputs of ``out_dtype``, default x's,
    and the count of outputs pass 2 could not prove, which fallback_walk rounded from the exact words).
    ``carry``: an exact.LaneState of what precedes ``x`` (a Dask chunk's carry), turned into the row's first
    words slot by cupy_exact.carry_words as the GPU path does, or that slot itself ((KTILEOUT,) int64 words
    in any form the words' cumsum gives, as cupy_exact.carry_after passes it from one segment of a row to
    the next)."""
    out, unproved, _, _, _ = emulate_scan_paths(x, out_dtype, block, items, skipnan, carry)
    return out, unproved


def emulate_scan_paths(x: np.ndarray, out_dtype=None, block: int = 256, items: int = 16,
                       skipnan: bool = False, carry=None) -> tuple[np.ndarray, int, int, int, int]:
    """emulate_scan's (outputs, unproved), then how many of pass 2's threads ran the exact path (exact_outputs:
    their fast path, approximate_outputs, gave up; every thread when x or the output is float64), how many
    threads had elements, and how many tiles the tile-wide fast path (fast_bound: the tile scanned in plain
    double) finished."""
    from multireduce.backends import cupy_exact

    x = np.ascontiguousarray(x)
    out_dt = np.dtype(out_dtype or x.dtype)
    if carry is None:
        words = np.zeros(cupy_exact.KTILEOUT, np.int64)
    elif isinstance(carry, np.ndarray):
        words = np.ascontiguousarray(carry, dtype=np.int64)
    else:
        words = cupy_exact.carry_words([carry])[0]
    run = subprocess.run([str(build()), "scan", _CODES[x.dtype], _CODES[out_dt], str(x.size), str(block),
                          str(items), str(int(skipnan))], input=x.tobytes() + words.tobytes(),
                         capture_output=True, check=True)
    fields = [int(v) for v in run.stdout.split()]
    raw = np.array(fields[4:], dtype=np.uint64).astype({2: np.uint16, 4: np.uint32, 8: np.uint64}[out_dt.itemsize])
    return raw.view(out_dt), fields[0], fields[1], fields[2], fields[3]


def emulate_seed(words: np.ndarray, skipnan: bool = False) -> list[tuple[float, float, float, int]]:
    """exact_scan.cuh seed_of_words of each row of ``words`` ((rows, KWORDS + 3) int64: words, then the
    NaN/+inf/-inf counts): [(hi, lo, eb, flags)]."""
    words = np.ascontiguousarray(words, dtype=np.int64)
    run = subprocess.run([str(build()), "seed", str(words.shape[0]), str(int(skipnan))], input=words.tobytes(),
                         capture_output=True, check=True)
    fields = np.array([int(v) for v in run.stdout.split()], dtype=np.int64).reshape(-1, 4)
    as_float = fields[:, :3].copy().view(np.float64)
    return [(float(h), float(lo), float(e), int(f)) for (h, lo, e), f in zip(as_float, fields[:, 3])]


if __name__ == "__main__":
    print(emulate_words(np.arange(10, dtype=np.float32)))
