"""convbench.cuda.kernels: reading sources, parsing entry points, checking launch arguments, and the
NVRTC compile gate (runs without a GPU)."""

import dataclasses
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from convbench.algos import kernel_base, registry
from convbench.cli import kernels as cli_kernels
from convbench.core.problem import ConvProblem
from convbench.cuda import emu, gate, kernels
from convbench.machine import backends

HERE = Path(__file__).parent / "kernels"
DIRECT_ENTRIES = {"direct_fwd", "direct_bwd_data", "direct_bwd_filter", "direct_sum_splits"}


needs_nvrtc = pytest.mark.skipif(kernels.nvrtc_available() is not None,
                                 reason=str(kernels.nvrtc_available()))
needs_emu = pytest.mark.skipif(backends.available("emu") is not None,
                               reason=str(backends.available("emu")))


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


def test_a_bound_launch_converts_its_scalars_once(monkeypatch):
    """`bind` converts grid, block and the trailing scalars when the pass is prepared; a timed
    call checks only its arrays, and still refuses a wrong one."""
    params = kernels.entry_points(kernels.read_source(HERE / "transpose.cu"))["transpose"]
    launched = []
    kernel = kernels.Kernel("transpose", params, np, lambda *a: launched.append(a))
    converted = []
    real = kernels._convert
    monkeypatch.setattr(kernels, "_convert",
                        lambda name, p, v, xp: converted.append(p.name) or real(name, p, v, xp))
    bound = kernel.bind(1, (8, 8), (2, 3))
    assert converted == ["rows", "cols"]
    a, b = np.zeros(6, np.float32), np.zeros(6, np.float32)
    converted.clear()
    bound(a, b)
    assert converted == ["in", "out"]  # the arrays only
    grid, block, values, smem = launched[0]
    assert (grid, block, smem) == ((1, 1, 1), (8, 8, 1), 0)
    assert values[:2] == (a, b) and values[2:] == (np.int32(2), np.int32(3))
    with pytest.raises(TypeError, match="must be float32, got float64"):
        bound(np.zeros(6), b)
    with pytest.raises(TypeError, match="takes 2 arrays"):
        bound(a)
    with pytest.raises(TypeError, match="bind takes the trailing scalars"):
        kernel.bind(1, 1, (a, 2, 3))


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
    helper, k = gate.parse_ptxas(log)
    assert (helper.kernel, helper.stack, helper.spill) == ("_Z6helperv", 8, 8)
    assert (k.kernel, k.registers, k.smem, k.spill) == ("k", 40, 8320, 0)


@needs_nvrtc
def test_gate_passes_every_declared_kernel_without_spills():
    # As a user runs it, in a process of its own: the gate must find every declaration.
    proc = subprocess.run([sys.executable, "-m", "convbench", "kernels"], capture_output=True,
                          text=True, cwd=Path(__file__).parent.parent, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    for entry in DIRECT_ENTRIES:
        for arch in gate.GATE_ARCHS:
            for layout in ("NHWC=0", "NHWC=1"):
                assert any(entry in ln and arch in ln and layout in ln and ln.endswith(" ok")
                           for ln in lines), (entry, arch, layout)


@needs_nvrtc
def test_the_gate_in_processes_gives_the_rows_of_one_process_in_job_order():
    jobs = [(HERE / "spills.cu", ()), gate.declared_jobs()[0][0]]
    serial = gate.gate(jobs, ["sm_80"], workers=1)
    files = [r.file for r in serial]
    assert files[0] == "spills.cu" and files[-1] == jobs[1][0].name
    assert gate.gate(jobs, ["sm_80"], workers=2) == serial


@needs_nvrtc
@pytest.mark.parametrize("argv, words", [
    (["--arch", "sm_99"], "--arch sm_99: this NVRTC compiles for sm_"),
    (["--arch", "compute_80"], "--arch compute_80: this NVRTC compiles for sm_"),
    (["--arch", "bogus", str(HERE / "spills.cu")], "--arch bogus: "),
    (["nosuch.cu"], "no kernel file 'nosuch.cu'"),
])
def test_bad_gate_input_is_one_line(capsys, argv, words):
    assert cli_kernels.main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and words in err


def test_every_kernel_file_has_declared_configurations():
    registry.load()  # the algorithm modules declare their configurations at import
    jobs, undeclared = gate.declared_jobs()
    assert undeclared == []
    assert {path.name for path, _ in jobs} >= {"direct.cu"}


def test_a_kernel_file_without_configurations_is_reported(tmp_path, monkeypatch):
    (tmp_path / "orphan.cu").write_text("")
    monkeypatch.setattr(kernels, "kernel_dir", lambda: tmp_path)
    assert gate.declared_jobs()[1] == ["orphan.cu"]


@needs_nvrtc
def test_gate_fails_on_spills(capsys):
    assert cli_kernels.main([str(HERE / "spills.cu")]) == 1
    out = capsys.readouterr().out
    assert "SPILL" in out and "sm_80" in out and "sm_90" in out


@needs_nvrtc
def test_gate_fails_on_compile_errors(tmp_path, capsys):
    bad = tmp_path / "bad.cu"
    bad.write_text('extern "C" __global__ void bad(float* x) { x[0] = nope; }\n')
    assert cli_kernels.main([str(bad), "--arch", "sm_90"]) == 1
    captured = capsys.readouterr()
    assert 'compile error: bad.cu(1): error: identifier "nope" is undefined' in captured.out
    assert "1 error detected" in captured.err


# --- the wrappers' base ---------------------------------------------------------------------------
class _Toy(kernel_base.KernelImplementation):
    """The base's checks on hooks sized by the problem: a launch of N blocks in z, a workspace
    buffer of C·2^20 elements."""

    def check_launch(self, problem, pass_, layout):
        kernel_base.check_grid((1, 1, problem.n))

    def workspace_buffers(self, problem, pass_, layout):
        return {"the toy buffer": problem.c << 20}

    def prepare(self, problem, pass_, layout, precision):
        raise NotImplementedError


class _Refusing(_Toy):
    def refuses(self, problem, pass_, layout, precision):
        return "toy refuses"


def _toy(backend: str, cls: type = _Toy) -> kernel_base.KernelImplementation:
    impl = cls()
    impl.algo, impl.backend = "direct", backend
    return impl


SMALL = ConvProblem(n=1, c=1, h=8, w=8, k=1, r=3, s=3)
#: x has 2^32 elements; 3x3, stride 1, so that every kernel algorithm runs it but for its size.
HUGE = ConvProblem(n=2**14, c=64, h=64, w=64, k=64, r=3, s=3, pad=1)


@pytest.mark.parametrize("change, reason", [
    ({"h": 2**16, "w": 2**15},
     "x has 2,147,483,648 elements, 2^31 or more: the kernels index with 32-bit ints"),
    ({"c": 2**11},
     "the toy buffer has 2,147,483,648 elements, 2^31 or more: the kernels index with 32-bit ints"),
    ({"n": 65536}, "grid (1, 1, 65536) exceeds the CUDA limit of 65535 in y or z"),
])
def test_kernel_base_limits_say_why(change, reason):
    problem = dataclasses.replace(SMALL, **change)
    for backend in ("cuda", "emu"):
        assert _toy(backend).supports(problem, "fwd", "nchw", "fp32") == reason
    assert _toy("cuda").supports(SMALL, "fwd", "nchw", "fp32") is None


def test_kernel_base_asks_the_emulators_budget_on_emu_only():
    big = dataclasses.replace(SMALL, n=8, c=64, h=64, w=64, k=64)  # 1.1e9 MACs
    assert "too much for the emulator" in _toy("emu").supports(big, "fwd", "nchw", "fp32")
    assert _toy("cuda").supports(big, "fwd", "nchw", "fp32") is None
    assert _toy("emu").supports(SMALL, "fwd", "nchw", "fp32") is None

    class Heavy(_Toy):  # a wrapper whose emulated work is not the direct convolution's
        def emulated_work(self, problem, pass_, layout):
            return emu.MAX_MACS + 1

    assert "too much for the emulator" in _toy("emu", Heavy).supports(SMALL, "fwd", "nchw",
                                                                       "fp32")


def test_kernel_base_puts_the_algorithms_refusal_before_size_limits():
    past_all = dataclasses.replace(SMALL, n=65536, c=2**11, h=2**10, w=2**10)
    assert _toy("emu", _Refusing).supports(past_all, "fwd", "nchw", "fp32") == "toy refuses"


def test_kernel_base_declares_its_buffers_as_float32_workspace():
    assert _toy("cuda").workspace_bytes(SMALL, "fwd", "nchw", "fp32") == 4 << 20
    assert _toy("cuda").precisions == ("fp32",)


def test_kernel_helpers():
    assert [kernel_base.ceil_div(a, 4) for a in (0, 1, 4, 5)] == [0, 1, 1, 2]
    kernel_base.check_grid((2**31 - 1, kernel_base.GRID_YZ_MAX, kernel_base.GRID_YZ_MAX), (70000, 1))
    with pytest.raises(ValueError, match=r"grid \(1, 65536\) exceeds the CUDA limit"):
        kernel_base.check_grid((1, 1, 1), (1, 65536))


KERNEL_ALGOS = registry.algos_for("emu")


@pytest.mark.parametrize("algo", KERNEL_ALGOS)
def test_every_kernel_wrapper_is_one_class_on_cuda_and_emu(algo):
    on_cuda, on_emu = registry.get(algo, "cuda"), registry.get(algo, "emu")
    inner_cuda, inner_emu = (getattr(i, "inner", i) for i in (on_cuda, on_emu))  # ExplicitPad
    assert isinstance(inner_emu, kernel_base.KernelImplementation)
    assert type(inner_cuda) is type(inner_emu)
    assert on_cuda is not on_emu


@pytest.mark.parametrize("algo", KERNEL_ALGOS)
def test_every_kernel_wrapper_refuses_a_tensor_past_32_bit_indexing(algo):
    for backend in ("cuda", "emu"):
        reason = registry.supports(registry.get(algo, backend), HUGE, "fwd", "nchw", "fp32")
        assert reason.startswith("x has 4,294,967,296 elements, 2^31 or more")


def test_gemm_cublas_is_a_kernel_wrapper_on_cuda_only():
    assert isinstance(registry.get("gemm-cublas", "cuda"), kernel_base.KernelImplementation)
    assert "gemm-cublas" not in registry.algos_for("emu")
