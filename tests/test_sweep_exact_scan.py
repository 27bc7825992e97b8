"""python -m benchmarks sweep-exact-scan without a GPU: which pass-2 shapes it compiles for which dtype, and that it
lists them and parses its arguments with CuPy absent."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _sweep():
    from benchmarks import sweep_exact_scan

    return sweep_exact_scan


def test_shared_memory_and_combinations():
    s = _sweep()
    # what ptxas reports for exact_scan_tiles at 256 x 16 (nvcc 13, sm_90): 17152 / 34048 bytes smem
    assert s.shared_bytes(4, 256, 16) == 17152 and s.shared_bytes(8, 256, 16) == 34048
    combos = {(b, i, m): dts for b, i, m, dts in s.combinations(s.BLOCKS, s.ITEMS, s.MIN_BLOCKS)}
    assert "float32" in combos[s.library_shape("float32")] and "float64" in combos[s.library_shape("float64")]
    assert combos[(256, 32, 3)] == ("float32",) and combos[(512, 16, 2)] == ("float32",)  # float64: > 48 KB
    assert (512, 32, 2) not in combos  # no dtype fits
    assert all(b * m <= 2048 for b, _, m in combos) and (512, 5) not in {(b, m) for b, _, m in combos}
    assert len(s.combinations(s.BLOCKS, s.ITEMS, s.MIN_BLOCKS, max_threads_per_sm=1536)) < len(combos)
    assert s.tiles_name("float64", 128, 8, 4) == "mr::exact::exact_scan_tiles<double, double, 128, 8, 4>"


def test_lists_and_parses_without_cupy():
    code = ("import sys; sys.modules['cupy'] = None; from benchmarks.__main__ import main; "
            "sys.exit(main(['sweep-exact-scan', '--list', '--quick']))")
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         env={"PYTHONPATH": str(ROOT), "PATH": ""})
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert any(l.startswith("Block 512 Items 16 MinBlocks 3: tile  8192") and "(the library's for float32)" in l
               for l in lines)
    assert any(l.startswith("Block 512 Items  8 MinBlocks 3: tile  4096") and "(the library's for float32" not in l
               and "float64)" in l for l in lines)
    assert "Block 128" not in run.stdout  # --quick: Block 256/512, around the library's shapes
    assert subprocess.run([sys.executable, "-m", "benchmarks", "sweep-exact-scan", "--help"], cwd=ROOT,
                          capture_output=True).returncode == 0
