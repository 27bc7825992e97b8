"""The command line: ``multireduce info`` and ``multireduce demo`` as a user runs them."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest


def run(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "multireduce.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_info_lists_versions_devices_and_cache():
    proc = run("info")
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"^multireduce \d", proc.stdout, re.M)
    assert "GPUs seen:" in proc.stdout and "kernel cache:" in proc.stdout and "decoupled_lookback" in proc.stdout


@pytest.mark.slow
def test_demo_prints_a_verified_table():
    proc = run("demo", "--size", "3000001", "--chunk", "250000", "--backend", "cpu")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    for op in ["sum", "min", "max", "mean", "cumsum"]:
        assert re.search(rf"^{op}\s+\S+\s+\S+\s+ok\s", out, re.M), out
    assert "5 of 5 results verified" in out
    assert "LocalCluster" in out


def test_demo_rejects_bad_sizes():
    proc = run("demo", "--size", "0")
    assert proc.returncode != 0 and "--size and --chunk must be positive" in proc.stderr
