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
  points to a file of the repository, and every run folder has its entry there;
- every algorithm a page, the README or the findings name is one the registry has (the lists of
  algorithms and their traits are generated from it, `docs/hooks.py`), and every generated list
  a page asks for is one the hooks make.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import os
import re
import shlex
import shutil
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
    committed_runs,
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


def _make_docs(root: Path, site: Path) -> subprocess.CompletedProcess:
    """`make docs` in `root`, the very target a user runs (its flags are the Makefile's), in
    this Python environment (`USE_ENV=1`), the site into `site`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAKE")}
    return subprocess.run(
        ["make", "-C", str(root), "docs", "USE_ENV=1", f"PYTHON={sys.executable}",
         f"DOCS_SITE={site}"],
        env=env, capture_output=True, text=True, timeout=300, check=False)


def _skip_without_the_build() -> None:
    missing = _missing_build_modules()
    if missing:
        pytest.skip(f"the docs extra is not installed here ({', '.join(missing)} not "
                    "importable; pip install -e '.[docs]', as make install does)")
    if shutil.which("make") is None:
        pytest.skip("no make here: `make docs` is the build checked")


def test_the_site_builds_strictly(tmp_path):
    """#45: `make docs` failed from a fresh clone (a cross-reference with no target) while this
    test passed: it ran its own `mkdocs build --strict -q`, and `-q` hides the warnings strict
    mode counts. Now it runs the Makefile's target itself."""
    _skip_without_the_build()
    proc = _make_docs(REPO, tmp_path / "site")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "WARNING" not in proc.stderr, proc.stderr
    assert (tmp_path / "site" / "index.html").exists()
    assert (tmp_path / "site" / "results" / "index.html").exists()  # the findings


def test_the_docs_build_fails_on_a_bad_cross_reference(tmp_path):
    """The check bites: a copy of the site's sources with one bare `[K][N·P·Q]` (markdown's
    reference link, whose target mkdocstrings' cross-references cannot find, as changes.md had)
    fails `make docs`, naming it."""
    _skip_without_the_build()
    copy = tmp_path / "repo"
    copy.mkdir()
    shutil.copy(REPO / "Makefile", copy)
    shutil.copy(README, copy)
    shutil.copytree(DOCS, copy / "docs", ignore=shutil.ignore_patterns("site", "__pycache__"))
    for name in ("results", "convbench"):  # read, not changed: linked, not copied
        (copy / name).symlink_to(REPO / name)
    changes = copy / "docs" / "pages" / "changes.md"
    changes.write_text(changes.read_text() + "\n- dy copied to [K][N·P·Q] before the product.\n")
    proc = _make_docs(copy, tmp_path / "site")
    assert proc.returncode != 0
    assert "Could not find cross-reference target 'N·P·Q'" in proc.stderr, proc.stderr


def test_the_docs_tools_are_bounded_and_installed_within_their_bounds():
    """A fresh install takes the newest releases the bounds allow: each docs tool is bounded
    above (a release that adds a warning fails the strict build), and the environment the
    build is tested in holds versions inside the bounds."""
    from importlib import metadata

    try:
        import tomllib
    except ImportError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")

    from packaging.requirements import Requirement

    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]["docs"]
    unbounded = [r for r in map(Requirement, extra)
                 if not any(s.operator in ("<", "<=", "==", "~=") for s in r.specifier)]
    assert unbounded == []
    if _missing_build_modules():
        return
    for r in map(Requirement, extra):
        version = metadata.version(r.name)
        assert r.specifier.contains(version, prereleases=True), (r.name, version, str(r))


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


#: A name in backticks or an `--algos` list, and the first word of every algorithm's name.
_BACKTICKED = re.compile(r"`([a-z][a-z0-9-]*(?:-\*)?)`")
_ALGOS_OPTION = re.compile(r"--algos[ =]([A-Za-z0-9,*-]+)")


def unknown_algorithms(text: str) -> list[str]:
    """The names `text` gives algorithms that the registry does not have: a word in backticks
    (or in an `--algos` list) that is an algorithm's name or begins as one does
    (`winograd-...`, `cudnn-find-*`), and is no registered algorithm, alias, `all` or pattern
    some algorithm matches."""
    from convbench.algos import registry

    names = registry.names()
    stems = {n.split("-")[0] for n in names}
    known = {*names, *registry.ALIASES, "all"}
    words = set(_BACKTICKED.findall(text))
    for listed in _ALGOS_OPTION.findall(text):
        words.update(w for w in listed.split(",") if w)
    return sorted(w for w in words if "-" in w and w.split("-")[0] in stems and not (
        w in known or (w.endswith("-*") and any(n.startswith(w[:-1]) for n in names))))


def test_unknown_algorithms_bite():
    text = ("`winograd-3x3` and `cudnn-find-*`, `nvidia-*`, `torch-cpu`, `torch`, "
            "`convbench list`\n$ convbench layer conv3 --algos gemm,fft-tiling,winograd\n")
    assert unknown_algorithms(text) == ["fft-tiling", "winograd-3x3"]


@pytest.mark.parametrize("page", [*PAGES, README, RESULTS_INDEX], ids=lambda p: p.name)
def test_every_algorithm_a_page_names_is_registered(page):
    assert unknown_algorithms(page.read_text()) == []


def documented_columns(text: str) -> list[str]:
    """The columns the results-folder page's measurements.csv table names (its first cells)."""
    section = text.split("## `measurements.csv`")[1].split("\n## ")[0]
    return [name for line in section.splitlines() if line.startswith("| `")
            for name in re.findall(r"`([^`]+)`", line.split(" | ")[0])]


def test_the_results_page_names_every_column_and_no_other():
    """#47: the page's column table is the row record's columns, no more and no fewer (a
    column renamed in `results.Row` and not on the page, or named on the page and gone from
    the code, fails here)."""
    from convbench.core import results

    named = documented_columns((DOCS / "pages" / "results-folder.md").read_text())
    assert sorted(named) == sorted(results.COLUMNS)
    text = "## `measurements.csv`\n\n| `layer` | x |\n| `median_ms`, `speed` | y |\n"
    assert documented_columns(text) == ["layer", "median_ms", "speed"]  # it reads every name


def _hooks():
    """docs/hooks.py, as the docs build loads it (it needs mkdocs: skipped without it)."""
    pytest.importorskip("mkdocs", reason="the docs extra is not installed here")
    spec = importlib.util.spec_from_file_location("docs_hooks", DOCS / "hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    return hooks


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_a_page_asks_only_for_lists_the_docs_build_makes(page):
    hooks = _hooks()
    for name in hooks.MARKER.findall(page.read_text()):
        assert name in hooks.GENERATED, f"{page.name}: <!-- convbench:{name} -->"


def test_the_generated_lists_are_the_registry_s():
    """The algorithms' table has a row per registered algorithm with its traits, and the
    tolerances' a row per column, each with the algorithms that declare it."""
    from convbench.algos import registry
    from convbench.algos.traits import TOLERANCES

    hooks = _hooks()
    rows = hooks.algorithms().splitlines()[2:]
    assert [r.split(" | ")[0].strip("| `") for r in rows] == registry.names()
    fft = next(r for r in rows if r.startswith("| `fft` |"))
    assert "| fft | ours | `fft` | counted | `FFTCount()` |" in fft
    columns = hooks.tolerances().splitlines()[2:]
    assert [r.split(" | ")[0].strip("| `") for r in columns] == list(TOLERANCES)
    assert columns[0].startswith("| `exact` | 1e-12 | 1e-5 | 5e-3 | 1e-2 | 5e-2 | `direct`")


def test_a_long_report_shows_its_tables_cut_and_says_so():
    """A whole catalog's report (20 MB, a column per layer) took a minute of every docs build:
    the site shows each table's first rows and columns, says how much more the report holds,
    and keeps every heading (so links into the page still land) and every line between
    tables."""
    hooks = _hooks()
    rows, cols = hooks.SHOWN_ROWS + 7, hooks.SHOWN_COLUMNS + 3
    wide = ["| " + " | ".join(f"h{j}" for j in range(cols)) + " |",
            "|" + "---|" * cols,
            *("| " + " | ".join(f"{i}.{j}" for j in range(cols)) + " |" for i in range(rows))]
    small = ["| a | b |", "|---|---|", "| 1 | 2 |"]
    text = "\n".join(["# Report", "", "## Time per layer", "", *wide, "", "## Small", "",
                      *small, "text after"])
    out = hooks.shortened(text).splitlines()
    assert [line for line in out if line.startswith("#")] == ["# Report", "## Time per layer",
                                                             "## Small"]
    table = [line for line in out if re.match(r"\| (h0|\d+\.0) ", line)]
    assert len(table) == 1 + hooks.SHOWN_ROWS and table[-1].startswith(
        f"| {hooks.SHOWN_ROWS - 1}.")
    assert all(line.count("|") == hooks.SHOWN_COLUMNS + 1 for line in table)
    assert "*7 more rows and 3 more columns: the whole table is in this report" in "\n".join(out)
    assert out[-4:] == [*small, "text after"]  # a table within the limits is kept whole


def test_the_findings_link_to_what_is_there():
    assert RESULTS_INDEX.exists()
    assert broken_links(RESULTS_INDEX) == []


def test_every_run_folder_is_in_the_findings():
    """Every committed run folder (git tracks it) has its entry; a user's own run is not one
    (#45: `make bench` then `make test` failed on the folder the bench had just written)."""
    text = RESULTS_INDEX.read_text()
    folders = [p.name for p in committed_runs()]
    assert len(folders) >= 10
    assert [f for f in folders if f"({f}/" not in text] == []


def test_committed_runs_are_the_tracked_folders(tmp_path):
    """A folder under results/ that git does not track (a run left there) is no committed run."""
    def git(*argv):
        subprocess.run(["git", "-C", str(tmp_path), *argv], check=True, capture_output=True)

    if shutil.which("git") is None:
        pytest.skip("no git here")
    git("init", "-q")
    for name in ("committed", "left-there"):
        (tmp_path / "results" / name).mkdir(parents=True)
        (tmp_path / "results" / name / "env.json").write_text("{}")
    git("add", "results/committed")
    assert committed_runs(tmp_path) == [tmp_path / "results" / "committed"]


def test_a_run_without_out_lands_where_git_ignores_it_apart_from_the_findings():
    """#45: `make bench` wrote into results/, among the committed findings, untracked; a run
    given no --out goes to my-runs/, which .gitignore names."""
    from convbench import runs

    folder = runs.default_folder("alexnet", "numpy")
    assert folder.parts[0] == "my-runs" and "results" not in folder.parts
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    probe = subprocess.run(["git", "-C", str(REPO), "check-ignore", "-q",
                            str(folder / "measurements.csv")], check=False)
    assert probe.returncode == 0, f"git does not ignore {folder}"


#: "took 3m06s ... (results/<folder>" in a page: how long a committed run took, and which.
_TOOK = re.compile(r"took (\d+m\d\ds)\b[^\n]*\n?[^\n]*?results/([^/)\s`]+)")


def test_a_run_time_in_prose_is_the_committed_run_s_own():
    """#45: commands.md promised an AlexNet sweep "within 15 minutes" (it took 3m17s on the
    issue's machine): a duration the README or a page states comes from the run it names (its
    env.json's load readings, as its report's `took` says), and none is promised."""
    from convbench.analysis.report import prose
    from convbench.core.fmt import fmt_duration

    stated = []
    for page in [README, *PAGES]:
        text = page.read_text()
        assert not re.search(r"within \d+ minutes on \d+ cores", text), page
        for took, folder in _TOOK.findall(text):
            env = json.loads((REPO / "results" / folder / "env.json").read_text())
            assert took == fmt_duration(prose.run_seconds(env)), (page, folder)
            stated.append(folder)
    assert stated  # commands.md states the default sweep's


def test_a_model_zoo_installs_beside_the_pinned_torch_and_is_measured():
    """#45: a model zoo built on torchvision (timm) could not be installed beside the pinned
    CPU torch without replacing it. problems.md says how: torchvision built for the Makefile's
    torch, from PyTorch's CPU index, then the zoo with `--no-deps`, then `bench --model` on one
    of its models (those lines parse as every page's commands do)."""
    page = DOCS / "pages" / "problems.md"
    (block,) = [body for _, body in blocks(page, "console") if "--no-deps timm" in body]
    lines = [line.split("#")[0].split() for line in block.splitlines()]
    order = [" ".join(words) for words in lines
             if len(words) > 2 and Path(words[0]).name == "pip" and words[1] == "install"]
    torch_pin = re.search(r'TORCH\s*\?=\s*torch==(\S+)', (REPO / "Makefile").read_text())[1]
    vision = next(i for i, text in enumerate(order) if "torchvision==" in text)
    zoo = next(i for i, text in enumerate(order) if text.endswith("--no-deps timm"))
    assert vision < zoo, order
    assert "--index-url https://download.pytorch.org/whl/cpu" in order[vision]
    assert f"the CPU build for torch {torch_pin}" in block
    measured = [line for line in block.splitlines() if "bench --model timm." in line]
    assert measured and block.index("--no-deps timm") < block.index(measured[0])
    assert all(line in commands(page) for line in measured)  # each parses (its own test)
    if importlib.util.find_spec("timm") is None:
        return  # the zoo is not installed here: the lines above are what the docs promise
    from convbench.planning import models

    found = models.conv_layers(models.load("timm.models:resnet50"), (1, 3, 64, 64), "timm",
                               "cpu")
    assert sum(found.occurrences.values()) >= 50


def test_code_blocks_scroll_with_a_scrollbar_one_can_see():
    """#70: the site cut code blocks at the column's edge at 1280 px: Material scrolls them,
    but its bar is 0.2rem of its lightest grey, hidden by overlay scrollbars. The site's own
    stylesheet (mkdocs.yml's `extra_css`) keeps the lines whole, scrolling, with a bar drawn
    always, thick enough to find."""
    config = (DOCS / "mkdocs.yml").read_text()
    listed = re.search(r"^extra_css:\n((?:  - .+\n)+)", config, re.MULTILINE)
    assert listed, "mkdocs.yml names no extra_css"
    names = [line.strip().removeprefix("- ") for line in listed[1].splitlines()]
    css = re.sub(r"/\*.*?\*/", "", "".join((DOCS / "pages" / n).read_text() for n in names),
                 flags=re.DOTALL)
    rules = {k.strip(): v for k, v in re.findall(r"([^{}]+)\{([^}]*)\}", css)}
    code = rules[".md-typeset pre > code"]
    assert "overflow-x: auto" in code and "scrollbar-width: auto" in code
    bar = re.search(r"height: ([\d.]+)rem", rules[".md-typeset pre > code::-webkit-scrollbar"])
    assert bar and float(bar[1]) >= 0.5
