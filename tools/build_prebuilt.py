"""Build the precompiled production kernels shipped in ``multireduce/_prebuilt`` (package data).

For each built-in operator, the production instantiations of ``kernels.all_instantiations`` (the list CI
compiles with tools/compile_kernels.py, less the sweep's candidate tiles) become one fatbin: cubins for
the ARCHS below and compute_80 PTX, which the driver JIT-compiles for any other GPU of compute capability
8.0 or newer. ``index.json`` records,
per operator, the SHA-256 of the source text (``kernels.prebuilt_key``) and each name expression's
mangled name, read from the relocations of the host object that takes every kernel's address (the host
stub of a kernel has the device kernel's mangled name). At run time ``kernels.get_kernels`` loads a fatbin
only when that hash matches the current source; otherwise it compiles with NVRTC as before.

    python tools/build_prebuilt.py [--jobs 2] [--no-check]

Rebuild after any change to kernels/*.cuh, the operators' functors or the policy: tests/test_packaging.py
fails until the index matches. After building, it compiles every instantiation (the catalogue and the
sweep's tiles too) with tools/compile_kernels.py, which records the sources it compiled in
tools/kernels-compiled.json (tests/test_packaging.py fails until that matches too); ``--no-check`` skips it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from multireduce import kernels
from multireduce.backends import cupy_segment
from multireduce.operators import get_operator
from multireduce.tuning import policy

# cubins for the GPUs measured or most used (sm_80 also runs on sm_86/sm_89); the rest JIT the PTX once (the
# driver caches the result). sm_100/sm_120 cubins would double the size (each operator ~2-3 MB per arch).
ARCHS = ("sm_80", "sm_90")
PTX = "compute_80"
OUT = Path(__file__).resolve().parent.parent / "multireduce" / "_prebuilt"
ARRAY = "multireduce_instantiations"


def gencode_flags() -> list[str]:
    flags = [f"-gencode=arch=compute_{a.split('_')[1]},code={a}" for a in ARCHS]
    return flags + [f"-gencode=arch={PTX},code={PTX}"]


def translation_unit(source: str, expressions: list[str]) -> str:
    body = ",\n  ".join(f"(void*)&{e}" for e in expressions)
    return source + f"\nextern \"C\" void* const {ARRAY}[] = {{\n  {body}\n}};\n"


def mangled_names(nvcc: str, path: str, count: int) -> list[str]:
    """The device symbols of the kernels the pointer array takes, in array order.

    The array's relocations point into the host object's .text, at each kernel's host stub; a stub has the
    kernel's mangled name with the internal-linkage marker (``_ZN2mrL``), which the device entry lacks.
    Every name is checked against the entry points of a cubin of the same source."""
    obj = path + ".host.o"
    subprocess.run([nvcc, "-std=c++17", "-arch=sm_90", "-Xcompiler", "-fPIC", "-c", path, "-o", obj],
                   check=True, capture_output=True, text=True)
    at = {}
    for line in subprocess.run(["nm", obj], check=True, capture_output=True, text=True).stdout.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] in "tTwW":
            at[int(parts[0], 16)] = parts[2]
    relocs = subprocess.run(["readelf", "-rW", obj], check=True, capture_output=True, text=True).stdout
    section = relocs.split("Relocation section '.rela.data.rel.ro")[1].split("Relocation section")[0]
    rows = []
    for line in section.splitlines()[2:]:
        # a template's stub is local (".text + offset"); a plain kernel's is a global symbol ("name + 0")
        m = re.match(r"([0-9a-f]+)\s+\S+\s+\S+\s+\S+\s+(\S+) \+ ([0-9a-f]+)", line.strip())
        if m:
            symbol = at[int(m.group(3), 16)] if m.group(2) == ".text" else m.group(2)
            rows.append((int(m.group(1), 16), symbol))
    names = [_external(name) for _, name in sorted(rows)]
    if len(names) != count:
        raise RuntimeError(f"read {len(names)} kernel symbols from {obj}, expected {count}")
    cubin = path + ".sm_90.cubin"
    subprocess.run([nvcc, "-std=c++17", "-cubin", "-arch=sm_90", path, "-o", cubin],
                   check=True, capture_output=True, text=True)
    entries = set(subprocess.run(["readelf", "-sW", cubin], check=True, capture_output=True,
                                 text=True).stdout.split())
    missing = [n for n in names if n not in entries]
    if missing:
        raise RuntimeError(f"{len(missing)} symbols are not entry points of the cubin, e.g. {missing[0]}")
    return names


def _external(symbol: str) -> str:
    """The device entry's name for a host stub's symbol: nvcc gives the stub internal linkage, an ``L``
    after the enclosing namespaces (``_ZN2mr5exactL14exact_sum_rows...``) that the cubin's symbol lacks."""
    if not symbol.startswith("_ZN"):
        return symbol
    at = 3
    while at < len(symbol) and symbol[at].isdigit():  # <length><name> of each enclosing namespace
        digits = re.match(r"\d+", symbol[at:]).group()
        at += len(digits) + int(digits)
    return symbol[:at] + symbol[at + 1:] if symbol[at:at + 1] == "L" else symbol


def build(name: str, expressions: list[str], nvcc: str, work: str) -> dict:
    """One fatbin: ``name`` is a built-in operator's name (the production source with its functor) or
    ``module:<entry>`` (an operator-free source, kernels.STANDALONE), ``segment:<operator>`` (the
    segment kernels of a built-in operator, backends/cupy_segment) or ``rows:<operator>`` (its
    row-segment kernels, the group-by along a leading axis)."""
    stem = (name.replace("module:", "module-").replace(".cuh", "").replace(cupy_segment.PREBUILT_PREFIX, "segment-")
            .replace(cupy_segment.ROWS_PREBUILT_PREFIX, "rows-"))
    if name.startswith("module:"):
        entry = name.split(":", 1)[1]
        source, key = kernels.kernel_source(entry), kernels.standalone_key(entry)
    elif name.startswith(cupy_segment.PREBUILT_PREFIX):
        op = get_operator(name[len(cupy_segment.PREBUILT_PREFIX):])
        source, key = cupy_segment.module_text(op), cupy_segment.prebuilt_key(op)
    elif name.startswith(cupy_segment.ROWS_PREBUILT_PREFIX):
        op = get_operator(name[len(cupy_segment.ROWS_PREBUILT_PREFIX):])
        source, key = cupy_segment.rows_module_text(op), cupy_segment.rows_prebuilt_key(op)
    else:
        op = get_operator(name)
        source, key = kernels.module_text(op), kernels.prebuilt_key(op)
    path = os.path.join(work, f"{stem}.cu")
    Path(path).write_text(translation_unit(source, expressions))
    names = mangled_names(nvcc, path, len(expressions))
    fatbin = OUT / f"{stem}.fatbin"
    # size-mode compression: the statistics module shrinks 13 -> 1 MB; the driver inflates it once at load
    subprocess.run([nvcc, "-std=c++17", "-fatbin", "--compress-mode=size", *gencode_flags(), path, "-o", str(fatbin)],
                   check=True, capture_output=True, text=True)
    return {"key": key, "file": fatbin.name, "archs": list(ARCHS), "ptx": PTX,
            "mangled": dict(zip(expressions, names))}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--nvcc", default=shutil.which("nvcc") or "nvcc")
    parser.add_argument("--no-check", action="store_true", help="skip compile_kernels.py's full check")
    parser.add_argument("--only", default="", help="rebuild only the modules whose index name contains this "
                                                   "(e.g. rows:), keeping the others' entries")
    args = parser.parse_args(argv)
    OUT.mkdir(exist_ok=True)
    groups = [(op, exprs) for op, entry, exprs in kernels.all_instantiations(policy(9), candidates=False)
              if entry == kernels.ENTRY]
    groups += [("module:" + entry, kernels.standalone_instantiations(entry)) for entry in kernels.STANDALONE]
    groups += [(cupy_segment.PREBUILT_PREFIX + op, exprs) for op, exprs in cupy_segment.all_segment_instantiations()]
    groups += [(cupy_segment.ROWS_PREBUILT_PREFIX + op, exprs) for op, exprs in cupy_segment.all_rows_instantiations()]
    if args.only:
        groups = [g for g in groups if args.only in g[0]]
    work = tempfile.mkdtemp(prefix="multireduce-prebuilt-")
    try:
        with ThreadPoolExecutor(args.jobs) as pool:
            built = dict(zip([op for op, _ in groups],
                             pool.map(lambda g: build(g[0], g[1], args.nvcc, work), groups)))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.only:  # the other modules' entries as they were
        kept = json.loads((OUT / "index.json").read_text()) if (OUT / "index.json").exists() else {}
        built = {**kept, **built}
    (OUT / "index.json").write_text(json.dumps(built, indent=1, sort_keys=True) + "\n")
    for op, entry in built.items():
        size = (OUT / entry["file"]).stat().st_size
        print(f"{op}: {len(entry['mangled'])} kernels, {size / 1e6:.2f} MB")
    if args.no_check:
        return 0
    import compile_kernels  # beside this file

    check = ["--jobs", str(args.jobs), "--nvcc", args.nvcc] + (["--nvrtc"] if compile_kernels.find_nvrtc() else [])
    return compile_kernels.main(check)


if __name__ == "__main__":
    sys.exit(main())
