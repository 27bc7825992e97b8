"""The documents a reader opens: every relative link leads somewhere, the index reaches every page, and
no page speaks of how the work was organised (work sessions, helpers, issue numbers a reader cannot see)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
CODE_SPAN = re.compile(r"`[^`\n]*`")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)
WORK_TALK = re.compile(r"sessions?[- ][0-9]|issues?[- ]#?[0-9]|helper(?!s\.py)", re.I)  # tests/helpers.py is a file name


def _prose(text: str) -> str:
    """Markdown without code blocks and code spans, where a bracket is not a link."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def _anchors(page: Path) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation dropped, spaces as hyphens,
    repeats numbered."""
    seen: dict[str, int] = {}
    out = set()
    for title in HEADING.findall(FENCE.sub("", page.read_text(encoding="utf-8"))):
        slug = re.sub(r"[^\w\- ]", "", title.replace("`", "").lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def broken_links(page: Path) -> list[str]:
    """Relative links of ``page`` whose file does not exist, or whose ``#anchor`` names no heading of a
    Markdown target."""
    bad = []
    for target in LINK.findall(_prose(page.read_text(encoding="utf-8"))):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: ...
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            bad.append(f"{target}: no file {dest}")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            bad.append(f"{target}: no heading #{anchor} in {dest.name}")
    return bad


def work_talk(path: Path) -> list[str]:
    """Lines of ``path`` that speak of work sessions, helpers or issue numbers (a notebook: its cells)."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".ipynb":
        text = "\n".join("".join(cell["source"]) for cell in json.loads(text)["cells"])
    name = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    return [f"{name}:{i}: {line.strip()}" for i, line in enumerate(text.splitlines(), 1) if WORK_TALK.search(line)]


def _reader_files() -> list[Path]:
    """Everything a reader of the repository reads besides the package and its tests: the documents,
    notebooks, benchmarks, deployment files and tools; not the benchmarks' data (JSON, images)."""
    files = list(PAGES) + sorted((ROOT / "notebooks").glob("*.ipynb"))
    for folder in ("benchmarks", "deploy", "tools"):
        files += [p for p in sorted((ROOT / folder).rglob("*")) if p.is_file()
                  and p.suffix not in (".json", ".png", ".pyc") and "__pycache__" not in p.parts]
    return files


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_lead_somewhere(page):
    assert broken_links(page) == []


def test_no_work_log_talk_for_readers():
    assert [hit for path in _reader_files() for hit in work_talk(path)] == []


def test_index_links_every_page():
    index = DOCS / "README.md"
    linked = {(index.parent / t.partition("#")[0]).resolve() for t in LINK.findall(_prose(index.read_text()))}
    missing = [p.name for p in DOCS.glob("*.md") if p != index and p.resolve() not in linked]
    assert missing == []


def test_checks_find_what_they_look_for(tmp_path):
    (tmp_path / "other.md").write_text("# A title, with `code`\n\n## A title, with `code`\n")
    page = tmp_path / "page.md"
    page.write_text("[ok](other.md#a-title-with-code) [ok](other.md#a-title-with-code-1) [web](https://x.org/y)\n"
                    "[gone](missing.md) [no anchor](other.md#nope) `[in code](missing.md)`\n"
                    "```\n[in a block](missing.md)\n```\n")
    assert broken_links(page) == ["missing.md: no file " + str(tmp_path / "missing.md"),
                                  "other.md#nope: no heading #nope in other.md"]
    talk = tmp_path / "notes.md"
    talk.write_text("fine\nas measured in Session 12\nissue 7's goal\nissue-14 target\na helper's run\nissues 3\n")
    assert [hit.split(":")[1] for hit in work_talk(talk)] == ["2", "3", "4", "5", "6"]
    notebook = tmp_path / "n.ipynb"
    notebook.write_text(json.dumps({"cells": [{"source": ["# fine\n"]}, {"source": ["x = 1  # from session 3\n"]}]}))
    assert len(work_talk(notebook)) == 1


def test_every_extra_is_in_the_readmes_table():
    """The README's table of extras names every optional dependency set that pyproject.toml offers."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("| extra | adds | pick it for |"):]
    table = table[: table.index("\n\n")]
    named = set(re.findall(r"`([a-z0-9-]+)`", "\n".join(line.split("|")[1] for line in table.splitlines()[2:])))
    assert set(extras) <= named, sorted(set(extras) - named)
