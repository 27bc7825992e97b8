"""Compile every kernel instantiation the dtype table produces with nvcc, for each target architecture.

The source is the same text CuPy compiles (``multireduce.kernels.module_text``); each operator's
instantiations form one translation unit, compiled in parallel.

    python tools/compile_kernels.py [--arch sm_80 --arch sm_90] [--jobs 2] [--nvrtc] [--only segment]

A full run (every unit, at least sm_80 and sm_90) that compiles everything writes ``kernels-compiled.json``
beside this file: the hash of every translation unit's text (sources, functors and the instantiation
list) and the compiler that took them. That file is committed; tests/test_packaging.py fails when the
kernels no longer hash to it, so a kernel change is compiled in full once, where nvcc is, and not again
on every test run (this takes 5-20 minutes on two cores). tools/build_prebuilt.py runs it after building.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from multireduce import kernels
from multireduce.operators import get_operator
from multireduce.tuning import policy

STAMP = Path(__file__).resolve().parent / "kernels-compiled.json"
# the architectures the prebuilt binaries carry cubins for; a run for fewer does not vouch for the sources
STAMP_ARCHS = ("sm_80", "sm_90")


def unit_name(opname: str, entry: str) -> str:
    """One translation unit per (operator, source): "sum" production, "sum-catalogue" the catalogue."""
    return opname if entry == kernels.ENTRY else f"{opname}-{entry.split('.')[0]}"


def _with_table(source: str, expressions: list[str]) -> str:
    """``source`` and a table taking every expression's address, so that nvcc instantiates each."""
    body = ",\n  ".join(f"(void*)&{e}" for e in expressions)
    return source + f"\nvoid* const multireduce_instantiations[] = {{\n  {body}\n}};\n"


def translation_units() -> list[tuple[str, str, list[str]]]:
    """(unit name, source text with the instantiation table, name expressions) for every unit."""
    units = []
    for opname, entry, expressions in kernels.all_instantiations(policy(9)):
        text = _with_table(kernels.module_text(get_operator(opname), entry), expressions)
        units.append((unit_name(opname, entry), text, expressions))
    for entry in kernels.STANDALONE:  # the operator-free sources (statistics, exact sums, ...)
        expressions = kernels.standalone_instantiations(entry)
        units.append((entry.split(".")[0], _with_table(kernels.kernel_source(entry), expressions), expressions))
    from multireduce.backends import cupy_segment  # per-operator modules of their own

    for opname, expressions in cupy_segment.all_segment_instantiations():
        text = _with_table(cupy_segment.module_text(get_operator(opname)), expressions)
        units.append((f"{opname}-segment", text, expressions))
    for opname, expressions in cupy_segment.all_rows_instantiations():  # group-by along a leading axis
        text = _with_table(cupy_segment.rows_module_text(get_operator(opname)), expressions)
        units.append((f"{opname}-rows", text, expressions))
    return units


def units_key(units: list[tuple[str, str, list[str]]]) -> str:
    """SHA-256 over every unit's name and text (the text ends with its instantiation table)."""
    digest = hashlib.sha256()
    for name, text, _ in units:
        digest.update(name.encode() + b"\0" + text.encode() + b"\0")
    return digest.hexdigest()


def read_stamp() -> dict:
    """The committed record of the last full run that compiled everything ({} where there is none)."""
    try:
        return json.loads(STAMP.read_text())
    except (OSError, ValueError):
        return {}


def nvcc_version(nvcc: str) -> str:
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    return next((line.strip() for line in out.splitlines() if "release" in line), out.strip()[-80:])


def find_nvrtc() -> str | None:
    """libnvrtc from the CUDA toolkit or the nvidia-cuda-nvrtc wheel (what CuPy itself uses)."""
    import ctypes.util
    import glob

    candidates = glob.glob(os.path.join(sys.prefix, "lib", "python*", "site-packages", "nvidia", "cu*", "lib", "libnvrtc.so*"))
    candidates += glob.glob("/usr/local/cuda/lib64/libnvrtc.so*")
    found = ctypes.util.find_library("nvrtc")
    return (sorted(c for c in candidates if "builtins" not in c) or [found])[0]


def nvrtc_compile(lib_path: str, text: str, expressions: list[str], arch: str) -> tuple[bool, str]:
    """Compile as CuPy's RawModule does (NVRTC, name expressions); returns (ok, log)."""
    import ctypes

    lib = ctypes.CDLL(lib_path)
    prog = ctypes.c_void_p()
    assert lib.nvrtcCreateProgram(ctypes.byref(prog), text.encode(), b"multireduce.cu", 0, None, None) == 0
    for e in expressions:
        lib.nvrtcAddNameExpression(prog, e.encode())
    opts = [b"--std=c++17", f"--gpu-architecture=compute_{arch.split('_')[1]}".encode()]
    arr = (ctypes.c_char_p * len(opts))(*opts)
    rc = lib.nvrtcCompileProgram(prog, len(opts), arr)
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    buf = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, buf)
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    return rc == 0, buf.value.decode(errors="replace")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", action="append", default=None, help="e.g. sm_80 (repeatable)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--nvcc", default=shutil.which("nvcc") or "nvcc")
    parser.add_argument("--nvrtc", action="store_true", help="also compile through NVRTC, as CuPy does")
    parser.add_argument("--only", default="", help="units whose name contains this (e.g. segment, stats)")
    parser.add_argument("--no-stamp", action="store_true", help=f"leave {STAMP.name} as it is")
    args = parser.parse_args(argv)
    archs = args.arch or ["sm_80", "sm_90"]
    units = [u for u in translation_units() if args.only in u[0]]
    work = tempfile.mkdtemp(prefix="multireduce-nvcc-")
    jobs = []
    nvrtc_lib = find_nvrtc() if args.nvrtc else None
    if args.nvrtc and not nvrtc_lib:
        print("--nvrtc: libnvrtc not found (pip install nvidia-cuda-nvrtc)", file=sys.stderr)
        return 1
    expressions = {}
    for name, text, exprs in units:
        path = os.path.join(work, f"{name}.cu")
        with open(path, "w") as f:
            f.write(text)
        expressions[name] = exprs
        for arch in archs:
            jobs.append((name, arch, path, len(exprs)))
            if nvrtc_lib:
                jobs.append((name, f"nvrtc:{arch}", path, len(exprs)))

    def compile_one(job):
        name, arch, path, count = job
        start = time.perf_counter()
        if arch.startswith("nvrtc:"):  # every unit's own expressions (operator-free and segment units too)
            text = open(path).read().split("\nvoid* const multireduce_instantiations")[0]
            ok, log = nvrtc_compile(nvrtc_lib, text, expressions[name], arch.split(":")[1])
            proc = subprocess.CompletedProcess([], 0 if ok else 1, "", log)
            return name, arch, count, proc, time.perf_counter() - start
        cmd = [args.nvcc, "-std=c++17", f"-arch={arch}", "-c", path, "-o", f"{path}.{arch}.o"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        return name, arch, count, proc, time.perf_counter() - start

    failed = 0
    total = 0
    with ThreadPoolExecutor(args.jobs) as pool:
        for name, arch, count, proc, seconds in pool.map(compile_one, jobs):
            total += count
            status = "ok" if proc.returncode == 0 else "FAILED"
            print(f"{status:6} {name:13} {arch}: {count} instantiations in {seconds:.1f} s", flush=True)
            if proc.returncode != 0:
                failed += 1
                print(proc.stderr[-20000:], file=sys.stderr)
    print(f"compiled {total} kernel instantiations for {', '.join(archs)}: {failed} translation units failed")
    shutil.rmtree(work, ignore_errors=True)
    if not failed and not args.only and not args.no_stamp and set(STAMP_ARCHS) <= set(archs):
        stamp = {"key": units_key(units), "archs": sorted(archs), "nvcc": nvcc_version(args.nvcc),
                 "nvrtc": bool(nvrtc_lib), "units": len(units), "instantiations": sum(len(u[2]) for u in units)}
        STAMP.write_text(json.dumps(stamp, indent=1, sort_keys=True) + "\n")
        print(f"wrote {STAMP}: these sources compiled in full")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
