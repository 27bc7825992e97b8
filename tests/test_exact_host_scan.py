"""exact.py's host cumsum: the outputs proved from a float64 running sum (``_proved_scan``; for float64
outputs with its additions' exact errors beside it) are bitwise the exact walk's (``_exact_walk``, every prefix rounded from its exact total),
on hostile data, with carries and NaN/inf flags; and plain data take the proved path."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from multireduce import exact

from .test_exact_scan_emulated import carry_state, cases, pair_traps, tile_traps, traps


def bits(a):
    return np.asarray(a).view({2: np.uint16, 4: np.uint32, 8: np.uint64}[np.asarray(a).dtype.itemsize])


def same(a, b) -> bool:
    nan = np.isnan(a)
    return np.array_equal(nan, np.isnan(b)) and np.array_equal(bits(a[~nan]), bits(b[~nan]))


CARRIES = {"none": exact.LaneState(),
           "on a float32 midpoint, 2^-60 above": carry_state(1 + Fraction(2) ** -24 + Fraction(2) ** -60),
           "past 106 bits": carry_state(Fraction(2) ** 70 + 3 * Fraction(2) ** -70),
           "+inf flag": carry_state(Fraction(-3, 4), pinf=True),
           "NaN flag": carry_state(Fraction(5, 2), nan=True)}


@pytest.mark.parametrize("dt", [np.float16, np.float32, np.float64], ids=lambda d: np.dtype(d).name)
def test_proved_outputs_are_the_exact_walks(dt):
    rng = np.random.default_rng(91)
    rows = {**cases(dt, 3000, rng), **{f"{k} (float32)": v for k, v in traps(rng, 3000).items()},
            **{f"{k} (float32)": v for k, v in tile_traps(rng, 64, 16).items()},
            **{f"{k} (float64)": v for k, v in pair_traps(rng, 64, 8).items()},
            "float64 data": rng.standard_normal(3000) * np.exp2(rng.integers(-40, 40, 3000)),
            "float64 uniform": rng.random(3000)}
    for name, x in rows.items():
        for out in (np.float16, np.float32, np.float64):
            for label, carry in CARRIES.items():
                for skipnan in (False, True):
                    with np.errstate(over="ignore", invalid="ignore"):
                        want = exact._exact_walk(x, carry, np.dtype(out), skipnan)
                        got = exact._proved_scan(x, carry, np.dtype(out), skipnan)
                    assert same(got, want), (name, np.dtype(out).name, label, skipnan,
                                             np.flatnonzero(bits(got) != bits(want))[:5])


def test_plain_data_are_proved_not_walked(monkeypatch):
    """Uniform, normal and integer float32 data (ties around 2^24 included), and uniform and normal float64
    data (whose prefixes fall exactly halfway between two doubles often), are proved block by block: no
    block falls back to the walk, and the result is the walk's."""
    rng = np.random.default_rng(92)
    ints = rng.integers(-3, 4, 1 << 16).astype(np.float32)
    ints[0] = 2.0**24
    rows = (rng.random(1 << 16).astype(np.float32), rng.standard_normal(1 << 16).astype(np.float32), ints,
            rng.random(1 << 16), rng.standard_normal(1 << 16))
    wants = [exact._exact_walk(x, exact.LaneState(), x.dtype, False) for x in rows]
    monkeypatch.setattr(exact, "_exact_walk", lambda *a: pytest.fail("the walk ran"))
    for x, want in zip(rows, wants):
        got = exact.cumsum(x)
        assert got.dtype == x.dtype and same(got, want)
