"""Every exported function documents its parameters in NumPy's style, and a parameter shared by several
functions reads the same wherever it stands (the texts come from one table, ``api._PARAMETERS``)."""

from __future__ import annotations

import doctest
import inspect
import re

import pytest

import multireduce as mr
from multireduce import api

EXPORTED = sorted(n for n in mr.__all__ if inspect.isfunction(getattr(mr, n)))


def _documented(doc: str) -> dict[str, str]:
    """name -> its entry (the ``name : type`` line and the indented lines under it) in the Parameters section."""
    section = doc.split("Parameters\n", 1)[1].split("\n\n", 1)[0] if "Parameters\n" in doc else ""
    lines = inspect.cleandoc(section).splitlines()
    entries: dict[str, list[str]] = {}
    current = None
    for line in lines[1:] if lines and set(lines[0]) == {"-"} else lines:
        head = re.match(r"(\w+) : ", line)
        if head:
            current = entries.setdefault(head.group(1), [])
        if current is not None:
            current.append(line)
    return {name: "\n".join(text) for name, text in entries.items()}


@pytest.mark.parametrize("name", EXPORTED)
def test_every_parameter_is_documented(name):
    fn = getattr(mr, name)
    params = list(inspect.signature(fn).parameters)
    if not params:
        return
    doc = fn.__doc__ or ""
    assert re.search(r"^\s*Parameters\n\s*----------$", doc, flags=re.M), f"{name}: no NumPy-style Parameters section"
    documented = _documented(doc)
    missing = [p for p in params if p not in documented]
    assert not missing, f"{name}: parameters {missing} are not documented"
    assert list(documented) == params, f"{name}: documented in the order {list(documented)}, signature {params}"


def test_shared_parameters_read_the_same_everywhere():
    texts: dict[str, set[str]] = {}
    for name in EXPORTED:
        if name in ("register_operator", "unregister_operator", "algorithms", "operators", "persist"):
            continue  # their parameters are their own
        for param, text in _documented(getattr(mr, name).__doc__ or "").items():
            texts.setdefault(text, set()).add(name)
    known = set(api._PARAMETERS.values())
    strays = {t.splitlines()[0]: sorted(names) for t, names in texts.items() if t not in known}
    assert not strays, f"parameter texts that are not in api._PARAMETERS: {strays}"


# ------------------------------------------------------------------------------------------------
# Examples: every public function shows one, and they run (NumPy and Dask only: no GPU, no cluster
# except local_cluster's own, in-process)
# ------------------------------------------------------------------------------------------------
def _public_functions():
    import importlib

    # importlib: ``multireduce.operators`` as an attribute is the function operators(), not the module
    modules = [importlib.import_module(f"multireduce.{m}") for m in ("statistics", "operators", "cluster", "catalogue")]
    found = {f"multireduce.{n}": getattr(mr, n) for n in mr.__all__ if callable(getattr(mr, n))}
    for module in modules:
        names = getattr(module, "__all__", None) or [n for n in vars(module) if not n.startswith("_")]
        for n in names:
            obj = getattr(module, n)
            if inspect.isfunction(obj) and obj.__module__ == module.__name__ and obj not in found.values():
                found[f"{module.__name__}.{n}"] = obj
    return found


PUBLIC = _public_functions()
EXAMPLE_FLAGS = doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_every_public_function_has_examples(name):
    doc = inspect.getdoc(PUBLIC[name]) or ""
    assert re.search(r"^Examples\n--------\n>>> ", doc, flags=re.M), f"{name}: no Examples section"


def _examples():
    finder = doctest.DocTestFinder(exclude_empty=True)
    tests = {}
    for name, obj in PUBLIC.items():
        module = inspect.getmodule(obj)
        for test in finder.find(obj, name, module=module, globs={}):
            if test.examples and test.docstring is obj.__doc__:
                tests[name] = test
    return tests


EXAMPLES = _examples()


@pytest.fixture
def restore_operators():
    """Examples run as in a new session, with the built-in operators only (other tests may have left theirs),
    and an example that registers an operator or a check leaves the registry as it found it."""
    import importlib

    operators = importlib.import_module("multireduce.operators")
    registry, checks = dict(operators._REGISTRY), list(operators._CHECKS)
    operators._REGISTRY.clear()
    operators._REGISTRY.update(operators._BUILTINS)
    yield
    operators._REGISTRY.clear()
    operators._REGISTRY.update(registry)
    operators._CHECKS[:] = checks


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_examples_run(name, restore_operators):
    import io

    out = io.StringIO()
    runner = doctest.DocTestRunner(optionflags=EXAMPLE_FLAGS)
    result = runner.run(EXAMPLES[name], out=out.write)
    assert result.attempted and not result.failed, out.getvalue()
