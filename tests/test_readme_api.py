"""README's API table against the real signatures: names, order, kinds (keyword-only or not) and defaults."""

from __future__ import annotations

import ast
import inspect
import pathlib
import re

import pytest

import multireduce as mr

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def _table() -> dict[str, ast.arguments]:
    """``name -> parsed parameters`` for every row of the API table whose first cell is ``name(...)``."""
    text = README.read_text()
    section = text[text.index("## API"):]
    section = section[: section.index("\n## ", 1)]
    rows = {}
    for cell in re.findall(r"^\| `([A-Za-z_][\w.]*\(.*?\))`", section, flags=re.M):
        name, params = cell.split("(", 1)
        if "." in name:  # functions of submodules are not exported from multireduce
            continue
        tree = ast.parse(f"def f({params[:-1]}): pass")
        rows[name] = tree.body[0].args
    return rows


def _described(args: ast.arguments) -> list[tuple[str, str, object]]:
    """(name, kind, default) per parameter, kinds named as inspect names them."""
    out = []
    positional = args.posonlyargs + args.args
    defaults = [inspect.Parameter.empty] * (len(positional) - len(args.defaults)) + [ast.literal_eval(d) for d in args.defaults]
    for a, d in zip(positional, defaults):
        out.append((a.arg, "POSITIONAL_OR_KEYWORD", d))
    if args.vararg:
        out.append((args.vararg.arg, "VAR_POSITIONAL", inspect.Parameter.empty))
    for a, d in zip(args.kwonlyargs, args.kw_defaults):
        out.append((a.arg, "KEYWORD_ONLY", inspect.Parameter.empty if d is None else ast.literal_eval(d)))
    if args.kwarg:
        out.append((args.kwarg.arg, "VAR_KEYWORD", inspect.Parameter.empty))
    return out


def _actual(fn) -> list[tuple[str, str, object]]:
    return [(p.name, p.kind.name, p.default) for p in inspect.signature(fn).parameters.values()]


EXPORTED = sorted(n for n in mr.__all__ if inspect.isfunction(getattr(mr, n)))


def test_table_lists_every_exported_function_and_nothing_else():
    assert set(_table()) == set(EXPORTED)


@pytest.mark.parametrize("name", EXPORTED)
def test_table_signature_matches(name):
    assert _described(_table()[name]) == _actual(getattr(mr, name))


def test_options_are_keyword_only_in_one_order():
    reductions = [mr.sum, mr.prod, mr.min, mr.max, mr.mean, mr.reduce]
    scans = [mr.cumsum, mr.cumprod, mr.scan]
    for fn in reductions:
        params = inspect.signature(fn).parameters
        names = list(params)
        tail = names[names.index("keepdims") + 1:]
        # NumPy's keywords first, in NumPy's order, then the shared options in one order; sum-like functions
        # add exact= last
        numpy_keywords = [n for n in tail if n in ("out", "initial", "where")]
        assert tail[:len(numpy_keywords)] == numpy_keywords and numpy_keywords[0] == "out", fn.__name__
        assert numpy_keywords == [n for n in ("out", "initial", "where") if n in numpy_keywords], fn.__name__
        assert [n for n in tail if n not in ("exact", *numpy_keywords)] == ["split_every", "algorithm", "compute"], \
            fn.__name__
        assert "exact" not in tail or tail[-1] == "exact", fn.__name__
        assert all(params[n].kind is inspect.Parameter.KEYWORD_ONLY for n in tail), fn.__name__
    for fn in scans:
        params = inspect.signature(fn).parameters
        names = list(params)
        tail = names[names.index("dtype") + 1:]
        # out= first, as NumPy's scans take it, then the shared options
        assert tail[0] == "out", fn.__name__
        assert [n for n in tail if n not in ("out", "inclusive", "exact")] == ["split_every", "algorithm", "accumulate"], \
            fn.__name__
        assert "exact" not in tail or tail[-1] == "exact", fn.__name__
        assert all(params[n].kind is inspect.Parameter.KEYWORD_ONLY for n in tail), fn.__name__


def test_shared_parameters_share_one_numpy_style_text():
    texts = {}
    for fn in (mr.sum, mr.prod, mr.min, mr.max, mr.mean, mr.reduce, mr.cumsum, mr.cumprod, mr.scan):
        doc = fn.__doc__
        assert "\nParameters\n----------\n" in doc and "\nReturns\n-------\n" in doc, fn.__name__
        for name in ("split_every", "algorithm", "dtype"):
            block = re.search(rf"^{name} : .*?(?=^\w+ : |\n\nReturns)", doc, flags=re.M | re.S).group(0)
            texts.setdefault(name, set()).add(block.strip())
    assert all(len(v) == 1 for v in texts.values()), texts


def test_python_dash_m_runs_the_cli(tmp_path, capsys):
    import os
    import subprocess
    import sys

    from multireduce.cli import main

    # the checkout first, then whatever this process was given (wheels installed to a folder on a GPU machine)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(README.parent), os.environ.get("PYTHONPATH"))
                                                      if p))
    run = subprocess.run([sys.executable, "-m", "multireduce", "--help"], capture_output=True, text=True, env=env,
                         cwd=tmp_path, timeout=60)
    assert run.returncode == 0, run.stderr
    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    assert exited.value.code == 0
    assert run.stdout == capsys.readouterr().out


def _several_gpus_snippet() -> str:
    text = README.read_text()
    section = text[text.index("## Several GPUs, several nodes"):]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


@pytest.mark.slow
def test_several_gpus_snippet_runs_as_a_script(tmp_path):
    """The README's cluster snippet, saved as a file and run: its worker processes import the file again,
    so it must start the cluster only under ``__main__``. Its four numbers are NumPy's sum of its data."""
    import os
    import subprocess
    import sys

    import dask.array as da
    import numpy as np

    snippet = _several_gpus_snippet()
    script = tmp_path / "snippet.py"
    script.write_text(snippet)
    # the checkout first, then whatever this process was given (wheels installed to a folder on a GPU machine)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(README.parent), os.environ.get("PYTHONPATH"))
                                                      if p))
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, cwd=tmp_path,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-5000:]
    values = [float(v) for v in run.stdout.split()]
    data = re.search(r"^\s*x = (da\.random\.[^#\n]*?)\s*(?:#.*)?$", snippet, flags=re.M).group(1)
    x = np.asarray(eval(data, {"da": da}).compute(scheduler="synchronous"))
    expected = np.sum(x, dtype=np.float64)
    assert len(values) == 4 and values[:3] == [values[0]] * 3, values
    np.testing.assert_allclose(values, expected, rtol=1e-12)
