"""`python -m convbench`: the same as the `convbench` command.

Run from the folder that holds a clone named `convbench`, `python -m` may have imported that folder
as a namespace package (see `convbench.machine.launch`): then the current directory leaves the path
and the package is imported again, so the installed one runs.
"""

import os
import sys

if getattr(sys.modules.get("convbench"), "__file__", None) is None:  # a folder, not the package
    here = {"", ".", os.getcwd()}
    sys.path[:] = [p for p in sys.path if p not in here]
    for name in [m for m in sys.modules if m == "convbench" or m.startswith("convbench.")]:
        del sys.modules[name]

from convbench.cli import main

sys.exit(main())
