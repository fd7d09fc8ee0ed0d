"""OpenBLAS's core type chosen by measurement (#36): a probe's faster core type is kept for this
CPU and NumPy and set before NumPy loads; the environment's own setting wins."""

import json
import os
import subprocess
import sys

import pytest

from convbench.machine import coretype, threads

#: Where the machine names a core type itself (an older OpenBLAS crashes on its own choice
#: there), the tests leave it be: convbench does too.
pytestmark = pytest.mark.skipif(bool(os.environ.get(coretype.ENV)),
                                reason=f"this machine sets {coretype.ENV} itself")

PROBE = {"current": "Haswell", "fastest": "SkylakeX", "n": 64, "threads": 1,
         "results": {"Haswell": {"gflops": 90.0, "reported": "Haswell", "took": True},
                     "SkylakeX": {"gflops": 180.0, "reported": "SkylakeX", "took": True}}}


def test_a_faster_core_type_is_kept_and_set_where_the_environment_names_none(tmp_path,
                                                                            monkeypatch):
    monkeypatch.setenv("CONVBENCH_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(coretype.ENV, raising=False)
    assert coretype.apply() is None and coretype.ENV not in os.environ  # nothing recorded
    assert coretype.record(PROBE) == "SkylakeX"
    assert coretype.apply() == "SkylakeX" and os.environ[coretype.ENV] == "SkylakeX"
    monkeypatch.setenv(coretype.ENV, "Haswell")  # the machine's own: left as it is
    assert coretype.apply() is None and os.environ[coretype.ENV] == "Haswell"


def test_nothing_is_set_where_openblas_chose_best_or_the_record_is_another_machines(
        tmp_path, monkeypatch):
    monkeypatch.setenv("CONVBENCH_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(coretype.ENV, raising=False)
    assert coretype.record({**PROBE, "current": "SkylakeX"}) is None
    assert coretype.apply() is None
    coretype.record(PROBE)
    path = tmp_path / coretype.RECORD
    path.write_text(json.dumps({**json.loads(path.read_text()), "numpy": "0.0.1"}))
    assert coretype.recorded() is None  # another NumPy: measure again
    path.write_text("not json")
    assert coretype.recorded() is None


def test_the_command_sets_it_before_numpy_loads(tmp_path):
    """The command's import sets the recorded core type before NumPy is imported (OpenBLAS
    reads it then). The one recorded is the core type OpenBLAS runs here already: a test never
    puts this machine's OpenBLAS on another (test_ceilings says why)."""
    current = threads.numpy_blas_pool().get("architecture")
    if not current:
        pytest.skip("NumPy's BLAS reports no core type (not OpenBLAS, or no threadpoolctl)")
    env = {**{k: v for k, v in os.environ.items() if k != coretype.ENV},
           "CONVBENCH_CACHE_DIR": str(tmp_path)}
    (tmp_path / coretype.RECORD).write_text(json.dumps({**coretype._key(), "coretype": current}))
    code = ("import importlib.abc, os, sys\n"
            "seen = []\n"
            "class Watch(importlib.abc.MetaPathFinder):\n"
            "    def find_spec(self, name, path, target=None):\n"
            "        if name == 'numpy' and not seen:\n"
            f"            seen.append(os.environ.get({coretype.ENV!r}))\n"
            "sys.meta_path.insert(0, Watch())\n"
            "import convbench.cli, numpy\n"
            "print(seen[0])")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == current
