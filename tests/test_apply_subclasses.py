"""Conv modules that are not plain `nn.Conv2d`: `apply` keeps what it cannot prove it
reproduces (the model computes exactly what it did), its `check=` refuses a replacement that
computes something else, and `find_convs` measures the convolution a module really computes."""

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from test_apply import hand_plan
from torch import nn
from torch.nn.utils import parametrize

import convbench.functional
from convbench.core.problem import ConvProblem
from convbench.planning import apply, models


class SameConv(nn.Conv2d):
    """TensorFlow's SAME padding in forward, as timm's Conv2dSame and efficientnet_pytorch's
    Conv2dStaticSamePadding do: odd totals pad one more after than before."""

    def forward(self, x):
        pads = []
        for size, k, s in zip(x.shape[:1:-1], self.kernel_size[::-1], self.stride[::-1]):
            total = max((math.ceil(size / s) - 1) * s + k - size, 0)
            pads += [total // 2, total - total // 2]
        return F.conv2d(F.pad(x, pads), self.weight, self.bias, self.stride, 0, self.dilation,
                        self.groups)


class StdConv(nn.Conv2d):
    """Weight standardisation, as timm's StdConv2d."""

    def forward(self, x):
        w = F.batch_norm(self.weight.reshape(1, self.out_channels, -1), None, None,
                         training=True, momentum=0.0, eps=1e-6).reshape_as(self.weight)
        return F.conv2d(x, w, self.bias, self.stride, self.padding, self.dilation, self.groups)


class HalfConv(nn.Conv2d):
    def forward(self, x):
        return super().forward(x) * 0.5


class FuncConv(nn.Module):
    """Not an nn.Conv2d: F.conv2d on a weight of its own, padded 'same'."""

    def __init__(self, c, k):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(k, c, 3, 3) * 0.1)

    def forward(self, x):
        return F.conv2d(x, self.weight, None, 1, "same")


class Doubled(nn.Module):
    def forward(self, w):
        return 2 * w


def parametrized(c, k):
    conv = nn.Conv2d(c, k, 3, padding=1)
    parametrize.register_parametrization(conv, "weight", Doubled())
    return conv


def hooked(c, k):
    conv = nn.Conv2d(c, k, 3, padding=1)
    conv.register_forward_hook(lambda m, args, y: y + 1)
    return conv


class Net(nn.Module):
    def __init__(self, conv):
        super().__init__()
        self.conv = conv

    def forward(self, x):
        return self.conv(x)


KEPT = {
    "same": (lambda: SameConv(3, 4, 3, stride=2), "SameConv has its own forward"),
    "std": (lambda: StdConv(3, 4, 3, padding=1), "StdConv has its own forward"),
    "half": (lambda: HalfConv(3, 4, 3, padding=1), "HalfConv has its own forward"),
    "func": (lambda: FuncConv(3, 4), "FuncConv is not an nn.Conv2d"),
    "parametrized": (lambda: parametrized(3, 4), "ParametrizedConv2d is parametrized"),
    "hooked": (lambda: hooked(3, 4), "Conv2d has forward hooks"),
}
OURS = {"fwd": "gemm", "bwd_data": "gemm", "bwd_filter": "direct"}


def model_and_plan(make, layout="nhwc"):
    torch.manual_seed(0)
    model, x = Net(make()).double(), torch.randn(2, 3, 9, 9, dtype=torch.float64)
    return model, x, hand_plan(model, x, [layout], [OURS])


def outputs(model, x):
    """(y, dx) of one forward and backward with a fixed output gradient."""
    xi = x.clone().requires_grad_()
    y = model(xi)
    y.backward(torch.linspace(-1, 1, y.numel(), dtype=y.dtype).reshape(y.shape))
    return y.detach(), xi.grad


@pytest.mark.parametrize("case", KEPT)
def test_apply_keeps_what_it_cannot_prove_and_the_model_computes_what_it_did(case):
    make, says = KEPT[case]
    model, x, plan = model_and_plan(make)
    assert [lp.layer for lp in plan.layers] == ["conv"]  # found, measured, planned
    before, kind = outputs(copy.deepcopy(model), x), type(model.conv)
    summary = apply.apply(model, plan)
    change = summary.changes[0]
    assert (change.layer, change.action, change.layout) == ("conv", "as is", "")
    assert change.reason == f"{says}: convbench cannot prove it reproduces it; torch runs it"
    assert type(model.conv) is kind and summary.replaced == []
    assert model.conv.weight.is_contiguous()  # not even its layout changed
    after = outputs(model, x)
    assert torch.equal(after[0], before[0]) and torch.equal(after[1], before[1])


def test_a_plain_conv_is_replaced_and_computes_the_same():
    model, x, plan = model_and_plan(lambda: nn.Conv2d(3, 4, 3, padding=1))
    before = outputs(copy.deepcopy(model), x)
    summary = apply.apply(model, plan, check=x)
    assert summary.replaced == ["conv"]
    after = outputs(model, x)
    torch.testing.assert_close(after[0], before[0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(after[1], before[1], rtol=1e-12, atol=1e-12)


def test_the_check_refuses_a_wrong_replacement_and_keeps_the_original(monkeypatch):
    real = convbench.functional.prepared_call

    def wrong(problem, pass_, a, b, out, **kwargs):
        real(problem, pass_, a, b, out, **kwargs)
        if pass_ == "bwd_filter":
            out *= 1.001  # a planted bug in one pass only

    monkeypatch.setattr(convbench.functional, "prepared_call", wrong)
    model, x, plan = model_and_plan(lambda: nn.Conv2d(3, 4, 3, padding=1))
    before = outputs(copy.deepcopy(model), x)
    summary = apply.apply(model, plan, check=x)
    change = summary.changes[0]
    assert (change.action, change.layout) == ("as is", "")
    assert change.reason.startswith("refused by the check: bwd_filter (direct) differs from "
                                    "torch's by 0.001 > tolerance 1e-12")
    assert type(model.conv) is nn.Conv2d and model.conv.weight.is_contiguous()
    after = outputs(model, x)
    assert torch.equal(after[0], before[0]) and torch.equal(after[1], before[1])


def test_a_tf_same_stem_is_measured_on_the_input_it_really_convolves():
    """EfficientNet-B0's stem at 224x224: TF-SAME pads 0 before and 1 after, and the conv
    computes 112x112 on the 225x225 padded input (a hook on the module saw 224x224, pad 0,
    and measured a 111x111 output)."""
    model = Net(SameConv(3, 32, 3, stride=2, bias=False))
    sites, refused = models.find_convs(model, torch.randn(1, 3, 224, 224))
    assert refused == []
    [site] = sites
    assert site.problem == ConvProblem(n=1, c=3, h=225, w=225, k=32, r=3, s=3, stride=2)
    assert (site.problem.p, site.problem.q) == (112, 112)
    assert site.kept == "SameConv has its own forward"


@pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel")
def test_find_convs_catches_functional_convs_and_string_padding():
    sites, _ = models.find_convs(Net(FuncConv(3, 4)), torch.randn(2, 3, 9, 9))
    assert [(s.name, s.problem, s.kept) for s in sites] == [
        ("conv", ConvProblem(n=2, c=3, h=9, w=9, k=4, r=3, s=3, pad=1),
         "FuncConv is not an nn.Conv2d")]
    sites, _ = models.find_convs(Net(nn.Conv2d(3, 4, (2, 3), padding="same")),
                                 torch.randn(2, 3, 9, 9))
    assert sites[0].problem.pad == ((0, 1), (1, 1)) and sites[0].kept is None
