"""Shared benchmark harness: CUDA events, warm-up, median of repeats, inputs rotated among buffers
larger than L2, every timed result checked against a reference, random data (never zeros).

Bandwidth is bytes that must move / time: a reduce reads n*itemsize, a scan reads and writes, the copy
roof counts bytes read + written.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
import statistics
from dataclasses import asdict, dataclass, field

import numpy as np

L2_BYTES = 64 << 20  # more than any Hopper L2 (50-60 MB): rotate through at least this much


@dataclass
class Row:
    family: str
    impl: str
    dtype: str
    n: int
    ms: float
    gbps: float
    ratio_copy: float = float("nan")
    ok: bool = True
    note: str = ""
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        self.ok = bool(self.ok)
        self.ms, self.gbps, self.ratio_copy = float(self.ms), float(self.gbps), float(self.ratio_copy)


def setup(description: str, argv=None, only: str | None = None):
    """(cupy, torch or None, parsed args with --quick, environment) for a benchmark script; ``only`` names
    the script's first table, which ``--<only>-only`` runs alone (``args.only``)."""
    import argparse

    import cupy

    try:
        import torch
    except ImportError:
        torch = None
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true", help="two sizes only")
    if only:
        parser.add_argument(f"--{only}-only", dest="only", action="store_true", help=f"the {only} table only")
    return cupy, torch, parser.parse_args(argv), environment()


def buffers(make, nbytes_each: int, max_buffers: int = 4):
    """Enough distinct inputs that their sum exceeds L2 (at least 2)."""
    count = max(2, min(max_buffers, math.ceil(2 * L2_BYTES / max(nbytes_each, 1))))
    return [make(i) for i in range(count)]


def time_gpu(fn, inputs, repeats: int = 20, warmup: int = 3, min_sample_ms: float = 1.0) -> float:
    """Median device milliseconds per ``fn(input)``, rotating inputs, timed with CUDA events.

    Each sample times a batch of back-to-back calls (enough to last ``min_sample_ms``) and divides, so
    that short operations are timed as a pipeline of launches, as they run in a program, rather than by
    one launch's host overhead. Every implementation is timed the same way. ``time_host`` measures the
    latency of a single call."""
    import cupy

    for i in range(warmup):
        fn(inputs[i % len(inputs)])
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    start.record()
    fn(inputs[0])
    stop.record()
    stop.synchronize()
    once = max(cupy.cuda.get_elapsed_time(start, stop), 1e-3)
    batch = max(1, min(200, int(min_sample_ms / once)))
    times = []
    for i in range(repeats):
        start.record()
        for b in range(batch):
            fn(inputs[(i * batch + b) % len(inputs)])
        stop.record()
        stop.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, stop) / batch)
    return statistics.median(times)


def time_host(fn, inputs, repeats: int = 20, warmup: int = 3) -> float:
    """Median milliseconds from the Python call to the result on the device (small-input latency)."""
    import time

    import cupy

    for i in range(warmup):
        fn(inputs[i % len(inputs)])
    cupy.cuda.Device().synchronize()
    times = []
    for i in range(repeats):
        x = inputs[i % len(inputs)]
        t0 = time.perf_counter()
        fn(x)
        cupy.cuda.get_current_stream().synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def copy_roof(nbytes: int) -> float:
    """Device-to-device copy bandwidth in GB/s (read + written) for ``nbytes``."""
    import cupy

    n = nbytes // 4
    src = buffers(lambda i: cupy.random.random(n, dtype=cupy.float32), nbytes)
    dst = cupy.empty(n, cupy.float32)

    def run(s):
        dst[...] = s

    ms = time_gpu(run, src)
    return 2 * nbytes / ms / 1e6


def environment() -> dict:
    info = {"date": datetime.date.today().isoformat(), "python": platform.python_version()}
    try:
        import cupy

        props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.runtime.getDevice())
        info["device"] = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
        info["sms"] = props["multiProcessorCount"]
        info["cupy"] = cupy.__version__
        info["cuda_runtime"] = cupy.cuda.runtime.runtimeGetVersion()
    except Exception as exc:  # pragma: no cover - reported, not fatal
        info["device"] = f"unavailable ({exc})"
    try:
        import torch

        info["torch"] = torch.__version__
    except ImportError:
        pass
    import multireduce

    info["multireduce"] = multireduce.__version__
    return info


def markdown(rows: list[Row], columns=("family", "impl", "dtype", "n", "ms", "gbps", "ratio_copy", "ok")) -> str:
    head = "| " + " | ".join(columns) + " |\n|" + "---|" * len(columns) + "\n"
    lines = []
    for r in rows:
        d = asdict(r)
        cells = []
        for c in columns:
            v = d[c]
            if c == "n":
                cells.append(f"2^{math.log2(v):.2f}" if v and (v & (v - 1)) else (f"2^{int(math.log2(v))}" if v else "0"))
            elif isinstance(v, float):
                cells.append(f"{v:.4g}")
            else:
                cells.append(str(v))
        lines.append("| " + " | ".join(cells) + " |")
    return head + "\n".join(lines) + "\n"


def save(rows: list[Row], name: str, env: dict) -> None:
    out = os.environ.get("OUT") or os.environ.get("MULTIREDUCE_BENCH_OUT") or "."
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"{name}.json"), "w") as f:
        json.dump({"environment": env, "rows": [asdict(r) for r in rows]}, f, indent=1)
    with open(os.path.join(out, f"{name}.md"), "w") as f:
        f.write(f"Device: {env.get('device')}, CuPy {env.get('cupy')}, torch {env.get('torch', '-')}, "
                f"multireduce {env.get('multireduce')}, {env.get('date')}\n\n")
        f.write(markdown(rows))


def plot(rows: list[Row], name: str, roof: dict[int, float], title: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    out = os.environ.get("OUT") or "."
    groups: dict = {}
    for r in rows:
        groups.setdefault((r.impl, r.dtype), []).append(r)
    fig, ax = plt.subplots(figsize=(10, 6))
    for (impl, dtype), rs in sorted(groups.items()):
        rs = sorted(rs, key=lambda r: r.n)
        ax.plot([r.n for r in rs], [r.gbps for r in rs], marker="o", ms=3, label=f"{impl} {dtype}")
    if roof:
        xs = sorted(roof)
        ax.plot(xs, [roof[x] for x in xs], "k--", lw=2, label="copy roof")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("elements")
    ax.set_ylabel("GB/s")
    ax.set_title(title)
    ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(os.path.join(out, f"{name}.png"), dpi=110)


def check_close(got: float, ref: float, mass: float, eps: float, n: int) -> bool:
    return abs(got - ref) <= eps * (n / 1024 + 64) * mass + 1e-30


def to_float(x) -> float:
    return float(np.asarray(x.get() if hasattr(x, "get") else x))
