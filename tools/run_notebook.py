"""Run a notebook's code cells top to bottom as one script, where Jupyter is not installed (a GPU machine
whose image has no kernel to run it): each cell's printed output and wall time in order, IPython's magic
and shell lines left out, and each figure shown saved as a PNG.

    python tools/run_notebook.py notebooks/xarray_climatology.ipynb [--out DIR]

The working directory is the notebook's folder, as in Jupyter. The exit status is 1 when a cell raises
(its traceback printed), else 0.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path


def code_cells(notebook: dict) -> list[str]:
    """The source of each code cell, without the lines IPython alone understands (``%``, ``!``)."""
    cells = []
    for cell in notebook.get("cells", []):
        if cell.get("cell_type") != "code":
            continue
        source = cell.get("source", "")
        lines = (source if isinstance(source, list) else source.splitlines(keepends=True))
        cells.append("".join(line for line in lines if not line.lstrip().startswith(("%", "!"))))
    return cells


def run(path: Path, out: Path) -> int:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    shown = []

    def show(*args, **kwargs):
        for number in plt.get_fignums():
            target = out / f"{path.stem}-figure-{len(shown) + 1}.png"
            plt.figure(number).savefig(target, dpi=80)
            shown.append(target)
            print(f"[figure saved: {target}]")
        plt.close("all")

    plt.show = show
    cells = code_cells(json.loads(path.read_text()))
    namespace = {"__name__": "__main__"}
    os.chdir(path.parent)
    sys.path.insert(0, str(path.parent))
    for i, source in enumerate(cells, 1):
        started = time.perf_counter()
        try:
            exec(compile(source, f"{path.name}, cell {i}", "exec"), namespace)
        except BaseException:  # the notebook's own failure: reported as Jupyter would, then stop
            traceback.print_exc()
            print(f"[cell {i} of {len(cells)} failed after {time.perf_counter() - started:.2f} s]", flush=True)
            return 1
        print(f"[cell {i} of {len(cells)}: {time.perf_counter() - started:.2f} s]", flush=True)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebook", type=Path)
    parser.add_argument("--out", type=Path, default=Path("notebook-figures"),
                        help="where figures go (default ./notebook-figures)")
    args = parser.parse_args(argv)
    if not args.notebook.is_file():
        parser.error(f"argument notebook: expected a notebook file; got {str(args.notebook)!r}, which does not exist")
    return run(args.notebook.resolve(), args.out.resolve())


if __name__ == "__main__":
    sys.exit(main())
