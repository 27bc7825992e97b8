"""Shared benchmark harness.

One GPU: CUDA events, warm-up, median of repeats, inputs rotated among buffers larger than L2, every timed
result checked against a reference, random data (never zeros). Bandwidth is bytes that must move / time:
a reduce reads n*itemsize, a scan reads and writes, the copy roof counts bytes read + written.

Several GPUs (or CPU workers): the cluster a suite runs on, random chunks made where they stay, a row's
repetitions (each after the scheduler released the previous result's keys), its task stream, and the
workers' memory sampled while it runs.

Also the suites' command line (``parser``: ``python -m benchmarks <suite>``), Markdown tables whose rows
all have the header's cells, and host-time profiles (cProfile, microseconds per call).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import statistics
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

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


def parser(suite: str, doc: str, quick: str | None = None, only: str | None = None,
           profiles: dict[str, str] | None = None) -> argparse.ArgumentParser:
    """The command line of ``python -m benchmarks <suite>``, its help from the suite's docstring.

    ``quick`` is the help of ``--quick``; ``only`` names the suite's first table, which ``--<only>-only``
    runs alone (``args.only``); ``profiles`` ({name: what it measures}, the first the default) adds
    ``--profile [NAME]``, which runs that profile instead of the suite (``args.profile``, None without)."""
    p = argparse.ArgumentParser(prog=f"python -m benchmarks {suite}", description=doc,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    if quick:
        p.add_argument("--quick", action="store_true", help=quick)
    if only:
        p.add_argument(f"--{only}-only", dest="only", action="store_true", help=f"the {only} table only")
    if profiles:
        names = list(profiles)
        p.add_argument("--profile", nargs="?", const=names[0], choices=names, metavar="NAME",
                       help="instead of the suite, a profile (default " + names[0] + "): "
                       + "; ".join(f"{k}: {v}" for k, v in profiles.items()))
    return p


def run_suite(suite: str, doc: str, argv, body, quick: str | None = None, only: str | None = None,
              profiles: dict | None = None):
    """A one-GPU suite's ``main``: its command line read (``parser``); the profile asked for run
    (``profiles``: {name: (what it measures, function of no argument)}), else ``body(args, cupy, torch,
    environment)``. Returns what ran returned."""
    profiles = profiles or {}
    args = parser(suite, doc, quick, only, {k: what for k, (what, _) in profiles.items()}).parse_args(argv)
    if getattr(args, "profile", None):
        return profiles[args.profile][1]()
    cupy, torch = gpu_modules()
    return body(args, cupy, torch, environment())


def gpu_modules():
    """(cupy, torch or None), imported once the arguments are read (``--help`` needs no GPU)."""
    import cupy

    try:
        import torch
    except ImportError:
        torch = None
    return cupy, torch


def buffers(make, nbytes_each: int, max_buffers: int = 4):
    """Enough distinct inputs that their sum exceeds L2 (at least 2)."""
    count = max(2, min(max_buffers, math.ceil(2 * L2_BYTES / max(nbytes_each, 1))))
    return [make(i) for i in range(count)]


_HOLD_SOURCE = r"""
extern "C" __global__ void hold_gpu(unsigned long long ns) {
  unsigned long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
}
"""
_hold_kernels: dict = {}


def hold_gpu(seconds: float) -> None:
    """Queue a one-thread kernel that keeps the current GPU busy for ``seconds`` (work queued behind it
    waits), so that host work done meanwhile is not counted by events recorded after it."""
    import cupy

    device = cupy.cuda.runtime.getDevice()
    if device not in _hold_kernels:
        _hold_kernels[device] = cupy.RawKernel(_HOLD_SOURCE, "hold_gpu")
    _hold_kernels[device]((1,), (1,), (np.uint64(max(0, int(seconds * 1e9))),))


def time_gpu(fn, inputs, repeats: int = 20, warmup: int = 3, min_sample_ms: float = 1.0) -> float:
    """Median device milliseconds per ``fn(input)``, rotating inputs, timed with CUDA events.

    Each sample times a batch of back-to-back calls (enough to last ``min_sample_ms``) and divides, so
    that short operations are timed as a pipeline of launches, as they run in a program, rather than by
    one launch's host overhead. A sample starts behind ``hold_gpu`` for one call's host time, during
    which the host queues the first call: otherwise the GPU would sit idle, inside the sample, while the
    host prepares that call, a share of one call's host time that a batch of two or three large calls
    does not amortize (the steady state of a program's loop does). Every implementation is timed the
    same way. ``time_host`` measures the latency of a single call."""
    import cupy

    for i in range(warmup):
        fn(inputs[i % len(inputs)])
    cupy.cuda.Device().synchronize()
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    t0 = time.perf_counter()
    start.record()
    fn(inputs[0])
    stop.record()
    host = time.perf_counter() - t0  # until the call returned: its host time (and more if it waits)
    stop.synchronize()
    once = max(cupy.cuda.get_elapsed_time(start, stop), 1e-3)
    batch = max(1, min(200, int(min_sample_ms / once)))
    lead = min(host, 2e-3)
    times = []
    for i in range(repeats):
        hold_gpu(lead)
        start.record()
        for b in range(batch):
            fn(inputs[(i * batch + b) % len(inputs)])
        stop.record()
        stop.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, stop) / batch)
    return statistics.median(times)


def time_host(fn, inputs, repeats: int = 20, warmup: int = 3) -> float:
    """Median milliseconds from the Python call to the result on the device (small-input latency)."""
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


def md_table(header, rows) -> str:
    """A Markdown table: ``header`` (cell texts) and ``rows`` (sequences of cells, each written with str).
    A row with another number of cells than the header is refused (ValueError), never printed askew; a
    pipe inside a cell is escaped."""
    header = [str(c).replace("|", "\\|") for c in header]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        cells = [str(c).replace("|", "\\|") for c in row]
        if len(cells) != len(header):
            raise ValueError(f"a table row has {len(cells)} cells, its header {len(header)}: {cells}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def log2_text(n: int) -> str:
    """2^k for a power of two, 2^k.kk otherwise, 0 for 0."""
    if not n:
        return "0"
    return f"2^{int(math.log2(n))}" if not n & (n - 1) else f"2^{math.log2(n):.2f}"


def markdown(rows: list[Row], columns=("family", "impl", "dtype", "n", "ms", "gbps", "ratio_copy", "ok")) -> str:
    def cell(c, v):
        if c == "n":
            return log2_text(v)
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    return md_table(columns, ([cell(c, asdict(r)[c]) for c in columns] for r in rows))


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


def host(value) -> np.ndarray:
    """A result on the host as a NumPy array (CuPy's through ``.get()``; a persisted Dask array computed
    first)."""
    if hasattr(value, "__dask_graph__"):
        value = value.compute()
    return np.asarray(value.get() if hasattr(value, "get") else value)


# ------------------------------------------------------------------------------------------------
# Host time: microseconds per call, cProfile
# ------------------------------------------------------------------------------------------------
def per_call_us(fn, calls: int = 2000) -> tuple[float, float]:
    """(pipelined host us per call: ``calls`` back-to-back calls, latency us: the median of single calls
    each followed by a stream synchronize)."""
    import cupy

    for _ in range(50):
        fn()
    stream = cupy.cuda.get_current_stream()
    stream.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    pipelined = (time.perf_counter() - t0) / calls * 1e6
    stream.synchronize()
    samples = []
    for _ in range(300):
        t0 = time.perf_counter()
        fn()
        stream.synchronize()
        samples.append((time.perf_counter() - t0) * 1e6)
    return pipelined, statistics.median(samples)


def host_table(names: tuple, rows: list) -> str:
    """Rows of (names..., pipelined us, latency us) as a Markdown table."""
    return md_table([*names, "pipelined host us/call", "latency us (call + sync)"],
                    ([*r[:len(names)], f"{r[-2]:.2f}", f"{r[-1]:.2f}"] for r in rows))


def cprofiled(fn, calls: int, sort: str = "tottime", lines: int = 18) -> str:
    """``fn()`` called ``calls`` times under cProfile: the report's ``lines`` heaviest functions by ``sort``."""
    import cProfile
    import io
    import pstats

    profile = cProfile.Profile()
    profile.enable()
    for _ in range(calls):
        fn()
    profile.disable()
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats(sort).print_stats(lines)
    return text.getvalue()


# ------------------------------------------------------------------------------------------------
# Several GPUs (or CPU workers): the cluster, chunks made where they stay, a row's repetitions
# ------------------------------------------------------------------------------------------------
def random_chunk(seed: int, shape, host: bool = False):
    """float32 uniform in [-0.5, 0.5) (never all zeros), made on the GPU where CuPy is importable and
    ``host`` is false: the same seed gives the same chunk in a graph, a persisted array and a loop."""
    if not host:
        try:
            import cupy

            return cupy.random.default_rng(seed).random(shape, dtype=cupy.float32) - 0.5
        except ImportError:
            pass
    return np.random.default_rng(seed).random(shape, dtype=np.float32) - 0.5


def make_block(seed, block_info=None):
    """``map_blocks`` maker of device chunks (arrays chunked along their first axis only)."""
    return random_chunk(seed + block_info[None]["chunk-location"][0], block_info[None]["chunk-shape"])


def make_host_block(seed, block_info=None):
    """``map_blocks`` maker of NumPy chunks, for CPU workers."""
    return random_chunk(seed + block_info[None]["chunk-location"][0], block_info[None]["chunk-shape"], host=True)


#: The workers' device allocator, by name, as local_cluster's RMM options ("cupy": CuPy's own pool, said
#: explicitly, since local_cluster's default is RMM's asynchronous allocator where rmm is installed).
ALLOCATOR_POOL_FRACTION = 0.85
#: Dask's transports between workers, by the name local_cluster's ``protocol`` takes
PROTOCOLS = ("tcp", "ucx")
ALLOCATORS = {"cupy": {"rmm_async": False}, "pool": {"rmm_pool_size": ALLOCATOR_POOL_FRACTION},
              "async": {"rmm_async": True}}


def default_allocator(cpu: bool) -> str:
    """The allocator local_cluster gives workers that name none: RMM's asynchronous one on GPU workers
    where rmm is installed, else CuPy's pool (CPU workers allocate no device memory: "cupy")."""
    import importlib.util

    from multireduce import cluster

    return "async" if not cpu and cluster.DEFAULT_RMM and importlib.util.find_spec("rmm") else "cupy"


@dataclass
class Setting:
    """What a multi-worker suite runs on: one worker per GPU with CuPy chunks or, with ``cpu``, CPU workers
    with NumPy chunks (tiny sizes: the suite's smoke run)."""

    cpu: bool
    available: int  # workers it can start
    device: str

    @property
    def make(self):
        return make_host_block if self.cpu else make_block

    def meta(self, ndim: int = 1):
        xp = np if self.cpu else __import__("cupy")
        return xp.empty((0,) * ndim, dtype=np.float32)

    def cluster(self, n_workers: int, allocator: str = "cupy", protocol: str = "tcp"):
        """A local cluster of ``n_workers``; ``allocator`` (GPU workers): "cupy" (CuPy's own pool), "pool"
        (an RMM pool of ALLOCATOR_POOL_FRACTION of each GPU, CuPy allocating through it) or "async"
        (RMM's cudaMallocAsync allocator, CuPy allocating through it); ``protocol``: Dask's transport,
        "tcp" (dask-cuda stages each CuPy array through host memory) or "ucx" (GPU to GPU over NVLink or
        PCIe where UCX finds them; needs distributed-ucxx)."""
        from multireduce.cluster import local_cluster

        return local_cluster(n_workers=n_workers, gpu=not self.cpu,
                             **(ALLOCATORS[allocator] if not self.cpu else {}),
                             **({} if protocol == "tcp" else {"protocol": protocol, "ucx_on_all_interfaces": True}))

    def free(self, client) -> None:
        """The workers' pooled device memory back to the driver between configurations."""
        if not self.cpu:
            client.run(lambda: __import__("cupy").get_default_memory_pool().free_all_blocks())


def setting(cpu: bool, cpu_workers: int = 2) -> Setting:
    if cpu:
        return Setting(True, cpu_workers, "CPU (NumPy chunks)")
    import cupy

    from multireduce.cluster import gpu_count

    name = cupy.cuda.runtime.getDeviceProperties(0)["name"]
    return Setting(False, gpu_count(), name.decode() if isinstance(name, bytes) else str(name))


def wait_released(client, names, timeout=30.0):
    """Until neither the scheduler nor any worker holds a key of ``names`` (so a repetition is not served
    from memory): a worker frees a released key when the scheduler's message reaches it, and one that
    still holds the data when the same key is submitted again reports it done without running it."""
    names = [str(n) for n in names]
    if not names:
        return
    deadline = time.time() + timeout
    while time.time() < deadline:
        held = client.run_on_scheduler(
            lambda dask_scheduler, names=names: any(any(n in str(k) for n in names) for k in dask_scheduler.tasks))
        if not held:
            held = any(client.run(
                lambda dask_worker, names=names: any(any(n in str(k) for n in names) for k in list(dask_worker.data))
            ).values())
        if not held:
            return
        time.sleep(0.01)


def wait_idle(client, futures, timeout: float) -> bool:
    """Cancel ``futures`` (a timed-out row's) and wait until the scheduler has no task left to run
    (queued tasks count: ``client.processing()`` shows only those already sent to a worker); False past
    ``timeout``."""
    if futures:
        client.cancel(list(futures), force=True)
    deadline = time.time() + timeout
    while time.time() < deadline:
        pending = client.run_on_scheduler(lambda dask_scheduler: sum(
            ts.state in ("processing", "queued", "waiting", "no-worker") for ts in dask_scheduler.tasks.values()))
        if not pending:
            return True
        time.sleep(0.05)
    return False


def bounded(fn, timeout_s):
    """``fn()`` in a thread; TimeoutError after ``timeout_s`` (the thread is left to finish)."""
    box = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            box["error"] = exc

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(timeout_s)
    if t.is_alive():
        raise TimeoutError
    if "error" in box:
        raise box["error"]
    return box.get("value")


def last_element(y) -> float:
    """The last element of a persisted 1-d result, on the client as a float."""
    return float(host(y[-1].compute()))


def _clear_transfer_log(dask_worker):
    dask_worker.transfer_incoming_log.clear()


def _transferred(dask_worker):
    return [(str(k), n) for entry in dask_worker.transfer_incoming_log for k, n in entry["keys"].items()]


def breakdown(stream, wall: float, moved) -> dict:
    """Tasks, transfers (count and bytes, from the workers' incoming-transfer logs; the largest key
    moved) and the time outside any task, from a task stream."""
    computes = []
    for t in stream:
        for ss in t.get("startstops", ()):
            if ss["action"] == "compute":
                computes.append((ss["start"], ss["stop"]))
    covered, end = 0.0, None
    for start, stop in sorted(computes):
        if end is None or start > end:
            covered += stop - start
            end = stop
        elif stop > end:
            covered += stop - end
            end = stop
    largest = max(moved, key=lambda kn: kn[1], default=("", 0))
    return dict(tasks=len(stream), transfers=len(moved), transfer_bytes=int(sum(n for _, n in moved)),
                largest_transfer=f"{largest[0][:40]} ({largest[1]} B)" if moved else "",
                outside_tasks_ms=max(wall - covered, 0.0) * 1e3)


class Step:
    """One repetition of a row, written as a user writes it. ``how``: "compute" (the result's own
    ``.compute()``), "client.compute" (``client.compute(result).result()``), "persist" (the result's own
    ``.persist()``, waited on), "client.persist", "dask.compute" (``make()`` gives several results), "now"
    (``make()`` is the whole computation). After a call, ``names`` are the names whose keys the scheduler
    must release before the next repetition; while it runs, ``futures`` are what a timed-out call leaves
    to cancel. A persisted result is returned as the collection (its keys held until it is dropped)."""

    HOW = ("compute", "client.compute", "persist", "client.persist", "dask.compute", "now")

    def __init__(self, client, how: str, make: Callable[[], Any]):
        if how not in self.HOW:
            raise ValueError(f"Step how={how!r}: expected one of {self.HOW}")
        self.client, self.how, self.make = client, how, make
        self.names: list = []
        self.futures: list = []

    def __call__(self):
        import dask
        import distributed

        self.names, self.futures = [], []
        made = self.make()
        if self.how == "now":
            return made
        self.names = [r.name for r in (made if self.how == "dask.compute" else (made,))]
        if self.how == "compute":
            return made.compute()
        if self.how == "dask.compute":
            return dask.compute(*made)
        if self.how == "client.compute":
            future = self.client.compute(made)
            self.futures = [future]
            # a future kept past its run holds the result's key: the next repetition of the same graph
            # would be served from memory (no task ran) and the key never released
            value = future.result()
            self.futures = []
            return value
        y = made.persist() if self.how == "persist" else self.client.persist(made)
        self.names.append(y.name)  # a held scan persists under a fresh name of its own
        self.futures = distributed.futures_of(y)
        distributed.wait(y)
        self.futures = []
        return y


@dataclass
class Case:
    """A row: ``step`` timed, ``check(result)`` of the last timed repetition (against a float64 reference),
    ``moved`` bytes for GB/s, ``peer`` the dask.array row of the same computation (its time over ours:
    "x dask")."""

    path: str
    impl: str
    op: str
    step: Any  # Step, or any callable with ``names`` and ``futures``
    moved: int
    check: Callable[[Any], bool]
    peer: str | None = None


def time_case(client, case: Case, repeats: int, timeout_s: float, stream: bool = True) -> dict:
    """Median wall ms of ``repeats`` repetitions after a warm-up, each started once the scheduler released
    the previous one's keys; ``ok`` from ``case.check`` of the last one's result; with ``stream``, one more
    repetition's task stream (``breakdown``). A timeout or an error is a row with its note; a timed-out
    row's tasks are cancelled and the next row starts once the scheduler has none left."""
    import distributed

    row = dict(path=case.path, impl=case.impl, op=case.op, peer=case.peer)
    step = case.step
    try:
        times, ok, first = [], False, float("nan")
        for i in range(repeats + 1):
            t0 = time.perf_counter()
            result = bounded(step, timeout_s)
            if i:
                times.append(time.perf_counter() - t0)
            else:
                first = time.perf_counter() - t0
            if i == repeats:
                ok = bool(case.check(result))
            del result
            wait_released(client, step.names)
        found = {}
        if stream:
            client.run(_clear_transfer_log)
            with distributed.get_task_stream(client) as ts:
                t0 = time.perf_counter()
                bounded(step, timeout_s)
                wall = time.perf_counter() - t0
            moved = [kn for per_worker in client.run(_transferred).values() for kn in per_worker]
            wait_released(client, step.names)
            found = breakdown(ts.data, wall, moved)
        seconds = statistics.median(times)
        row.update(ms=seconds * 1e3, first_ms=first * 1e3, gbps=case.moved / seconds / 1e9, ok=ok, note="", **found)
    except TimeoutError:
        row.update(ms=float("nan"), gbps=float("nan"), ok=False, note=f"timed out after {timeout_s:g} s")
        if not wait_idle(client, getattr(step, "futures", []), timeout=max(120.0, 10 * timeout_s)):
            row["note"] += "; the workers stayed busy"
    except Exception as exc:  # noqa: BLE001 - out of memory etc.: reported, not fatal
        row.update(ms=float("nan"), gbps=float("nan"), ok=False, note=repr(exc)[:200])
    return row


# ------------------------------------------------------------------------------------------------
# Memory: driver-level bytes of a GPU process, and a worker's memory sampled while a row runs
# ------------------------------------------------------------------------------------------------
def device_memory_reader(cupy):
    """A function giving (driver-level bytes of this process on its GPU, "process") from NVML where it
    lists this pid, else (the whole GPU's used bytes, "device"). The NVML device is found once, by PCI
    bus (a dask-cuda worker's device 0 is not NVML's 0)."""
    handle = None
    try:
        import pynvml

        pynvml.nvmlInit()
        bus = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["pciBusID"]
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            if pynvml.nvmlDeviceGetPciInfo(h).bus == bus:
                handle = h
    except Exception:  # noqa: BLE001 - no NVML: the device total below
        pass

    def read() -> tuple[int, str]:
        if handle is not None:
            try:
                for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                    if proc.pid == os.getpid() and proc.usedGpuMemory is not None:
                        return int(proc.usedGpuMemory), "process"
            except Exception:  # noqa: BLE001 - a container whose pids NVML does not show
                pass
        free, total = cupy.cuda.runtime.memGetInfo()
        return total - free, "device"

    return read


_SAMPLING: dict = {}


def _memory_now():
    """A function reading this worker's memory: CuPy's pool (used, total) and the driver's bytes on a GPU
    worker, RSS on a CPU one."""
    import sys

    cupy = sys.modules.get("cupy")
    if cupy is not None and cupy.cuda.runtime.getDeviceCount() > 0:
        pool, device = cupy.get_default_memory_pool(), device_memory_reader(cupy)
        if _rmm_allocates(cupy):
            # CuPy's pool holds nothing and the driver sees RMM's reservation, not its use: RMM's counters
            # (``start_sampling`` pushes fresh ones) give the bytes allocated at the peak
            import rmm.statistics

            return lambda: {"rmm_peak": getattr(rmm.statistics.get_statistics(), "peak_bytes", 0),
                            "device_used": device()[0]}
        return lambda: {"pool_used": pool.used_bytes(), "pool_total": pool.total_bytes(), "device_used": device()[0]}
    import psutil

    proc = psutil.Process()
    return lambda: {"rss": proc.memory_info().rss}


def _rmm_allocates(cupy) -> bool:
    """Whether CuPy allocates through RMM in this process (dask-cuda's ``rmm_allocator_external_lib_list``)."""
    allocator = cupy.cuda.get_allocator()
    return (getattr(allocator, "__module__", None) or "").startswith("rmm") or \
        getattr(allocator, "__name__", None) == "rmm_cupy_allocator"


def start_sampling(interval_s: float = 0.005, dask_worker=None) -> dict:
    """On a worker: its memory read now (the baseline) and every ``interval_s`` until ``stop_sampling``;
    returns the baseline. CuPy's pool is emptied first, so its total afterwards is the run's high-water
    mark, which a sample can miss."""
    cupy = __import__("sys").modules.get("cupy")
    if cupy is not None and cupy.cuda.runtime.getDeviceCount() > 0:
        cupy.cuda.Device().synchronize()
        cupy.get_default_memory_pool().free_all_blocks()
        if _rmm_allocates(cupy):
            import rmm.statistics

            rmm.statistics.enable_statistics()  # once per worker: an adaptor over its resource
            rmm.statistics.push_statistics()  # counters from zero for this run
    read = _memory_now()
    base = read()
    peak = dict(base)
    stop = threading.Event()

    def loop():
        while not stop.wait(interval_s):
            for k, v in read().items():
                peak[k] = max(peak[k], v)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    _SAMPLING["run"] = (read, base, peak, stop, thread)
    return base


def stop_sampling(dask_worker=None) -> dict:
    """On a worker: {"baseline": ..., "peak": ...} (bytes) since ``start_sampling``, a last reading included."""
    read, base, peak, stop, thread = _SAMPLING.pop("run")
    stop.set()
    thread.join()
    for k, v in read().items():
        peak[k] = max(peak[k], v)
    if "rmm_peak" in base:
        import rmm.statistics

        rmm.statistics.pop_statistics()
    return {"baseline": base, "peak": peak}
