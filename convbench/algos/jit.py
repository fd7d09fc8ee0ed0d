"""What the compiled CPU kernels (`depthwise_jit`, `grouped_jit`) share: whether Numba is here,
Numba's options, their templates rendered into modules and loaded from the user cache (so Numba
caches their machine code on disk), the thread count, and a compile outside any timed call.

The kernels are Python in `algos/templates/<name>.py.tmpl`, specialised per shape by
`string.Template` placeholders: `${S}` or `${terms}` inside a line (a constant, a sum of S
taps), and a line that is only `${name}` for generated lines (S views, a block of unrolled
taps) that take that line's indentation. A reviewer reads a template beside the module it
makes (`folder()`, named by the module's hash).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import re
import string
import sys
import tempfile
from pathlib import Path

import numpy as np

from ..machine import host, threads

#: Numba's options, the one spelling: every kernel compiles with fastmath (its sums may be
#: reordered, within each algorithm's tolerance), on disk (`cache`) and without the GIL; a
#: kernel with `prange` loops adds `parallel`. Rendered into each generated module's header, so
#: a change here changes its hash (`load`) and never meets an old cache.
SERIAL = dict(fastmath=True, cache=True, nogil=True)
PARALLEL = dict(SERIAL, parallel=True)
#: A parallel kernel compiled in each process, not read from the disk cache: Numba's parallel
#: code loaded from its cache is optimised otherwise than compiled fresh (numba issues #8085,
#: #10617), and depthwise's nhwc kernels ran slower so (measured: docs/pages/changes.md).
#: Those kernels were never cached before the templates (closures), and compile in `prepare`,
#: never in a timed call.
PARALLEL_FRESH = dict(PARALLEL, cache=False)

#: Where the kernels' templates are.
TEMPLATES = Path(__file__).with_name("templates")

#: A line that is only a placeholder: its name and the indentation its lines take.
_LINE = re.compile(r"(?P<indent>[ ]*)\$\{?(?P<name>[A-Za-z_]\w*)\}?\n?")


@functools.lru_cache(maxsize=1)
def available() -> str | None:
    """None where Numba compiles here, else why not (one line): `direct` then runs its
    depthwise layers by taps over views and its grouped ones by products, and says so.
    `CONVBENCH_JIT=off` asks for that."""
    if os.environ.get("CONVBENCH_JIT") == "off":
        return "CONVBENCH_JIT=off"
    try:
        import numba  # noqa: F401
    except ImportError as exc:  # not installed, or its LLVM does not load
        return f"numba is not importable ({exc})"
    return None


def folder() -> Path:
    """Where the generated modules (and Numba's cache of them) live."""
    return host.user_cache() / "numba"


def template(name: str) -> str:
    """The text of `templates/<name>.py.tmpl`."""
    return (TEMPLATES / f"{name}.py.tmpl").read_text()


def render(text: str, lines: dict[str, list[str]] | None = None, **values) -> str:
    """`text` with each line that is only `${name}` replaced by `lines[name]`, indented as that
    line is, and the placeholders inside the other lines by `values` (every one must be
    given; a comment line is copied as it is). A name in `lines` that the text never places is an error: nothing is dropped."""
    lines = lines or {}
    out, placed = [], set()
    for line in text.splitlines(keepends=True):
        whole = _LINE.fullmatch(line)
        if whole and whole["name"] in lines:
            placed.add(whole["name"])
            out += [f"{whole['indent']}{generated}\n" for generated in lines[whole["name"]]]
        elif line.lstrip().startswith("#"):  # a comment may name the placeholders
            out.append(line)
        else:
            out.append(string.Template(line).substitute(values))
    if set(lines) - placed:
        raise ValueError(f"lines never placed: {sorted(set(lines) - placed)}")
    return "".join(out)


def source(names: list[str], what: str, lines: dict[str, list[str]] | None = None,
           **values) -> str:
    """The module of templates `names` rendered for one shape (`what` says which, in its
    docstring), after the header that imports Numba and spells its options."""
    header = render(template("header"), names=", ".join(f"{n}.py.tmpl" for n in names),
                    what=what, SERIAL=repr(SERIAL), PARALLEL=repr(PARALLEL),
                    PARALLEL_FRESH=repr(PARALLEL_FRESH))
    return header + render("\n\n".join(template(n) for n in names), lines, **values)


def load(stem: str, source: str):
    """The module of `source`, written once to `folder()` as `<stem>_<hash>.py` and imported
    from there: Numba caches a function's machine code beside its file, and the hash in the
    name keeps a changed generator from meeting an old cache. An unwritable cache folder: a
    private temporary one (compiled every run)."""
    digest = hashlib.sha256(source.encode()).hexdigest()[:12]
    name = f"{stem}_{digest}"
    path = folder() / f"{name}.py"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists() or path.read_text() != source:
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(source)
            os.replace(tmp, path)
    except OSError:
        path = Path(tempfile.mkdtemp(prefix="convbench-jit-")) / f"{name}.py"
        path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def set_threads() -> None:
    """Numba's threads for the next call: the run's count (`threads.count()`)."""
    import numba

    numba.set_num_threads(max(1, min(threads.count(), numba.config.NUMBA_NUM_THREADS)))


_pool_started = False


def compile_empty(kernel, dtype, *arrays, ints: int) -> None:
    """Compile `kernel` for arrays of these ranks ((kind, rank): "w" the working precision,
    "d" float64) and `ints` integers, by a call on empty arrays: the compile (a second or two,
    the first time on a machine) happens in `prepare`, never inside a timed call.

    The process's first such call starts Numba's thread pool. Its OpenMP layer (the one it
    picks here) shares the process's GNU OpenMP runtime with torch, and starting the pool sets
    OpenMP's thread count to every core: a one-thread run's torch-cpu rows then ran on two
    threads (measured, and failed by the ceiling guard). So every pool is put back on the run's
    count then (`threads.reapply`). Numba's own pool (`workqueue`) would leave OpenMP alone
    but costs about a hundred times OpenMP's launch, a tenth of a small layer's time
    (docs/pages/cpu-algorithms.md)."""
    empty = [np.zeros((0,) * rank, dtype if kind == "w" else np.float64) for kind, rank in arrays]
    set_threads()
    kernel(*empty, *([1] * ints))
    global _pool_started
    if not _pool_started:  # that call started Numba's pool: see above
        _pool_started = True
        threads.reapply()
