"""The README's commands, so that it cannot drift from the code.

Its fenced code blocks are read (the helpers here read the documentation pages the same way,
tests/test_docs.py):

- every `convbench ...` command in a `console` block (also `python -m convbench ...`, `torchrun
  ... -m convbench ...`, and the `BENCH_ARGS`/`CHECK_ARGS` of a `make` line) is parsed by the
  command line's own parser: an option the code no longer has fails here;
- an example `$ convbench ...` is run (in a folder of its own, with a plan store of its own),
  after the files its `$ cat FILE` lines show; what the page shows under it must be what it
  prints: each table's header, each `convbench:` line (numbers and paths aside; warnings of a
  busy machine aside), an error line word for word (and then exit code 2, else 0);
- a `python` block is run, and the tables' headers of the `text` block after it must be in
  what it prints;
- every relative link points to a file of the repository.
"""

from __future__ import annotations

import itertools
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from test_cli import run_cli

from convbench import cli

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"


def committed_runs(repo: Path = REPO) -> list[Path]:
    """The committed run folders: those under `repo`'s results/ that git tracks a file of, so
    a run a user left there uncommitted (`--out results/...`) is not read as a finding; where
    `repo` is no git checkout (an unpacked sdist), every folder there."""
    results_dir = repo / "results"
    try:
        proc = subprocess.run(["git", "-C", str(repo), "ls-files", "-z", "--", "results"],
                              capture_output=True, text=True, timeout=60, check=True)
    except (OSError, subprocess.SubprocessError):
        return sorted(p for p in results_dir.iterdir() if p.is_dir())
    tracked = {Path(f).parts[1] for f in proc.stdout.split("\0") if f.count("/") >= 2}
    return sorted(results_dir / name for name in tracked if (results_dir / name).is_dir())
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.DOTALL | re.MULTILINE)
#: A markdown link or image: [text](target) or ![alt](target).
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
#: Wildcards for what differs from run to run in a `convbench:` line: numbers and paths.
NUMBER = re.compile(r"\d[\d.,]*")
PATH = re.compile(r"\S*/\S*")


def blocks(page: Path = README, kind: str | None = None) -> list[tuple[str, str]]:
    """(kind, body) of each fenced block of a markdown page, `kind` only where given."""
    return [(k, body) for k, body in FENCE.findall(page.read_text())
            if kind is None or k == kind]


def _strip_comment(line: str) -> str:
    return re.split(r"\s{2,}#", line)[0].strip()


def convbench_argv(line: str) -> list[str] | None:
    """The arguments a command line on a page gives `convbench`, or None if it runs no
    convbench command."""
    words = shlex.split(_strip_comment(line.removeprefix("$ ")).split(" | ")[0])
    while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):  # PYTHONPATH=. convbench ...
        words = words[1:]
    if not words:
        return None
    if words[0] == "make":
        for word in words[1:]:
            name, _, value = word.partition("=")
            if name in ("BENCH_ARGS", "CHECK_ARGS"):
                return [{"BENCH_ARGS": "bench", "CHECK_ARGS": "gpu-check"}[name],
                        *shlex.split(value)]
        return None
    if Path(words[0]).name == "convbench":  # convbench, .venv/bin/convbench
        return words[1:]
    if "-m" in words and words[words.index("-m") + 1:][:1] == ["convbench"]:
        return words[words.index("-m") + 2:]
    return None


def commands(page: Path = README) -> list[str]:
    """Every convbench command line of a page's console blocks (of an example block, only its
    `$ ` lines: the rest is output)."""
    out = []
    for _, body in blocks(page, "console"):
        lines = body.splitlines()
        if any(line.startswith("$ ") for line in lines):  # an example: its output is no command
            lines = [line for line in lines if line.startswith("$ ")]
        out += [line for line in lines if convbench_argv(line) is not None]
    return out


def check_parses(line: str, where: str) -> None:
    """Fails the test where `line` (a page's command) does not parse."""
    argv = convbench_argv(line)
    if argv[:1] == ["kernels"]:  # the compile gate parses its own arguments
        return
    try:
        cli.build_parser().parse_args(argv)
    except SystemExit as exc:  # --help and --version end here, with 0
        if exc.code:
            pytest.fail(f"{where}: `{line}` does not parse (exit {exc.code})")


def examples(page: Path = README) -> list[tuple[dict[str, str], str, list[str]]]:
    """Per `$ convbench` example of a page: (the files the block's `$ cat` lines showed before
    it, the command, the lines shown under it)."""
    out = []
    for _, body in blocks(page, "console"):
        files: dict[str, str] = {}
        current, shown = None, []
        for line in [*body.splitlines(), "$ end"]:
            if not line.startswith("$ "):
                shown.append(line)
                continue
            if current is not None:
                words = shlex.split(current)
                if words[0] == "cat":
                    files[words[1]] = "\n".join(shown) + "\n"
                elif convbench_argv(current) is not None:
                    out.append((dict(files), current, shown))
            current, shown = line[2:], []
    return out


def _headers(shown: list[str]) -> list[str]:
    """The header lines of the tables shown: a `|` line followed by a `|---` line."""
    return [" ".join(a.split()) for a, b in itertools.pairwise(shown)
            if a.startswith("|") and b.startswith("|-")]


def _pattern(line: str) -> re.Pattern:
    parts = re.split(r"(\d[\d.,]*|\S*/\S*)", line)
    return re.compile("".join(r"\S+" if PATH.fullmatch(p) or NUMBER.fullmatch(p)
                              else re.escape(p) for p in parts if p))


def check_example(files: dict[str, str], command: str, shown: list[str], where: str,
                  folder: Path, monkeypatch, capsys) -> None:
    """Runs a page's `$ convbench` example in `folder` after writing the files it showed, and
    fails the test where it no longer prints what the page shows."""
    monkeypatch.chdir(folder)
    monkeypatch.setenv("CONVBENCH_PLAN_DIR", str(folder / "plans"))
    for name, text in files.items():
        (folder / name).write_text(text)
    monkeypatch.setattr(sys, "path", list(sys.path))  # --model appends the current folder
    code, out, err = run_cli(capsys, *convbench_argv(command))
    errors = [line for line in shown if line.startswith("convbench: error:")]
    if errors:
        assert code == 2, err
        assert err.strip().splitlines() == errors
        return
    assert code == 0, err
    printed = {" ".join(line.split()) for line in out.splitlines()}
    for header in _headers(shown):
        assert header in printed, f"{where}: `{command}` no longer prints {header!r}"
    said = err.splitlines() + out.splitlines()
    for line in shown:  # a warning about a busy machine depends on the machine's load
        if line.startswith("convbench: ") and not line.startswith("convbench: warning:"):
            assert any(_pattern(line).fullmatch(s) for s in said), \
                f"{where}: `{command}` no longer says {line!r}"


def python_examples(page: Path = README) -> list[tuple[str, list[str]]]:
    """Per `python` block of a page: (its code, the lines of the `text` block after it)."""
    found = FENCE.findall(page.read_text())
    return [(body, found[i + 1][1].splitlines() if i + 1 < len(found)
             and found[i + 1][0] == "text" else [])
            for i, (kind, body) in enumerate(found) if kind == "python"]


def broken_links(page: Path) -> list[str]:
    """The relative links of a page (outside its code blocks) whose file is not there."""
    text = FENCE.sub("", page.read_text())
    out = []
    for target in LINK.findall(text):
        path = target.split("#")[0]
        if not path or re.match(r"[a-z]+:", path):  # an anchor, or https:, mailto:
            continue
        if not (page.parent / path).exists():
            out.append(target)
    return out


# --- the README ------------------------------------------------------------------------------
def test_the_readme_has_commands_and_examples():
    """One tested example for each way to use it: the command line, a problem file, Python."""
    assert len(commands()) >= 5
    assert len(examples()) >= 2
    assert python_examples()


def test_the_readme_is_a_front_door():
    """Short, and it says what convbench is, how to run it and what it found, in that order."""
    text = README.read_text()
    assert len(text.splitlines()) <= 260
    first_screen = "\n".join(text.splitlines()[:60])
    assert "make bench" in first_screen and "make test" in first_screen
    assert "results/" in first_screen  # the headline result's run folder


def test_every_readme_link_works():
    assert broken_links(README) == []


@pytest.mark.parametrize("line", commands())
def test_every_command_parses(line):
    check_parses(line, "README")


@pytest.mark.parametrize("files, command, shown", examples(),
                         ids=lambda v: v if isinstance(v, str) else "")
def test_every_example_prints_what_the_readme_shows(files, command, shown, tmp_path,
                                                    monkeypatch, capsys):
    check_example(files, command, shown, "README", tmp_path, monkeypatch, capsys)


@pytest.mark.parametrize("code, shown", python_examples())
def test_the_python_example_runs_as_shown(code, shown, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CONVBENCH_PLAN_DIR", str(tmp_path / "plans"))
    exec(compile(code, str(README), "exec"), {"__name__": "readme"})  # noqa: S102 - our README
    printed = {" ".join(line.split()) for line in capsys.readouterr().out.splitlines()}
    for header in _headers(shown):
        assert header in printed, f"README's python example no longer prints {header!r}"


def _headline(text: str) -> tuple[str, dict[str, list[str]]]:
    """The README's headline table: its run folder (the first linked after it) and its rows
    by their first cell."""
    start = text.index("| best own / torch-cpu [95% interval]")
    lines = text[start:].split("\n\n")[0].splitlines()
    folder = re.search(r"\(results/([^/)]+)/report\.md\)", text[start:])[1]
    return folder, {c[0]: c[1:] for c in ([x.strip() for x in line.strip("|").split("|")]
                                           for line in lines)}


def test_the_headline_table_is_its_run_s_report_section():
    """#45: the README's headline table (best own against torch-cpu per layer and pass) is what
    its run's report now says in "Best of ours against torch": the same ratios and intervals,
    and the same algorithms named."""
    from convbench.analysis import speedup
    from convbench.analysis.report import tables
    from convbench.core import results

    folder, readme = _headline(README.read_text())
    df, _ = results.load_run(REPO / "results" / folder)
    section = tables.torch_table(speedup.against_torch(df), wide=True)
    assert readme["best own / torch-cpu [95% interval]"] == list(section.columns)
    for pass_ in ("fwd", "bwd_data", "bwd_filter"):
        assert readme[pass_] == list(section.loc[pass_]), pass_
    named = [cell.split()[0] for cell in section.loc["fwd: best own"]]
    assert readme["fwd: best own algorithm"] == named
