"""The notebooks run top to bottom (CPU-only here; on a GPU machine their GPU branches run instead).

Each notebook is executed as a user would run it, in a fresh kernel whose working directory is notebooks/
and whose ``PYTHONPATH`` starts with this checkout (so the notebooks import the library under test). A
notebook passes when no cell errs, the line it prints on success is there, and its plot (if it draws one)
came out as a PNG.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

from multireduce.cluster import gpu_count  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"

# notebook: (lines it prints on success, lines it prints only without a GPU, draws a plot)
CASES = {
    "quickstart.ipynb": (["cumsum matches NumPy"], [], False),
    "kernels.ipynb": (["matches NumPy (float64)"],
                      ["no GPU here: plotting the", "refuses a GPU kernel for NumPy data"], True),
    "multi_gpu.ipynb": (["cumsum matches NumPy (float64)", "plotting the committed measurement", "dashboard: http",
                         "client and cluster closed"], [], True),
    "xarray_climatology.ipynb": (["monthly climatology matches xarray", "daily max matches xarray",
                                  "running total matches xarray", "client and cluster closed"], [], True),
}


def _run(path: Path, monkeypatch) -> nbformat.NotebookNode:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    nb = nbformat.read(path, as_version=4)
    nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}}).execute()
    return nb


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CASES))
def test_notebook_runs(name, monkeypatch):
    pytest.importorskip("ipykernel")
    if name != "quickstart.ipynb":
        pytest.importorskip("matplotlib")
    markers, cpu_markers, plots = CASES[name]
    nb = _run(NOTEBOOKS / name, monkeypatch)
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    errors = [f"{o.get('ename')}: {o.get('evalue')}" for o in outputs if o.get("output_type") == "error"]
    assert not errors, errors
    text = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
    for marker in markers + (cpu_markers if gpu_count() == 0 else []):
        assert marker in text, f"{name}: {marker!r} missing from its output"
    if plots:
        assert any("image/png" in o.get("data", {}) for o in outputs), f"{name}: no plot (image/png) in its output"


@pytest.mark.parametrize("name", sorted(CASES))
def test_notebook_committed_without_outputs(name):
    """CI executes the notebooks; the committed files carry no stale outputs or execution counts."""
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.get("outputs") == [] and cell.get("execution_count") is None, name


@pytest.mark.slow
def test_a_notebook_runs_as_a_script_where_jupyter_is_not(tmp_path, capsys):
    """tools/run_notebook.py (for GPU machines without Jupyter): code cells in order in one namespace,
    magics left out, each figure shown saved, a failing cell stops the run with status 1."""
    import importlib.util
    import json

    pytest.importorskip("matplotlib")
    spec = importlib.util.spec_from_file_location("run_notebook", ROOT / "tools" / "run_notebook.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    cells = [{"cell_type": "markdown", "source": "# a title"},
             {"cell_type": "code", "source": ["%matplotlib inline\n", "import matplotlib.pyplot as plt\n", "x = 41"]},
             {"cell_type": "code", "source": "print('x is', x + 1)\nplt.plot([1, 2])\nplt.show()"}]
    notebook = tmp_path / "n.ipynb"
    notebook.write_text(json.dumps({"cells": cells}))
    assert tool.main([str(notebook), "--out", str(tmp_path / "figs")]) == 0
    printed = capsys.readouterr().out
    assert "x is 42" in printed and "[cell 2 of 2:" in printed
    assert (tmp_path / "figs" / "n-figure-1.png").stat().st_size > 0
    cells.append({"cell_type": "code", "source": "raise ValueError('stop here')"})
    notebook.write_text(json.dumps({"cells": cells}))
    assert tool.main([str(notebook), "--out", str(tmp_path / "figs")]) == 1
    assert "[cell 3 of 3 failed" in capsys.readouterr().out
