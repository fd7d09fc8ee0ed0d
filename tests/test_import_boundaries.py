"""The house is one-way (docs/pages/design.md §1): every import points down the layers, nothing
imports the command line, advice never reaches the timers, and the import graph has no circle.

Two ways of looking, as cudnn-frontend's `test_import_boundaries.py` looks at its package:

- statically: every `import` statement of every module, at the top or inside a function (a
  lazy import is still an import), resolved to the convbench module it names;
- in a fresh interpreter: importing the modules of a layer must not load a module of a higher
  one (this also sees what `importlib` loads).

The one deliberate exception is the registry's discovery of `algos/` (`registry.load`
imports every algorithm module, and each registers itself with the registry).

`test_the_checks_bite` adds forbidden imports to a copy of the package and shows each check
catch them.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import convbench

PACKAGE = Path(convbench.__file__).parent

#: The layers of docs/pages/design.md §1, bottom up, one entry per folder ("name/": the folder and
#: all in it) or top-level module. A module imports only from its own layer or below.
LAYERS = {
    "core": ["convbench", "core/", "catalogs/", "machine/", "tools", "tools.convert_convset"],
    "implementations": ["algos/", "cuda/", "functional"],
    "harness": ["measure/", "testing"],
    "analysis": ["analysis/"],
    "runs": ["runs/", "tools.phases_bench", "tools.profile_pass"],
    "planning": ["planning/", "nn", "advisor", "tools.inplace_bench"],
    "studies": ["studies/"],
    "cli": ["cli/", "__main__"],
}
#: The training-step studies (docs/pages/design.md §1, layer 7).
STUDIES = ("trainstep", "memprofile", "memplan", "scale")
#: Each study's modules: itself and, where its output stands apart, `<study>_report`.
STUDY_MODULES = {s: [f"studies.{s}", *([f"studies.{s}_report"] if (
    PACKAGE / "studies" / f"{s}_report.py").exists() else [])] for s in STUDIES}
#: What a module must not reach, directly or through others, though its layer would allow it.
FORBIDDEN = {
    # advice never times
    "planning.advice": ["measure.timing", "measure.runner", "runs", "planning.tune"],
    # the layout DP is arithmetic on measured times
    "planning.layoutplan": ["measure.timing", "measure.runner"],
    "measure.timing": ["algos"],  # timing never knows which algorithm it times
    # the studies stand side by side on the workload: none stands on another
    **{m: [o for other in STUDIES if other != s for o in STUDY_MODULES[other]]
       for s in STUDIES for m in STUDY_MODULES[s]},
}
#: The registry's deliberate discovery of the algorithm modules.
DISCOVERY = ("convbench.algos.registry", "convbench.algos")


# --- the static graph -----------------------------------------------------------------------
def modules(root: Path) -> dict[str, Path]:
    """Every module of the package at `root`: dotted name -> file."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The convbench modules `name`'s import statements name, wherever they stand."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(base + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:  # `from . import x` names module x; `from .m import f`, m
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
    return {m for m in found if m in known and m != name}


def graph(root: Path) -> dict[str, set[str]]:
    """module -> the modules it imports, less the registry's discovery of algos/ (its import
    of the package, through which it imports every module in it)."""
    mods = modules(root)
    known = set(mods)
    edges = {name: imports(name, path, known) for name, path in mods.items()}
    edges[DISCOVERY[0]] = {m for m in edges[DISCOVERY[0]] if m != DISCOVERY[1]}
    return edges


def layer_of(name: str) -> int:
    """The index in LAYERS of a dotted module name; KeyError for a module no layer holds."""
    short = name.removeprefix("convbench.") if name != "convbench" else name
    for i, members in enumerate(LAYERS.values()):
        for m in members:
            folder = m[:-1] if m.endswith("/") else None
            if short == m or (folder and (short == folder or short.startswith(folder + "."))):
                return i
    raise KeyError(name)


def upward_imports(edges: dict[str, set[str]]) -> list[str]:
    """Each import from a lower layer to a higher one, and each module no layer holds."""
    problems = []
    for name, targets in sorted(edges.items()):
        try:
            own = layer_of(name)
        except KeyError:
            problems.append(f"{name} is in no layer: add it to LAYERS")
            continue
        problems += [f"{name} ({list(LAYERS)[own]}) imports {t} ({list(LAYERS)[layer_of(t)]})"
                     for t in sorted(targets) if t in edges and layer_of(t) > own]
    return problems


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The import circles: strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def reach(edges: dict[str, set[str]], start: str) -> set[str]:
    """Every module `start` imports, directly or through others."""
    seen, todo = set(), [start]
    while todo:
        for t in edges.get(todo.pop(), ()):
            if t not in seen:
                seen.add(t)
                todo.append(t)
    return seen


def forbidden_reach(edges: dict[str, set[str]]) -> list[str]:
    problems = []
    for name, banned in FORBIDDEN.items():
        reached = reach(edges, f"convbench.{name}")
        problems += [f"convbench.{name} reaches convbench.{b}" for b in banned
                     if f"convbench.{b}" in reached
                     or any(r.startswith(f"convbench.{b}.") for r in reached)]
    return problems


# --- fresh interpreters ---------------------------------------------------------------------
def fresh_import(root: Path, names: list[str]) -> set[str]:
    """The convbench modules a fresh interpreter, seeing the package at `root`, has loaded after
    importing `names`."""
    code = ("import importlib, sys\n"
            f"for name in {names!r}:\n"
            "    importlib.import_module(name)\n"
            "print(sys.modules['convbench'].__file__)\n"
            "print('\\n'.join(m for m in sys.modules if m.split('.')[0] == 'convbench'))\n")
    env = {**os.environ, "PYTHONPATH": str(root.parent)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, cwd=root.parent, check=False, timeout=300)
    assert proc.returncode == 0, proc.stderr
    where, *loaded = proc.stdout.split()
    assert Path(where).parent == root, f"imported {where}, not the package at {root}"
    return set(loaded)


def _placed(name: str) -> int:
    """`layer_of`, with a module no layer holds above them all (`upward_imports` names it)."""
    try:
        return layer_of(name)
    except KeyError:
        return len(LAYERS)


def loaded_above(root: Path, layer: int) -> list[str]:
    """The modules above LAYERS' `layer` that importing every module of that layer and below
    loads."""
    names = [n for n in modules(root) if _placed(n) <= layer]
    return sorted(m for m in fresh_import(root, names) if _placed(m) > layer)


def fresh_advice_loads(root: Path) -> list[str]:
    """The modules advice must not reach that `import convbench.planning.advice` loads."""
    banned = {f"convbench.{b}" for b in FORBIDDEN["planning.advice"]}
    return sorted(fresh_import(root, ["convbench.planning.advice"]) & banned)


# --- the tests ------------------------------------------------------------------------------
def test_every_module_has_a_layer_and_imports_point_down():
    edges = graph(PACKAGE)
    assert upward_imports(edges) == []


def test_nothing_outside_the_cli_imports_it():
    edges = graph(PACKAGE)
    cli = layer_of("convbench.cli")
    assert [n for n, targets in edges.items() if layer_of(n) != cli
            and any(layer_of(t) == cli for t in targets)] == []


def test_the_import_graph_has_no_circle():
    assert circles(graph(PACKAGE)) == []


def test_advice_never_reaches_the_timers():
    assert forbidden_reach(graph(PACKAGE)) == []


@pytest.mark.parametrize("layer", range(len(LAYERS) - 1), ids=list(LAYERS)[:-1])
def test_a_fresh_interpreter_loads_nothing_above_the_layer(layer):
    assert loaded_above(PACKAGE, layer) == []
    if list(LAYERS)[layer] == "planning":
        assert fresh_advice_loads(PACKAGE) == []


def folder_circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Per folder of the package, the circles among what stands in it, each subfolder taken as
    one room (its modules' imports together): a module beside a folder that imports the
    folder's parts while the folder imports it is such a circle."""
    def room(folder: str, m: str) -> str | None:
        """What `m` is in `folder`: itself, the subfolder holding it, or None (outside)."""
        if not m.startswith(folder + "."):
            return None
        return folder + "." + m[len(folder) + 1:].split(".")[0]

    packages = {m for m in edges if any(o.startswith(m + ".") for o in edges)}
    out = []
    for folder in sorted(packages):
        rooms: dict[str, set[str]] = {}
        for m, targets in edges.items():
            a = room(folder, m)
            if a is not None:
                rooms.setdefault(a, set()).update(
                    b for b in (room(folder, t) for t in targets) if b not in (None, a))
        out += circles(rooms)
    return out


def test_a_folder_and_what_stands_beside_it_import_no_circle():
    """A folder reads as one room: nothing beside it both imports its parts and is imported
    by them (the batch sweep's report, once a module beside report/, is a part of it)."""
    edges = graph(PACKAGE)
    assert folder_circles(edges) == []
    edges["convbench.analysis.report.cells"] = {*edges["convbench.analysis.report.cells"],
                                                "convbench.analysis.compare"}
    edges["convbench.analysis.compare"] = {*edges["convbench.analysis.compare"],
                                           "convbench.analysis.report.tables"}
    assert ["convbench.analysis.compare", "convbench.analysis.report"] in folder_circles(edges)


def test_the_harness_stands_on_the_registry_not_on_the_public_face():
    """`functional` is a public face at the top of the implementations layer; the harness takes
    the contract (`UnsupportedError` and the rest) from the registry, so no module of measure/
    waits on that face and the house keeps a floor fewer."""
    edges = graph(PACKAGE)
    harness = [m for m in edges if m.startswith("convbench.measure.")]
    assert harness and [m for m in harness if "convbench.functional" in reach(edges, m)] == []


def test_a_study_folder_takes_its_file_names_from_the_results_schema():
    """Every folder's file names (report.md, env.json, the CSV) are the results schema's
    (`core.results`): a study writing its folder needs no part of the run report's code."""
    edges = graph(PACKAGE)
    assert [m for m in reach(edges, "convbench.studies.folder")
            if m.startswith("convbench.analysis")] == []


def test_the_studies_stand_side_by_side():
    """No study reaches another, and the check sees one stacked on another."""
    edges = graph(PACKAGE)
    assert [p for p in forbidden_reach(edges) if ".studies." in p] == []
    edges["convbench.studies.memplan"] = {*edges["convbench.studies.memplan"],
                                          "convbench.studies.memprofile"}
    assert forbidden_reach(edges) == [
        "convbench.studies.memplan reaches convbench.studies.memprofile",
        "convbench.studies.memplan_report reaches convbench.studies.memprofile"]


def test_the_checks_bite(tmp_path):
    """A copy of the package with forbidden imports added: each check reports them."""
    root = tmp_path / "convbench"
    shutil.copytree(PACKAGE, root, ignore=shutil.ignore_patterns("__pycache__", "_kernels"))

    def add(module: str, text: str) -> None:
        path = root / f"{module}.py"
        path.write_text(path.read_text() + text)

    add("planning/advice", "\nfrom ..measure import runner  # advice that times\n\n\n"
                           "def _usage():\n"
                           "    from ..cli import UsageError  # lazy, but an import all the same\n"
                           "    return UsageError\n")
    add("core/results", "\n\ndef _runs():\n    from .. import runs  # runs imports results\n"
                        "    return runs\n")
    add("measure/timing", "\nfrom ..analysis import report  # a timer that knows what it times\n")
    edges = graph(root)
    assert upward_imports(edges) == [
        "convbench.core.results (core) imports convbench.runs (runs)",
        "convbench.measure.timing (harness) imports convbench.analysis.report (analysis)",
        "convbench.planning.advice (planning) imports convbench.cli (cli)"]
    assert any({"convbench.core.results", "convbench.runs"} <= set(c) for c in circles(edges))
    # (the circle results -> runs -> ... makes every study reach the others too: left out)
    assert [p for p in forbidden_reach(edges) if ".studies." not in p] == [
        *(f"convbench.planning.advice reaches convbench.{m}"
          for m in FORBIDDEN["planning.advice"]),
        "convbench.measure.timing reaches convbench.algos"]  # report -> registry
    assert "convbench.analysis.report" in loaded_above(root, list(LAYERS).index("harness"))
    assert fresh_advice_loads(root) == ["convbench.measure.runner", "convbench.measure.timing"]
    (root / "stray.py").write_text('"""A module placed in no layer."""\n')
    assert "convbench.stray is in no layer: add it to LAYERS" in upward_imports(graph(root))
