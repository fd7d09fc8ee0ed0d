"""The CPU algorithms' workspaces on transparent huge pages (`_lowering.workspace`): zeroed,
aligned to a huge page, counted by tracemalloc like NumPy's own buffers (the harness's memory
column reads it), released when dropped, ordinary pages when switched off or small, and the
results unchanged."""

import gc
import tracemalloc

import numpy as np
import pytest

from convbench.algos import _lowering, registry
from convbench.algos._lowering import HUGE_PAGE, HUGE_PAGES_ENV, pages_note, workspace
from convbench.core.problem import ConvProblem
from convbench.testing import run_and_check

needs_thp = pytest.mark.skipif(not _lowering.huge_pages_available(),
                               reason="this kernel offers no transparent huge pages")


def _anon_huge_kib() -> int:
    with open("/proc/meminfo") as f:
        line = next(x for x in f if x.startswith("AnonHugePages:"))
    return int(line.split()[1])


@needs_thp
def test_large_workspace_is_zero_aligned_writable_and_on_huge_pages():
    before = _anon_huge_kib()
    a = workspace((3, 1000, 1000), np.float32)
    assert a.shape == (3, 1000, 1000) and a.dtype == np.float32 and a.flags.c_contiguous
    assert a.ctypes.data % HUGE_PAGE == 0
    assert not a.any()
    a[...] = 1.5
    assert float(a.sum()) == 1.5 * a.size
    # the kernel gave huge pages (others may come and go meanwhile: at least most of ours)
    assert _anon_huge_kib() - before >= 8 << 10


@needs_thp
def test_tracemalloc_counts_it_and_forgets_it_when_dropped():
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        a = workspace((4 << 20,), np.float32)  # 16 MiB
        held = tracemalloc.get_traced_memory()[0] - base
        assert 16 << 20 <= held < 17 << 20
        del a
        gc.collect()
        assert tracemalloc.get_traced_memory()[0] - base < 1 << 20
    finally:
        tracemalloc.stop()


def test_small_or_switched_off_is_ordinary_numpy(monkeypatch):
    small = workspace((10, 10), np.float64)
    assert small.base is None and not small.any()  # np.zeros' own buffer
    monkeypatch.setenv(HUGE_PAGES_ENV, "0")
    assert not _lowering.huge_pages_available()
    big = workspace((1 << 20,), np.float32)
    assert big.base is None and not big.any()
    assert pages_note(HUGE_PAGE) == "workspace on 4 KiB pages (CONVBENCH_HUGE_PAGES=0)"
    assert pages_note(HUGE_PAGE - 1) == ""


@needs_thp
@pytest.mark.parametrize("algo", ["gemm", "winograd-4x4"])
def test_rows_say_their_pages_and_results_hold_on_both(algo, monkeypatch):
    """A problem whose workspace spans huge pages: right on them and without them, and the
    row's note says which."""
    p = ConvProblem(n=4, c=64, h=30, w=30, k=64, r=3, s=3, pad=1)
    impl = registry.get(algo, "numpy")
    for setting, note in (("1", "workspace on 2 MiB huge pages"),
                          ("0", "workspace on 4 KiB pages")):
        monkeypatch.setenv(HUGE_PAGES_ENV, setting)
        assert note in impl.describe(p, "fwd", "nhwc", "fp32")
        for pass_ in ("fwd", "bwd_data", "bwd_filter"):
            chk = run_and_check(impl, p, pass_, "nhwc", "fp32", seed=3)
            assert chk.ok, (setting, pass_, chk.reason)
