"""Partials brought to the host later, together (multireduce.backends.partials_later / finish_later): the
order and values of what comes back, on the CPU. The GPU backend's use of it (States kept on the GPU,
one copy per device) is tested in tests/gpu/test_gpu_partials_later.py."""

from __future__ import annotations

import threading

import numpy as np

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
