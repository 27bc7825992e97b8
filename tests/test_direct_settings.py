"""The ``multireduce.*`` dask.config settings read as dask reads its own, from every place a setting can
come from: ``dask.config.set`` (Python values, and the strings a quoted YAML value gives), YAML files (real
booleans and numbers) and ``DASK_MULTIREDUCE__...`` environment variables. Anything else is refused
with an error naming the setting, what it expects and what it was given, before any work starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import dask
import numpy as np
import pytest

import multireduce as mr
from multireduce import direct, placement

FLAGS = ["multireduce.placement", "multireduce.direct-to-workers"]
DURATIONS = ["multireduce.direct-connect-timeout", "multireduce.direct-check-interval", "multireduce.placement-reuse"]
TRUE = [True, 1, "true", "True", "TRUE", " true ", "1", "yes", "Yes", "on"]
FALSE = [False, 0, "false", "False", "FALSE", " false", "0", "no", "NO", "off"]


@pytest.mark.parametrize("name", FLAGS)
@pytest.mark.parametrize("given, want", [(v, True) for v in TRUE] + [(v, False) for v in FALSE])
def test_flags_read_as_dask_and_yaml_read_booleans(name, given, want):
    with dask.config.set({name: given}):
        assert placement.setting(name) is want


@pytest.mark.parametrize("given", [None, "none", "None", "null", " NULL "])
def test_direct_to_workers_may_be_left_to_decide(given):
    with dask.config.set({"multireduce.direct-to-workers": given}):
        assert placement.setting("multireduce.direct-to-workers") is None


@pytest.mark.parametrize("name", FLAGS)
@pytest.mark.parametrize("given", ["", "  ", "maybe", "flase", "2", 2, -1, 0.0, 1.5, [True], {"a": 1}])
def test_a_flag_that_is_no_boolean_is_refused(name, given):
    with dask.config.set({name: given}), pytest.raises(ValueError) as err:
        placement.setting(name)
    message = str(err.value)
    assert f"dask.config {name!r}: expected True or False" in message and message.endswith(f"got {given!r}")


def test_placement_cannot_be_left_to_decide():
    with dask.config.set({"multireduce.placement": None}), pytest.raises(ValueError, match="got None"):
        placement.setting("multireduce.placement")


def test_flag_defaults():
    assert placement.setting("multireduce.placement") is True
    assert placement.setting("multireduce.direct-to-workers") is None


@pytest.mark.parametrize("name", DURATIONS)
@pytest.mark.parametrize("given, want", [("1s", 1.0), ("250ms", 0.25), (" 1.5 s ", 1.5), ("2", 2.0), (3, 3.0),
                                         (0.125, 0.125), ("1m", 60.0), ("500us", 0.0005)])
def test_durations_read_as_parse_timedelta_reads_them(name, given, want):
    with dask.config.set({name: given}):
        got = placement.setting(name)
    assert type(got) is float and got == want


@pytest.mark.parametrize("name", DURATIONS)
@pytest.mark.parametrize("given", ["", "   ", "abc", "1 parsec", "s1", "-1s", -1, float("inf"), float("nan"), "inf",
                                   True, False, None, [1], {"s": 1}])
def test_a_duration_that_is_no_duration_is_refused(name, given):
    with dask.config.set({name: given}), pytest.raises(ValueError) as err:
        placement.setting(name)
    message = str(err.value)
    assert f"dask.config {name!r}: expected a duration" in message and message.endswith(f"got {given!r}")


@pytest.mark.parametrize("given", [0, "0s", "0ms"])
def test_zero_turns_placement_reuse_off_but_is_no_timeout(given):
    with dask.config.set({"multireduce.placement-reuse": given}):
        assert placement.setting("multireduce.placement-reuse") == 0
    for name in ("multireduce.direct-connect-timeout", "multireduce.direct-check-interval"):
        with dask.config.set({name: given}), pytest.raises(ValueError, match="expected a duration above 0"):
            placement.setting(name)


def test_duration_defaults():
    assert placement.setting("multireduce.direct-connect-timeout") == 2.0
    assert placement.setting("multireduce.direct-check-interval") == 0.25
    assert placement.setting("multireduce.placement-reuse") == 10.0


def test_every_setting_the_package_reads_goes_through_the_one_reader():
    """No ``dask.config.get("multireduce...")`` outside ``placement.setting`` (a bare ``get`` reads the
    string "false" as true), and every setting it reads has its kind declared."""
    from pathlib import Path

    import multireduce

    root = Path(multireduce.__file__).parent
    for path in root.rglob("*.py"):
        text = path.read_text()
        for quote in ('"', "'"):
            assert f"config.get({quote}multireduce." not in text, path
    names = set()
    for path in root.rglob("*.py"):
        text = path.read_text()
        at = 0
        while (at := text.find('setting("multireduce.', at)) != -1:
            names.add(text[at + len('setting("'):text.index('"', at + len('setting("'))])
            at += 1
    assert names == set(placement._SETTINGS), names


def _settings_in_a_fresh_process(env: dict) -> dict:
    """Every multireduce setting as a new Python process reads it with ``env`` added to the environment
    (dask reads YAML files and environment variables when it is imported)."""
    code = textwrap.dedent("""
        import json
        from multireduce import placement
        out = {}
        for name in placement._SETTINGS:
            try:
                out[name] = placement.setting(name)
            except ValueError as error:
                out[name] = "ValueError: " + str(error)
        print(json.dumps(out))
    """)
    done = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_environment_variables():
    got = _settings_in_a_fresh_process({"DASK_MULTIREDUCE__PLACEMENT": "false",
                                        "DASK_MULTIREDUCE__DIRECT_TO_WORKERS": "no",
                                        "DASK_MULTIREDUCE__DIRECT_CONNECT_TIMEOUT": "750ms",
                                        "DASK_MULTIREDUCE__DIRECT_CHECK_INTERVAL": "0.5",
                                        "DASK_MULTIREDUCE__PLACEMENT_REUSE": "0",
                                        "DASK_MULTIREDUCE__TASKS_PER_THREAD": "3",
                                        "DASK_MULTIREDUCE__FUSE_ELEMENTWISE": "off",
                                        "DASK_MULTIREDUCE__SCAN_KEEP_CHUNKS": "no",
                                        "DASK_MULTIREDUCE__HELD_VALUES_IN_GRAPHS": "off"})
    assert got == {"multireduce.placement": False, "multireduce.direct-to-workers": False,
                   "multireduce.direct-connect-timeout": 0.75, "multireduce.direct-check-interval": 0.5,
                   "multireduce.placement-reuse": 0.0, "multireduce.tasks-per-thread": 3.0,
                   "multireduce.fuse-elementwise": False, "multireduce.scan-keep-chunks": False,
                   "multireduce.held-values-in-graphs": False}
    got = _settings_in_a_fresh_process({"DASK_MULTIREDUCE__PLACEMENT": "0",
                                        "DASK_MULTIREDUCE__DIRECT_TO_WORKERS": "None",
                                        "DASK_MULTIREDUCE__DIRECT_CONNECT_TIMEOUT": "",
                                        "DASK_MULTIREDUCE__PLACEMENT_REUSE": "soon",
                                        "DASK_MULTIREDUCE__SCAN_KEEP_CHUNKS": "Auto"})
    assert got["multireduce.placement"] is False and got["multireduce.direct-to-workers"] is None
    assert got["multireduce.scan-keep-chunks"] == "auto"
    assert got["multireduce.direct-connect-timeout"] == (
        "ValueError: dask.config 'multireduce.direct-connect-timeout': expected a duration above 0, a number of "
        "seconds or a string such as '2s', got ''")
    assert got["multireduce.placement-reuse"].startswith(
        "ValueError: dask.config 'multireduce.placement-reuse': expected a duration") and "got 'soon'" in \
        got["multireduce.placement-reuse"]


def test_yaml_files(tmp_path):
    (tmp_path / "multireduce.yaml").write_text(textwrap.dedent("""
        multireduce:
          placement: "false"
          direct-to-workers: off
          direct-connect-timeout: 1.5s
          direct-check-interval: 100ms
          placement-reuse: ""
          scan-keep-chunks: sometimes
    """))
    got = _settings_in_a_fresh_process({"DASK_CONFIG": str(tmp_path)})
    assert got["multireduce.placement"] is False and got["multireduce.direct-to-workers"] is False
    assert got["multireduce.direct-connect-timeout"] == 1.5 and got["multireduce.direct-check-interval"] == 0.1
    assert got["multireduce.placement-reuse"].endswith("got ''")
    assert got["multireduce.scan-keep-chunks"] == (
        "ValueError: dask.config 'multireduce.scan-keep-chunks': expected True or False or 'auto' (or a string "
        "such as 'true', 'false', 'yes', 'no', '1', '0'), got 'sometimes'")


# ------------------------------------------------------------------------------------------------
# What the settings decide, on a real cluster
# ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def client(cpu_client):
    return cpu_client


def _persisted(client, seed: int):
    from .helpers import persist_spread

    x = np.random.default_rng(seed).integers(-1000, 1000, size=6 * 97)
    return persist_spread(client, x, 97, [0, 1, 2, 2, 1, 0])[0], x


def _no_direct_call(*args, **kwargs):
    raise AssertionError("a worker was called directly")


@pytest.mark.parametrize("off", [False, "false", "False", "0", "no"])
def test_placement_off_as_a_string_turns_the_held_paths_off(client, off):
    d, x = _persisted(client, 1)
    assert isinstance(mr.sum(d), direct.WholeOfHeld)
    with dask.config.set({"multireduce.placement": off}):
        held = mr.sum(d)
        assert not isinstance(held, direct.WholeOfHeld) and held.compute() == x.sum()
        assert placement.holders(d, client) is None
        assert mr.sum(d, compute=True) == x.sum()


@pytest.mark.parametrize("off", [False, "false", "off", "0"])
def test_direct_to_workers_off_as_a_string_goes_through_the_scheduler(client, monkeypatch, off):
    d, x = _persisted(client, 2)
    monkeypatch.setattr(direct, "_call_one", _no_direct_call)
    with dask.config.set({"multireduce.direct-to-workers": off}):
        assert mr.sum(d, compute=True) == x.sum()
        np.testing.assert_array_equal(mr.cumsum(d).persist().compute(), np.cumsum(x))
    with dask.config.set({"multireduce.direct-to-workers": "yes"}), pytest.raises(AssertionError, match="directly"):
        mr.sum(d, compute=True)


@pytest.mark.parametrize("name", FLAGS + DURATIONS)
@pytest.mark.parametrize("given", ["", "garbage"])
def test_a_bad_setting_is_refused_before_any_work(client, name, given):
    d, x = _persisted(client, 3)
    assert mr.sum(d, compute=True) == x.sum()
    with dask.config.set({name: given}), pytest.raises(ValueError, match=f"dask.config '{name}': expected"):
        mr.sum(d, compute=True)
        mr.sum(d).compute()
        mr.cumsum(d).persist()
