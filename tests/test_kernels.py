"""convbench.kernels: reading sources, parsing entry points, checking launch arguments, and the
NVRTC compile gate (runs without a GPU)."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from convbench import kernels, registry

HERE = Path(__file__).parent / "kernels"
DIRECT_ENTRIES = {"direct_fwd", "direct_bwd_data", "direct_bwd_filter", "direct_sum_splits"}


needs_nvrtc = pytest.mark.skipif(kernels.nvrtc_available() is not None,
                                 reason=str(kernels.nvrtc_available()))
needs_emu = pytest.mark.skipif(registry.available("emu") is not None,
                               reason=str(registry.available("emu")))


def test_kernel_dir_holds_the_sources():
    assert {"direct.cu", "common.cuh"} <= {p.name for p in kernels.kernel_dir().iterdir()}


def test_includes_are_inlined_once_with_line_markers():
    code = kernels.read_source(kernels.kernel_dir() / "direct.cu")
    assert not any(ln.startswith("#include") for ln in code.splitlines())
    assert code.count("int act_offset(") == 1
    assert '#line 1 "common.cuh"' in code and '#line 1 "direct.cu"' in code


def test_entry_points_are_parsed_with_their_parameters():
    entries = kernels.entry_points(kernels.read_source(kernels.kernel_dir() / "direct.cu"))
    assert set(entries) == DIRECT_ENTRIES
    fwd = entries["direct_fwd"]
    assert [p.name for p in fwd[:4]] == ["x", "w", "y", "N"]
    assert all(p.pointer and p.dtypes == (np.dtype("float32"),) for p in fwd[:3])
    assert all(not p.pointer and p.dtypes == (np.dtype("int32"),) for p in fwd[3:])


def test_entry_points_ignore_comments_and_refuse_unknown_types():
    code = ('// extern "C" __global__ void commented(int a)\n'
            'extern "C" __global__ void f(void) {}\n')
    assert kernels.entry_points(code) == {"f": ()}
    with pytest.raises(ValueError, match="cannot pass parameter 'Foo f'"):
        kernels.entry_points('extern "C" __global__ void g(Foo f) {}')


def test_launcher_refuses_undeclared_configurations():
    registry.load()
    with pytest.raises(ValueError, match="not declared"):
        kernels.launcher("emu", "direct", {"NHWC": 0})


@needs_emu
@pytest.mark.parametrize("args, error, message", [
    ((np.zeros(4), np.zeros(4, np.float32), 2, 2), TypeError, "must be float32, got float64"),
    ((np.zeros(4, np.float32), np.zeros(4, np.float32), 2), TypeError, "takes 4 arguments"),
    ((np.zeros(4, np.float32), np.zeros(4, np.float32), 2.0, 2), TypeError, "rows"),
    ((np.zeros((2, 4), np.float32)[:, ::2], np.zeros(4, np.float32), 2, 2), ValueError,
     "C-contiguous"),
    (([0.0] * 4, np.zeros(4, np.float32), 2, 2), TypeError, "numpy array"),
    # an int beyond 32 bits raises, whether a Python int or a NumPy one (which would wrap)
    ((np.zeros(4, np.float32), np.zeros(4, np.float32), 2**31, 2), OverflowError, "outside int32"),
    ((np.zeros(4, np.float32), np.zeros(4, np.float32), np.int64(2**31), 2), OverflowError,
     "outside int32"),
])
def test_arguments_are_checked_against_the_signature(args, error, message):
    kernel = kernels.load("emu", HERE / "transpose.cu").kernel("transpose")
    with pytest.raises(error, match=message):
        kernel(1, (8, 8), args)


def test_ptxas_log_is_parsed_per_function():
    log = """\
ptxas info    : 0 bytes gmem
ptxas info    : Function properties for _Z6helperv
ptxas         .     8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads
ptxas info    : Compiling entry function 'k' for 'sm_90'
ptxas info    : Function properties for k
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 40 registers, used 1 barriers, 8320 bytes smem, 400 bytes cmem[0]
"""
    helper, k = kernels.parse_ptxas(log)
    assert (helper.kernel, helper.stack, helper.spill) == ("_Z6helperv", 8, 8)
    assert (k.kernel, k.registers, k.smem, k.spill) == ("k", 40, 8320, 0)


@needs_nvrtc
def test_gate_passes_every_declared_kernel_without_spills():
    # As a subprocess: `python -m convbench.kernels` must see the algorithm modules' declarations.
    proc = subprocess.run([sys.executable, "-m", "convbench.kernels"], capture_output=True,
                          text=True, cwd=Path(__file__).parent.parent, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    for entry in DIRECT_ENTRIES:
        for arch in kernels.GATE_ARCHS:
            for layout in ("NHWC=0", "NHWC=1"):
                assert any(entry in ln and arch in ln and layout in ln and ln.endswith(" ok")
                           for ln in lines), (entry, arch, layout)


def test_every_kernel_file_has_declared_configurations():
    jobs, undeclared = kernels.declared_jobs()
    assert undeclared == []
    assert {path.name for path, _ in jobs} >= {"direct.cu"}


def test_a_kernel_file_without_configurations_is_reported(tmp_path, monkeypatch):
    (tmp_path / "orphan.cu").write_text("")
    monkeypatch.setattr(kernels, "kernel_dir", lambda: tmp_path)
    assert kernels.declared_jobs()[1] == ["orphan.cu"]


@needs_nvrtc
def test_gate_fails_on_spills(capsys):
    assert kernels.main([str(HERE / "spills.cu")]) == 1
    out = capsys.readouterr().out
    assert "SPILL" in out and "sm_80" in out and "sm_90" in out


@needs_nvrtc
def test_gate_fails_on_compile_errors(tmp_path, capsys):
    bad = tmp_path / "bad.cu"
    bad.write_text('extern "C" __global__ void bad(float* x) { x[0] = nope; }\n')
    assert kernels.main([str(bad), "--arch", "sm_90"]) == 1
    captured = capsys.readouterr()
    assert 'compile error: bad.cu(1): error: identifier "nope" is undefined' in captured.out
    assert "1 error detected" in captured.err
