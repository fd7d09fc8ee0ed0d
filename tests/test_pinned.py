"""Pinned cuDNN passes in training code, on the CPU through the fake libcudnn
(tests/fake_libcudnn.c, whose "device" pointers are host pointers): a plan naming cuDNN's
algorithms goes to plan.json, `apply` swaps the layer, and a training step runs exactly the
planned algorithms with no find, its workspace from torch's allocator; what cuDNN refuses falls
back to torch's convolution with one warning; autocast composes; `apply` refuses a plan of
another precision. The real library is pinned by the `gpu` test at the end."""

import ctypes
import gc
import warnings

import pytest
import torch
from test_cudnn_find import fake  # noqa: F401  (the fixture)
from torch import nn

from convbench import nn as cbnn
from convbench.algos import cudnn, cudnn_pinned
from convbench.algos import cudnn_find as cf
from convbench.core.problem import PASSES
from convbench.planning import apply, models
from convbench.planning.plan import Choice, Constraints, LayerPlan, Plan, PlanError, current_env_key

GEOMETRY = {"in_channels": 4, "out_channels": 6, "kernel_size": (3, 2), "stride": (2, 1),
            "padding": (1, 0), "dilation": (1, 2), "groups": 2}
#: The fake's algorithms that run each pass (cuDNN's enum values) and their workspaces.
PLANNED = {"fwd": ("cudnn-find-fft", 4, 1 << 20), "bwd_data": ("cudnn-find-algo-1", 1, 0),
           "bwd_filter": ("cudnn-find-algo-3", 3, 512)}


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(**GEOMETRY)
        self.head = nn.Linear(6 * 4 * 4, 3)

    def forward(self, x):
        return self.head(torch.relu(self.conv(x)).flatten(1))


def found_note(workspace: int, math: str = "FMA_MATH") -> str:
    """A row's note as `cudnn_find.note` writes it."""
    return (f"cuDNN find: 0.25 ms (rank 1 of 3), workspace {workspace} B, deterministic, "
            f"{math}")


def pinned_plan(model, x, layout="nchw", planned=PLANNED, precision="fp32",
                cudnn="90100") -> Plan:
    (site,), unplanned = models.find_convs(model, x)
    passes = {}
    for p in PASSES:
        algo, _, ws = planned[p]
        pin = cudnn_pinned.Pin.of(algo, p, precision, found_note(ws), cudnn)
        passes[p] = Choice(algo, "cuda", 0.3, 0.01, pin)
    return Plan(env={**current_env_key("numpy"), "cudnn": cudnn}, backend="cuda",
                precision=precision, constraints=Constraints(),
                cudnn={"benchmark": False, "deterministic": False, "benchmark_limit": 3},
                input_layout="nchw", output_layout="nchw",
                layers=[LayerPlan(site.name, site.problem, layout, passes)], network=None,
                unplanned=unplanned)


@pytest.fixture
def on_fake(fake, monkeypatch):  # noqa: F811
    """The fake as the libcudnn torch loaded (cuDNN 9.1.0), a CPU model allowed a GPU plan,
    and a record of every cuDNN call that runs a pass, every workspace taken, and no find."""
    monkeypatch.setattr(cf, "_binding", lambda: fake)
    monkeypatch.setattr(torch.backends.cudnn, "version", lambda: 90100)
    monkeypatch.setattr(apply, "_check_device", lambda model, plan: None)
    monkeypatch.setattr(cudnn, "conv_runs_tf32", lambda: False)  # as on a GPU with TF32 off
    record = {"runs": [], "workspaces": []}
    real_run, real_ws = cf.run, cudnn_pinned.workspace

    def run(cudnn, handle, desc, algo, *args):
        record["runs"].append((desc.pass_, algo))
        return real_run(cudnn, handle, desc, algo, *args)

    def workspace(nbytes, device):
        t = real_ws(nbytes, device)
        record["workspaces"].append((nbytes, t))
        return t

    def no_find(*args):
        raise AssertionError("a pinned pass ran cuDNN's find")

    monkeypatch.setattr(cf, "run", run)
    monkeypatch.setattr(cf, "find", no_find)
    monkeypatch.setattr(cudnn_pinned, "workspace", workspace)
    return record


def step(model, x):
    """One training step's output and gradients (input and parameters)."""
    x = x.clone().requires_grad_()
    y = model(x)
    y.square().sum().backward()
    return y.detach(), x.grad, [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_a_pinned_plan_runs_its_algorithms_in_a_training_step(on_fake, fake, tmp_path,  # noqa: F811
                                                               layout):
    torch.manual_seed(0)
    model, x = Net(), torch.randn(2, 4, 7, 6)
    reference = Net()
    reference.load_state_dict(model.state_dict())
    path = pinned_plan(model, x, layout).save(tmp_path / "plan.json")
    loaded = Plan.load(path)
    assert loaded.layers[0].passes["fwd"].pin == cudnn_pinned.Pin(
        "FFT", "FMA_MATH", 1 << 20, 0.25, "90100")
    torch.backends.cudnn.benchmark_limit = 10
    summary = apply.apply(model, path)
    assert summary.replaced == ["conv"] and isinstance(model.conv, cbnn.Conv2d)
    assert torch.backends.cudnn.benchmark_limit == 3  # as measured
    for _ in range(2):  # prepared once, run twice
        model.zero_grad()
        reference.zero_grad()
        got, want = step(model, x), step(reference, x)
        for g, w in zip([got[0], got[1], *got[2]], [want[0], want[1], *want[2]]):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
    runs = {"fwd": 4, "bwd_data": 1, "bwd_filter": 3}
    assert on_fake["runs"] == [*runs.items()] * 2
    # the workspace each algorithm needs, from torch's allocator, handed to cuDNN
    assert [n for n, _ in on_fake["workspaces"]] == [1 << 20, 512] * 2
    last = on_fake["workspaces"][-1][1]
    fake.lib.fake_last_workspace.restype = ctypes.c_void_p
    fake.lib.fake_last_workspace_size.restype = ctypes.c_size_t
    assert fake.lib.fake_last_workspace() == last.data_ptr()
    assert fake.lib.fake_last_workspace_size() == 512
    assert fake.lib.fake_last_math() == cf.MATH_TYPES.index("FMA_MATH")
    del model  # its prepared passes' descriptors go with it
    gc.collect()
    assert fake.lib.fake_live_descriptors() == 0


def test_what_cudnn_refuses_runs_torch_s_convolution_with_one_warning(on_fake):
    torch.manual_seed(0)
    model, x = Net(), torch.randn(2, 4, 7, 6)
    reference = Net()
    reference.load_state_dict(model.state_dict())
    # the fake's find reports WINOGRAD as not supported for this problem
    refused = {**PLANNED, "fwd": ("cudnn-find-winograd", 6, 0)}
    apply.apply(model, pinned_plan(model, x, planned=refused))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            got, want = step(model, x), step(reference, x)
            torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5)
    said = [str(w.message) for w in caught if "convbench" in str(w.message)]
    assert len(said) == 1 and "fwd" in said[0] and "WINOGRAD" in said[0]
    assert "CUDNN_STATUS_NOT_SUPPORTED" in said[0]
    assert [r for r in on_fake["runs"] if r[0] == "fwd"] == []  # torch ran it
    assert ("bwd_filter", 3) in on_fake["runs"]  # the other pins still run


def test_pins_found_with_another_cudnn_or_nondeterministic_ones_under_determinism(on_fake):
    model, x = Net(), torch.randn(2, 4, 7, 6)
    with pytest.warns(UserWarning, match=r"3 pinned cuDNN passes run torch's convolution "
                      r"\(found with cuDNN 8900, cuDNN 90100 loaded\)"):
        apply.apply(model, pinned_plan(model, x, cudnn="8900"))
    step(model, x)
    assert on_fake["runs"] == []
    model = Net()
    torch.backends.cudnn.deterministic = True
    try:
        with pytest.warns(UserWarning) as caught:
            apply.apply(model, pinned_plan(model, x))
        text = " | ".join(str(w.message) for w in caught)
        assert "deterministic stays True" in text
        assert "1 pinned cuDNN passes run torch's convolution (nondeterministic" in text
        assert torch.backends.cudnn.deterministic  # never lowered
        step(model, x)
        assert on_fake["runs"] == [("fwd", 4), ("bwd_data", 1)]  # ALGO_3 is nondeterministic
    finally:
        torch.backends.cudnn.deterministic = False


def test_apply_refuses_a_plan_measured_in_another_precision(on_fake, monkeypatch):
    model, x = Net(), torch.randn(2, 4, 7, 6)
    monkeypatch.setattr(cudnn, "conv_runs_tf32", lambda: True)
    with pytest.raises(PlanError, match=r"strict fp32 \(TF32 off\).*allow_tf32 = False"):
        apply.apply(model, pinned_plan(model, x, precision="fp32"))
    monkeypatch.setattr(cudnn, "conv_runs_tf32", lambda: False)
    with pytest.raises(PlanError, match="measured in TF32 and TF32 is off"):
        apply.apply(model, pinned_plan(model, x, precision="tf32"))
    with pytest.raises(PlanError, match="measured in fp16; the model's parameters are float64"):
        apply.apply(Net().double(), pinned_plan(model, x, precision="fp16"))


def test_swapped_layers_work_under_autocast(on_fake):
    """bf16 autocast on the CPU: a layer planned in bf16 runs in bf16 (an algorithm that does
    not run bf16 falls back to torch's, once said), and a layer planned in fp32 called under
    autocast runs torch's convolution, once said; neither fails."""
    torch.manual_seed(0)
    x = torch.randn(2, 4, 7, 6)
    said_for = {"bf16": "cuDNN refuses", "fp32": "measured in fp32, this call runs in bf16"}
    for precision, words in said_for.items():
        model = Net()
        reference = Net()
        reference.load_state_dict(model.state_dict())
        apply.apply(model, pinned_plan(model, x, precision=precision))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(2):
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    y = model.conv(x)
                    want = reference.conv(x)
                assert y.dtype == torch.bfloat16
                torch.testing.assert_close(y, want, rtol=2e-2, atol=1e-2)  # bf16's rounding
                y.float().sum().backward()
                assert model.conv.weight.grad.dtype == torch.float32
        said = [str(w.message) for w in caught if "convbench" in str(w.message)]
        assert said and all(words in s for s in said), said
        # once per pass run (x needs no gradient: no bwd_data), or once for the layer
        assert len(said) == (2 if precision == "bf16" else 1)


def test_a_planned_layer_is_one_opaque_operator_to_torch_compile():
    torch._dynamo.reset()
    layer = cbnn.Conv2d(3, 4, 3, padding=1, algos={p: ("gemm", "numpy") for p in PASSES})
    ref = nn.Conv2d(3, 4, 3, padding=1)
    ref.load_state_dict(layer.state_dict())
    x = torch.randn(2, 3, 6, 6)
    compiled = torch.compile(layer, backend="aot_eager", fullgraph=True)
    y = compiled(x)
    y.sum().backward()
    ref(x).sum().backward()
    torch.testing.assert_close(y, ref(x), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(layer.weight.grad, ref.weight.grad, rtol=1e-5, atol=1e-5)


def test_a_copied_layer_dispatches_on_its_own():
    import copy

    layer = cbnn.Conv2d(3, 4, 3, algos={"fwd": ("gemm", "numpy")})
    twin = copy.deepcopy(layer)
    assert twin.dispatch.id != layer.dispatch.id
    del layer
    x = torch.randn(1, 3, 5, 5)
    torch.testing.assert_close(twin(x), nn.functional.conv2d(x, twin.weight, twin.bias))


@pytest.mark.gpu
@pytest.mark.gpu_pins
def test_the_real_cudnn_runs_a_pinned_pass_on_torch_s_stream():
    """On a GPU: pins of algorithms every cuDNN has for a plain 3x3 layer (IMPLICIT_GEMM,
    ALGO_1) run on a side stream, with no warning (nothing fell back), and match torch's
    convolution."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    was = cudnn.conv_runs_tf32()
    cudnn.set_tf32(False)  # through whichever TF32 API this torch has
    try:
        layer = cbnn.Conv2d(8, 16, 3, padding=1, device="cuda", precision="fp32", algos={
            p: (f"cudnn-find-{a}", "cuda") for p, a in
            (("fwd", "implicit-gemm"), ("bwd_data", "algo-1"), ("bwd_filter", "algo-1"))})
        x = torch.randn(4, 8, 12, 12, device="cuda", requires_grad=True)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())  # x and the weights are made there
        with torch.cuda.stream(side), warnings.catch_warnings():
            warnings.simplefilter("error")
            y = layer(x)
            y.square().sum().backward()
        torch.cuda.synchronize()
        ref = nn.functional.conv2d(x.detach(), layer.weight.detach(), layer.bias.detach(),
                                   padding=1)
        torch.testing.assert_close(y.detach(), ref, rtol=1e-4, atol=1e-4)
    finally:
        cudnn.set_tf32(was)
