"""The documentation site (docs/mkdocs.yml, pages in docs/pages/) builds, and its pages cannot
drift from the code, checked as the README is (tests/test_readme.py, whose helpers read them):

- the site builds with warnings as errors (`mkdocs build --strict`: a broken link between pages,
  to a run folder under results/, or a docstring the API reference cannot read fails it);
- every `convbench ...` command in a page's console blocks parses, and every `make phases` /
  `python -m convbench.tools.phases_bench` line parses with that tool's parser;
- every `$ convbench` example runs and prints the headers and `convbench:` lines shown, once:
  an example the README already shows is run by its test, not again here;
- a page's `python` blocks compile and every convbench name they import exists (they are
  fragments of training code, not run);
- every relative link of a page, and of results/README.md (the findings beside their data),
  points to a file of the repository, and every run folder has its entry there.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from test_readme import (
    README,
    REPO,
    blocks,
    broken_links,
    check_example,
    check_parses,
    commands,
    examples,
    python_examples,
)

from convbench.tools import phases_bench

DOCS = REPO / "docs"
PAGES = sorted((DOCS / "pages").rglob("*.md"))
RESULTS_INDEX = REPO / "results" / "README.md"
#: What the strict build needs: the `docs` extra (`pip install -e ".[docs]"`).
BUILD_MODULES = ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python")


def _name(page: Path) -> str:
    return str(page.relative_to(REPO))


def _missing_build_modules() -> list[str]:
    out = []
    for name in BUILD_MODULES:
        try:
            found = importlib.util.find_spec(name)
        except ModuleNotFoundError:
            found = None
        if found is None:
            out.append(name)
    return out


def test_there_are_pages_and_they_hold_the_reference():
    names = {p.name for p in PAGES}
    assert {"commands.md", "measurement.md", "design.md", "changes.md",
            "api.md"} <= names
    assert sum(len(commands(p)) for p in PAGES) > 40


def test_the_site_builds_strictly(tmp_path):
    missing = _missing_build_modules()
    if missing:
        pytest.skip(f"the docs extra is not installed here ({', '.join(missing)} not "
                    "importable; pip install -e '.[docs]', as make install does)")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-f",
         str(DOCS / "mkdocs.yml"), "-d", str(tmp_path / "site")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "site" / "index.html").exists()
    assert (tmp_path / "site" / "results" / "index.html").exists()  # the findings


def _page_commands() -> list[tuple[str, str]]:
    return [(_name(p), line) for p in PAGES for line in commands(p)]


@pytest.mark.parametrize("page, line", _page_commands())
def test_every_command_parses(page, line):
    check_parses(line, page)


def _phases_lines() -> list[tuple[str, list[str]]]:
    """The phases_bench command lines of the pages' console blocks, as the tool's arguments."""
    out = []
    for page in PAGES:
        for _, body in blocks(page, "console"):
            for line in body.splitlines():
                words = (shlex.split(line.strip().removeprefix("$ "), comments=True)
                         if "phases" in line else [])
                if words[:2] == ["make", "phases"]:
                    out.append((_name(page), [a for w in words[2:]
                                              if w.startswith("PHASES_ARGS=")
                                              for a in shlex.split(w.partition("=")[2])]))
                elif "convbench.tools.phases_bench" in words:
                    i = words.index("convbench.tools.phases_bench")
                    out.append((_name(page), words[i + 1:]))
    return out


def test_the_phases_commands_parse():
    lines = _phases_lines()
    assert lines, "the pages quote no phases_bench command"
    for page, argv in lines:
        try:
            phases_bench._parser().parse_args(argv)
        except SystemExit as exc:
            if exc.code:
                pytest.fail(f"{page}: phases_bench {shlex.join(argv)} does not parse")


def _page_examples() -> list[tuple[str, dict[str, str], str, list[str]]]:
    """Each page's examples, less those the README (or an earlier page) already runs."""
    seen = {(cmd, tuple(sorted(files.items()))) for files, cmd, _ in examples(README)}
    out = []
    for page in PAGES:
        for files, command, shown in examples(page):
            key = (command, tuple(sorted(files.items())))
            if key not in seen:
                seen.add(key)
                out.append((_name(page), files, command, shown))
    return out


@pytest.mark.parametrize("page, files, command, shown", _page_examples(),
                         ids=lambda v: v if isinstance(v, str) else "")
def test_every_example_prints_what_the_page_shows(page, files, command, shown, tmp_path,
                                                  monkeypatch, capsys):
    check_example(files, command, shown, page, tmp_path, monkeypatch, capsys)


def _python_blocks() -> list[tuple[str, str]]:
    return [(_name(p), code) for p in PAGES for code, _ in python_examples(p)]


@pytest.mark.parametrize("page, code", _python_blocks())
def test_python_blocks_compile_and_name_what_exists(page, code):
    tree = ast.parse(code, page)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("convbench"):
            module = importlib.import_module(node.module)
            for alias in node.names:
                if not hasattr(module, alias.name):
                    try:
                        importlib.import_module(f"{node.module}.{alias.name}")
                    except ModuleNotFoundError:
                        pytest.fail(f"{page}: {node.module} has no {alias.name}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("convbench"):
                    importlib.import_module(alias.name)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_page_link_works_in_the_repository(page):
    """Links are written as they work in the repository (the site's hooks rewrite them), so a
    page read on a forge works too; the strict build checks them on the site."""
    assert broken_links(page) == []


def test_the_findings_link_to_what_is_there():
    assert RESULTS_INDEX.exists()
    assert broken_links(RESULTS_INDEX) == []


def test_every_run_folder_is_in_the_findings():
    text = RESULTS_INDEX.read_text()
    folders = sorted(p.name for p in (REPO / "results").iterdir() if p.is_dir())
    assert [f for f in folders if f"({f}/" not in text] == []
