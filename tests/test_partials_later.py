"""Partials brought to the host later, together (multireduce.backends.partials_later / finish_later): the
order and values of what comes back, on the CPU. The GPU backend's use of it (States kept on the GPU,
one copy per device) is tested in tests/gpu/test_gpu_partials_later.py."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from multireduce.backends import Later, finish_later, later_wanted, partials_later


def test_only_the_thread_that_asked_gets_partials_later():
    seen = []
    assert not later_wanted()
    with partials_later():
        assert later_wanted()
        with partials_later():
            assert later_wanted()
        assert later_wanted()  # the inner one gives back what was there
        other = threading.Thread(target=lambda: seen.append(later_wanted()))
        other.start()
        other.join()
    assert not later_wanted() and seen == [False]


def test_later_values_are_made_in_place_and_everything_else_is_kept():
    rng = np.random.default_rng(3)
    raws = [rng.integers(0, 255, size=n, dtype=np.uint8) for n in (16, 0, 40, 8)]
    values = [None, Later(raws[0], lambda r: ("a", r.sum())), (1, 2), Later(raws[1], lambda r: ("b", r.size)),
              Later(raws[2], lambda r: ("c", r.tobytes())), "x", Later(raws[3], lambda r: ("d", r[::-1].tobytes()))]
    got = finish_later(values)
    assert got == [None, ("a", raws[0].sum()), (1, 2), ("b", 0), ("c", raws[2].tobytes()), "x",
                   ("d", raws[3][::-1].tobytes())]
    assert type(values[1]) is Later  # the list given is not changed
    plain = [1, None, (3,)]
    assert finish_later(plain) is plain


def _emulating_the_gpu(monkeypatch, seen: list):
    """numpy_stats' moments and extremes returning a ``Later`` where one is asked for, as the GPU backend's
    do (its ``raw`` a byte buffer of the partial's size, ``then`` giving the partial)."""
    import numpy as np

    from multireduce.backends import numpy_stats

    for name in ("moments_chunk", "extreme_chunk", "arg_chunk"):
        real = getattr(numpy_stats, name)

        def emulated(*args, _real=real, **kwargs):
            partial = _real(*args, **kwargs)
            seen.append(later_wanted())
            if not later_wanted():
                return partial
            return Later(np.zeros(sum(np.asarray(m).nbytes for m in partial), np.uint8), lambda raw, p=partial: p)

        monkeypatch.setattr(numpy_stats, name, emulated)


def test_plans_finish_partials_left_for_later_before_they_merge_them(monkeypatch):
    import numpy as np

    from multireduce.statistics import StatPlan

    seen: list = []
    _emulating_the_gpu(monkeypatch, seen)
    x = np.random.default_rng(5).standard_normal((40, 3))
    plan = StatPlan("var", (0,), False, np.dtype(np.float64))
    want = plan.finalize(plan.partial(x[:10], x[10:25], x[25:]))
    with partials_later():
        one = plan.partial(x[:10])
        several = plan.partial(x[:10], x[10:25], x[25:])
    assert type(one) is Later and type(several) is not Later and any(seen)
    assert np.array_equal(plan.finalize(several), want)
    with partials_later():
        parts = [plan.partial(b) for b in (x[:10], x[10:25], x[25:])]
    assert np.array_equal(plan.finalize(plan.combine(*parts)), want)
    assert np.array_equal(plan.finalize(finish_later(parts)[0]), plan.finalize(plan.partial(x[:10])))


@pytest.mark.parametrize("later_bytes", [None, 1])
def test_a_statistic_inside_an_expression_over_held_chunks_is_not_left_for_later(monkeypatch, later_bytes):
    """``x / mr.std(x, axis=1, keepdims=True)`` over held chunks: the inner statistic runs while the held
    call makes each chunk, outside the one chunk's own partial that may be left for later; the outer
    statistic's partials, left for later, come back right (also when LATER_BYTES makes the worker bring
    them to the host every chunk)."""
    import dask
    import dask.array as da
    import distributed
    import numpy as np

    import multireduce as mr
    from multireduce import direct
    from multireduce.cluster import local_cluster

    seen: list = []
    _emulating_the_gpu(monkeypatch, seen)
    if later_bytes is not None:
        monkeypatch.setattr(direct, "LATER_BYTES", later_bytes)
    with local_cluster(n_workers=2, gpu=False, processes=False) as cluster, distributed.Client(cluster) as client:
        x = da.from_array(np.random.default_rng(0).random((64, 8)), chunks=(8, 8)).persist()
        distributed.wait(x)
        z = x / mr.std(x, axis=1, keepdims=True)
        for fn, outer in ((lambda: mr.sum(z), False), (lambda: mr.argmax(z), True), (lambda: mr.nanmax(z), True),
                          (lambda: mr.var(z), True)):
            seen.clear()
            got = fn().compute()
            assert any(seen) == outer and not all(seen)  # an outer statistic's partials later, the inner std's not
            with dask.config.set({"multireduce.placement": False}):
                assert np.asarray(got).tobytes() == np.asarray(fn().compute()).tobytes()
        assert client.run(lambda: None) is not None
