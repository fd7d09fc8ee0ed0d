"""How convbench starts Python: the installed package, wherever the user stands.

`python -m` puts the current directory first on `sys.path`. Standing in the folder that holds a
clone named `convbench`, that folder is importable as a namespace package `convbench`, and
with an editable install (whose finder comes after the path's) it wins: a module name resolves
to the clone's folders (`convbench.results`, before the layers became folders, was the clone's
`results/` folder of run folders). `python -m convbench` mends that in
`__main__` (it drops the current directory and imports again); the worker processes convbench
starts (`train-step`, `memplan`'s probes) are started without the current directory on their
path (`-P`, Python 3.11; the same by hand on 3.10).
"""

from __future__ import annotations

import sys


def module_command(module: str, *args: str) -> list[str]:
    """The command line that runs `python -m module args...` with this interpreter, without the
    current directory on the module search path."""
    if sys.version_info >= (3, 11):
        return [sys.executable, "-P", "-m", module, *args]
    run = ("import runpy, sys; del sys.path[0]; "
           f"runpy.run_module({module!r}, run_name='__main__', alter_sys=True)")
    return [sys.executable, "-c", run, *args]
