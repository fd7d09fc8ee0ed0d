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

import signal
import subprocess
import sys
from pathlib import Path

#: The folder holding the convbench package this process runs.
ROOT = str(Path(__file__).resolve().parents[2])


def module_command(module: str, *args: str) -> list[str]:
    """The command line that runs `python -m module args...` with this interpreter, without the
    current directory on the module search path, and with this process's convbench: where it
    was imported from a checkout that is not installed (`python3 -m convbench` in a clone, as on
    a GPU machine without a package registry), that checkout's folder goes first on the child's
    path, since without the current directory the child would not find it (the first GPU
    train-step's tuning process died so: No module named 'convbench'). The child takes Ctrl-C
    as KeyboardInterrupt even where this process ignores SIGINT (a script's background job, a
    test worker) and it inherits that: `wait_or_interrupt` stops it so."""
    run = ("import signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
           f"import runpy, sys; root = {ROOT!r}; "
           "root in sys.path or sys.path.insert(0, root); "
           f"runpy.run_module({module!r}, run_name='__main__', alter_sys=True)")
    if sys.version_info >= (3, 11):
        return [sys.executable, "-P", "-c", run, *args]
    return [sys.executable, "-c", "import sys; del sys.path[0]; " + run, *args]


def wait_or_interrupt(proc: subprocess.Popen, timeout_s: float | None, grace_s: float) -> bool:
    """Wait for `proc`; at `timeout_s` (None: never) send it SIGINT, as Ctrl-C does, so it can
    save and summarise what it has, and kill it if it has not ended `grace_s` later. Whether
    the timeout came."""
    try:
        proc.wait(timeout=timeout_s)
        return False
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        return True


if __name__ == "__main__":  # which convbench a worker process imports (tests/test_newcomer.py)
    print(Path(__file__).resolve().parents[1])
