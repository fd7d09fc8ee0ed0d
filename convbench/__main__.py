"""`python -m convbench`: the same as the `convbench` command."""

import sys

from .cli import main

sys.exit(main())
