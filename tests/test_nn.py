import pytest
import torch
from torch import nn

import convbench.functional
from convbench import nn as cbnn

#: `convbench gpu-first` runs this file's `gpu` tests first (a pin).
pytestmark = pytest.mark.gpu_pins

OURS = ("direct", "gemm", "fft", "winograd-2x2", "winograd-4x4")


@pytest.fixture
def calls(monkeypatch):
    """Every pass convbench ran (`functional.prepared_call`): (pass, algo, layout)."""
    seen = []
    real = convbench.functional.prepared_call

    def spy(problem, pass_, a, b, out, *, algo, backend, layout, precision=None):
        seen.append((pass_, algo, layout))
        return real(problem, pass_, a, b, out, algo=algo, backend=backend, layout=layout,
                    precision=precision)

    monkeypatch.setattr(convbench.functional, "prepared_call", spy)
    return seen


def pair(conv_kw, layout, algos, dtype=torch.float64, device="cpu"):
    """A torch conv and its dispatching twin sharing the same parameter objects."""
    torch.manual_seed(0)
    ref = nn.Conv2d(**conv_kw, dtype=dtype, device=device)
    return ref, cbnn.Conv2d.from_conv(ref, layout, algos)


def grads(module, x, dy):
    x = x.clone().requires_grad_(True)
    for p in module.parameters():
        p.grad = None
    y = module(x)
    y.backward(dy)
    return y, x.grad, [p.grad.clone() for p in module.parameters()]


def check_same(ref, ours, x, tol):
    dy = torch.randn_like(ref(x))
    y0, dx0, g0 = grads(ref, x, dy)
    y1, dx1, g1 = grads(ours, x, dy)
    torch.testing.assert_close(y1, y0, rtol=tol, atol=tol)
    torch.testing.assert_close(dx1, dx0, rtol=tol, atol=tol)
    for a, b in zip(g1, g0):
        torch.testing.assert_close(a, b, rtol=tol, atol=tol)


GEOMETRIES = [
    {"in_channels": 3, "out_channels": 5, "kernel_size": 3, "padding": 1},
    {"in_channels": 4, "out_channels": 6, "kernel_size": 3, "stride": 2, "padding": 1, "bias": False},
    {"in_channels": 4, "out_channels": 6, "kernel_size": (3, 2), "dilation": 2, "groups": 2},
    {"in_channels": 2, "out_channels": 3, "kernel_size": 5, "padding": "same"},
    # per axis: Inception's 1x7 / 7x1 pairs, a stride, a dilation and a 'same' per axis
    {"in_channels": 3, "out_channels": 4, "kernel_size": (1, 7), "padding": (0, 3)},
    {"in_channels": 3, "out_channels": 4, "kernel_size": (7, 1), "padding": (3, 0)},
    {"in_channels": 4, "out_channels": 6, "kernel_size": 3, "stride": (2, 1), "padding": (1, 2),
     "dilation": (1, 2), "groups": 2},
    {"in_channels": 2, "out_channels": 3, "kernel_size": (3, 5), "dilation": (2, 1),
     "padding": "same"},
    # 'same' with an odd total: torch pads one more after than before
    {"in_channels": 2, "out_channels": 3, "kernel_size": 4, "padding": "same"},
    {"in_channels": 2, "out_channels": 3, "kernel_size": (3, 4), "padding": "same"},
]


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("kw", GEOMETRIES)
def test_every_pass_runs_its_algorithm_and_matches_torch(calls, kw, layout):
    algos = {"fwd": ("gemm", "numpy"), "bwd_data": ("direct", "numpy"),
             "bwd_filter": ("gemm", "numpy")}
    ref, ours = pair(kw, layout, algos)
    x = torch.randn(2, kw["in_channels"], 9, 10, dtype=torch.float64)
    check_same(ref, ours, x, 1e-10)
    assert calls == [("fwd", "gemm", layout), ("bwd_data", "direct", layout),
                     ("bwd_filter", "gemm", layout)]


@pytest.mark.parametrize("algo", OURS)
def test_each_cpu_algorithm_in_fp32(algo):
    kw = {"in_channels": 3, "out_channels": 4, "kernel_size": 3, "padding": 1}
    ref, ours = pair(kw, "nhwc", {p: (algo, "numpy") for p in ("fwd", "bwd_data", "bwd_filter")},
                     dtype=torch.float32)
    x = torch.randn(2, 3, 8, 8)
    check_same(ref, ours, x, 1e-3 if algo.startswith("winograd") else 1e-4)


@pytest.mark.parametrize("kernel_size", [4, (3, 4), (2, 3)])
def test_torch_runs_same_padding_with_an_odd_total_as_torch_does(calls, kernel_size):
    """Where torch runs a pass of a layer padded one more after than before, x is padded
    explicitly first (and its gradient cropped back)."""
    kw = {"in_channels": 3, "out_channels": 4, "kernel_size": kernel_size, "padding": "same"}
    ref, ours = pair(kw, "nhwc", {"fwd": ("torch-cpu", "numpy"), "bwd_data": None,
                                  "bwd_filter": ("gemm", "numpy")})
    check_same(ref, ours, torch.randn(2, 3, 7, 8, dtype=torch.float64), 1e-10)
    assert calls == [("bwd_filter", "gemm", "nhwc")]
    assert cbnn.conv_geometry(ref)["pad"] == cbnn.problem_of(ref, (1, 3, 7, 8)).pad


def test_torch_passes_and_our_passes_mix(calls):
    kw = {"in_channels": 3, "out_channels": 4, "kernel_size": 3, "padding": 1}
    ref, ours = pair(kw, "nhwc", {"fwd": ("torch-cpu", "numpy"), "bwd_data": None,
                                  "bwd_filter": ("winograd-2x2", "numpy")})
    check_same(ref, ours, torch.randn(2, 3, 7, 7, dtype=torch.float64), 1e-10)
    assert calls == [("bwd_filter", "winograd-2x2", "nhwc")]


def test_outputs_are_in_the_layers_layout():
    kw = {"in_channels": 3, "out_channels": 4, "kernel_size": 3}
    for layout, fmt in cbnn.MEMORY_FORMAT.items():
        _, ours = pair(kw, layout, {"fwd": ("gemm", "numpy")}, dtype=torch.float32)
        assert ours(torch.randn(1, 3, 6, 6)).is_contiguous(memory_format=fmt)


def test_unneeded_gradients_are_not_computed(calls):
    """The study's first-layer lesson: an input that needs no gradient gets no bwd_data."""
    kw = {"in_channels": 3, "out_channels": 4, "kernel_size": 3}
    algos = {p: ("gemm", "numpy") for p in ("fwd", "bwd_data", "bwd_filter")}
    _, ours = pair(kw, "nchw", algos, dtype=torch.float32)
    ours(torch.randn(2, 3, 6, 6)).sum().backward()
    assert [c[0] for c in calls] == ["fwd", "bwd_filter"]
    calls.clear()
    ours.weight.requires_grad_(False)
    x = torch.randn(2, 3, 6, 6, requires_grad=True)
    ours(x).sum().backward()
    assert [c[0] for c in calls] == ["fwd", "bwd_data"] and x.grad is not None
    assert ours.bias.grad is not None  # the bias gradient is torch's, from the sum


def test_same_parameters_and_state_dict_keys():
    ref = nn.Conv2d(3, 4, 3, bias=True)
    ours = cbnn.Conv2d.from_conv(ref, "nhwc", {"fwd": ("gemm", "numpy")})
    assert ours.weight is ref.weight and ours.bias is ref.bias
    assert list(ours.state_dict()) == list(ref.state_dict()) == ["weight", "bias"]
    fresh = cbnn.Conv2d(3, 4, 3, layout="nhwc", algos={"fwd": ("gemm", "numpy")})
    fresh.load_state_dict(ref.state_dict())
    assert torch.equal(fresh.weight, ref.weight)
    assert "layout=nhwc, fwd=gemm, bwd_data=torch default" in repr(ours)


def test_an_optimizer_built_before_the_swap_still_trains_the_layer():
    ref = nn.Conv2d(2, 3, 3)
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    ours = cbnn.Conv2d.from_conv(ref, "nchw", {p: ("gemm", "numpy")
                                               for p in ("fwd", "bwd_data", "bwd_filter")})
    before = ref.weight.detach().clone()
    ours(torch.randn(1, 2, 5, 5)).sum().backward()
    opt.step()
    assert not torch.equal(ref.weight, before)


@pytest.mark.parametrize("kw, reason", [
    ({"padding": 1, "padding_mode": "reflect"}, "padding_mode 'reflect'"),
])
def test_geometry_no_problem_describes_is_refused(kw, reason):
    conv = nn.Conv2d(2, 3, **{"kernel_size": 3, **kw})
    with pytest.raises(ValueError, match=reason.replace("(", r"\(").replace(")", r"\)")):
        cbnn.conv_geometry(conv)


def test_problem_of():
    conv = nn.Conv2d(4, 6, 3, stride=2, padding="valid", dilation=1, groups=2)
    p = cbnn.problem_of(conv, (2, 4, 9, 9))
    assert (p.n, p.c, p.h, p.k, p.r, p.stride, p.pad, p.groups) == (2, 4, 9, 6, 3, 2, 0, 2)
    with pytest.raises(ValueError, match="4-D"):
        cbnn.problem_of(conv, (4, 9, 9))


@pytest.mark.parametrize("kw, geometry", [
    ({"kernel_size": (1, 7), "padding": (0, 3)}, {"stride": 1, "pad": (0, 3), "dilation": 1}),
    ({"kernel_size": 3, "stride": (2, 1), "padding": (1, 1), "dilation": (1, 2)},
     {"stride": (2, 1), "pad": 1, "dilation": (1, 2)}),
    ({"kernel_size": (3, 5), "padding": "same"}, {"stride": 1, "pad": (1, 2), "dilation": 1}),
    ({"kernel_size": 3, "dilation": (1, 3), "padding": "same"},
     {"stride": 1, "pad": (1, 3), "dilation": (1, 3)}),
])
def test_per_axis_geometry_is_the_problems(kw, geometry):
    """torch's per-axis stride, padding and dilation become the problem's, one int where the
    axes agree."""
    conv = nn.Conv2d(2, 3, **kw)
    assert cbnn.conv_geometry(conv) == {**geometry, "groups": 1}
    p = cbnn.problem_of(conv, (1, 2, 9, 11))
    assert (p.stride, p.pad, p.dilation) == (geometry["stride"], geometry["pad"],
                                             geometry["dilation"])
    assert p.y_shape() == tuple(conv(torch.zeros(1, 2, 9, 11)).shape)


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_no_array_of_a_call_outlives_it_through_an_explicit_pad(monkeypatch, layout):
    """A layer padded unequally (a 4x4 'same': 1 before, 2 after) runs our FFT after an explicit
    pad: the memoized pass keeps its plan and workspace (the padded buffer) but no array of a
    call (x, w, y, dy, dx, dw: the inner pass's last call too) once the call returns, or every
    step would hold a layer's activations and gradients into the next."""
    import weakref

    real, seen = cbnn._array, []

    def recording(t, layout):
        a = real(t, layout)
        seen.append(weakref.ref(a))
        return a

    monkeypatch.setattr(cbnn, "_array", recording)
    kw = {"in_channels": 3, "out_channels": 4, "kernel_size": 4, "padding": "same"}
    ref, ours = pair(kw, layout, {p: ("fft", "numpy") for p in ("fwd", "bwd_data", "bwd_filter")},
                     dtype=torch.float32)
    check_same(ref, ours, torch.randn(2, 3, 9, 9), 1e-4)  # forward and backward, each pass through the explicit pad
    assert len(seen) == 9  # x, w, y; dy, w, dx; x, dy, dw
    assert [r() is not None for r in seen] == [False] * 9


def test_double_backward_is_refused():
    _, ours = pair({"in_channels": 2, "out_channels": 2, "kernel_size": 3}, "nchw",
                   {"fwd": ("gemm", "numpy"), "bwd_data": ("gemm", "numpy")})
    x = torch.randn(1, 2, 5, 5, dtype=torch.float64, requires_grad=True)
    (dx,) = torch.autograd.grad(ours(x).pow(2).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable|double backward"):
        dx.sum().backward()


# --- on a GPU -------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("algos", [
    {"fwd": ("cudnn", "cuda"), "bwd_data": ("cudnn-autotune", "cuda"),
     "bwd_filter": ("cudnn", "cuda")},
    {"fwd": ("direct", "cuda"), "bwd_data": ("direct", "cuda"), "bwd_filter": ("direct", "cuda")},
])
def test_cuda_passes_match_torch(layout, algos):
    torch.backends.cudnn.allow_tf32 = False
    kw = {"in_channels": 8, "out_channels": 16, "kernel_size": 3, "padding": 1}
    ref, ours = pair(kw, layout, algos, dtype=torch.float32, device="cuda")
    x = torch.randn(4, 8, 14, 14, device="cuda")
    check_same(ref, ours, x, 1e-4)
    assert torch.backends.cudnn.benchmark is False  # per-pass modes are restored


@pytest.mark.gpu
def test_cuda_runs_on_torchs_current_stream():
    kw = {"in_channels": 8, "out_channels": 8, "kernel_size": 3, "padding": 1}
    ref, ours = pair(kw, "nhwc", {p: ("direct", "cuda") for p in ("fwd", "bwd_data",
                                                                   "bwd_filter")},
                     dtype=torch.float32, device="cuda")
    stream = torch.cuda.Stream()
    x = torch.randn(2, 8, 10, 10, device="cuda")
    ours(x)  # compiled and prepared now: below, the kernels are launched while the sleep runs
    x_late = torch.full_like(x, float("nan"))
    torch.cuda.synchronize()
    with torch.cuda.stream(stream):
        # The stream is busy for a while before it writes the layer's input: a kernel launched
        # on any other stream would read that input unwritten (NaN).
        torch.cuda._sleep(200_000_000)
        x_late.copy_(x)
        y = ours(x_late)
        assert not stream.query()  # still sleeping when the layer's kernels were enqueued
    stream.synchronize()
    torch.testing.assert_close(y, ref(x), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("global_flag", [False, True])
def test_each_cudnn_mode_runs_on_a_thread_of_its_own(monkeypatch, global_flag):
    """torch's cuDNN plan cache is per thread and keyed without the benchmark flag: a `cudnn`
    pass and a `cudnn-autotune` pass on one thread would share the plan of whichever ran the
    shape first. The mode other than the global flag's runs on its own thread, with its flag;
    the global flag's mode and torch's default where they are called (the thread's torch layers
    run in that mode there, and a hand-off a pass is saved)."""
    import threading

    monkeypatch.setattr(torch.backends.cudnn, "benchmark", global_flag)

    seen = []
    real_conv, real_bwd = torch.nn.functional.conv2d, torch.ops.aten.convolution_backward

    class record:  # the op, recording where it was called (its overloads left as they are)
        def __init__(self, name, real):
            self.name, self.real = name, real

        def __call__(self, *args, **kw):
            seen.append((self.name, threading.current_thread().name,
                         torch.backends.cudnn.benchmark, torch.is_grad_enabled()))
            return self.real(*args, **kw)

        def __getattr__(self, attr):
            return getattr(self.real, attr)

    monkeypatch.setattr(torch.nn.functional, "conv2d", record("fwd", real_conv))
    monkeypatch.setattr(torch.ops.aten, "convolution_backward", record("bwd", real_bwd))
    kw = {"in_channels": 3, "out_channels": 4, "kernel_size": 3, "padding": 1}
    ref, ours = pair(kw, "nchw", {"fwd": ("cudnn", "cuda"), "bwd_data": ("cudnn-autotune", "cuda"),
                                  "bwd_filter": None})
    check_same(ref, ours, torch.randn(2, 3, 7, 7, dtype=torch.float64), 1e-10)
    seen.clear()
    x = torch.randn(2, 3, 7, 7, dtype=torch.float64, requires_grad=True)
    ours(x).sum().backward()
    (fwd,) = [s for s in seen if s[0] == "fwd"]
    assert fwd[2] is False and not fwd[3]  # cudnn's flag; in the Function's forward: no graph
    assert fwd[1].startswith("convbench-cudnn-benchmark-False") is global_flag
    assert [s[0] for s in seen] == ["fwd", "bwd", "bwd"]
    # one pass on a worker thread: cudnn's with the flag on, else autotune's; the rest (the
    # global flag's mode and torch's default) where called, with the global flag
    (away,) = [s for s in seen if s[1].startswith("convbench")]
    assert away[1] == f"convbench-cudnn-benchmark-{not global_flag}_0"
    assert away[2] is not global_flag and away[0] == ("fwd" if global_flag else "bwd")
    assert all(s[2] is global_flag for s in seen if s is not away)
