import re

import pytest

from convbench.core.problem import ConvProblem, parse_spec

CONV2 = dict(n=256, c=96, h=27, w=27, k=256, r=5, s=5, stride=1, pad=2)


def test_output_shape_and_flops_match_the_study():
    p = ConvProblem(**CONV2)
    assert (p.p, p.q) == (27, 27)
    # Kim et al.: 96*27*27*5*5*256*256*2 ~= 229 GFLOP for AlexNet conv2.
    assert p.flops == 96 * 27 * 27 * 5 * 5 * 256 * 256 * 2 == 229_323_571_200


def test_shapes_per_layout_and_pass():
    p = ConvProblem(n=2, c=6, h=9, w=7, k=4, r=3, s=2, stride=2, pad=1, groups=2)
    assert p.x_shape("nchw") == (2, 6, 9, 7) and p.x_shape("nhwc") == (2, 9, 7, 6)
    assert p.w_shape("nchw") == (4, 3, 3, 2) and p.w_shape("nhwc") == (4, 3, 2, 3)
    assert p.y_shape("nchw") == (2, 4, 5, 4) and p.y_shape("nhwc") == (2, 5, 4, 4)
    assert p.operand_shapes("bwd_data", "nhwc") == (p.y_shape("nhwc"), p.w_shape("nhwc"),
                                                     p.x_shape("nhwc"))
    assert p.operand_shapes("bwd_filter") == (p.x_shape(), p.y_shape(), p.w_shape())


def test_dilation_changes_the_output_size():
    p = ConvProblem(n=1, c=1, h=10, w=10, k=1, r=3, s=3, dilation=2)
    assert (p.eff_r, p.p, p.q) == (5, 6, 6)


def test_min_bytes_counts_each_tensor_once():
    p = ConvProblem(n=1, c=2, h=4, w=4, k=3, r=3, s=3, pad=1)
    assert p.min_bytes("fp32") == 4 * (2 * 16 + 3 * 2 * 9 + 3 * 16)
    assert p.min_bytes("fp16") == p.min_bytes("fp32") // 2


def test_hashable_and_frozen():
    a, b = ConvProblem(**CONV2), ConvProblem(**CONV2)
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    with pytest.raises(AttributeError):
        a.n = 3
    assert a.with_batch(8).n == 8 and a.n == 256


@pytest.mark.parametrize("change, field", [
    (dict(n=0), "n"), (dict(c=-1), "c"), (dict(k=0), "k"), (dict(stride=0), "stride"),
    (dict(pad=-1), "pad"), (dict(dilation=0), "dilation"), (dict(h=2.5), "h"),
    (dict(r="5"), "r"), (dict(w=True), "w"), (dict(groups=5), "groups"),
    (dict(r=40), "r"), (dict(s=32, pad=0), "s"),
])
def test_invalid_problems_name_the_field(change, field):
    with pytest.raises(ValueError, match=rf"\b{field}\b"):
        ConvProblem(**{**CONV2, **change})


def test_groups_must_divide_k():
    with pytest.raises(ValueError, match="groups.*k=5"):
        ConvProblem(n=1, c=4, h=5, w=5, k=5, r=3, s=3, groups=2)


def test_spec_round_trip():
    p = ConvProblem(n=8, c=96, h=27, w=27, k=256, r=5, s=5, pad=2)
    assert p.spec() == "n=8,c=96,h=27,w=27,k=256,r=5,s=5,pad=2"
    assert parse_spec(p.spec()) == p
    assert parse_spec(" n=1, c=2,h=5,w=5,k=3,r=3,s=3,padding=1 ").pad == 1


@pytest.mark.parametrize("text, msg", [
    ("n=8,c=96,h=27", "missing w, k, r, s"),
    ("n=8,c=96,h=27,w=27,k=256,r=5,s=5,pad=x", "pad='x' is not an integer"),
    ("n=8,c=96,h=27,w=27,k=256,r=5,s=5,foo=2", "'foo=2' is not FIELD=INT"),
    ("n=8,n=9,c=96,h=27,w=27,k=256,r=5,s=5", "n given twice"),
    ("n=8 c=96", "n='8 c=96' is not an integer"),
])
def test_malformed_specs(text, msg):
    with pytest.raises(ValueError, match=msg):
        parse_spec(text)


# --- per-axis geometry ---------------------------------------------------------------------
def test_per_axis_fields_have_one_form():
    a = ConvProblem(n=1, c=3, h=9, w=20, k=4, r=1, s=7, stride=(2, 1), pad=(0, 3))
    assert a == ConvProblem(n=1, c=3, h=9, w=20, k=4, r=1, s=7, stride=[2, 1], pad=(0, 3),
                            dilation=(1, 1))
    assert a.dilation == 1 and a.stride == (2, 1) and a.per_axis
    assert (a.stride_h, a.stride_w, a.pad_h, a.pad_w, a.dil_h, a.dil_w) == (2, 1, 0, 3, 1, 1)
    assert (a.p, a.q) == (5, 20)  # (9 - 1) // 2 + 1 and 20 + 6 - 7 + 1
    assert ConvProblem(n=1, c=1, h=5, w=5, k=1, r=3, s=3, stride=(2, 2)).stride == 2
    assert not ConvProblem(n=1, c=1, h=5, w=5, k=1, r=3, s=3, stride=(2, 2)).per_axis
    d = ConvProblem(n=1, c=1, h=9, w=9, k=1, r=3, s=3, dilation=(2, 3))
    assert (d.eff_r, d.eff_s, d.p, d.q) == (5, 7, 5, 3)


@pytest.mark.parametrize("text", [
    "n=1,c=3,h=9,w=20,k=4,r=1,s=7,stride=2x1,pad=0x3",
    "n=1,c=3,h=9,w=20,k=4,r=1,s=7,stride_h=2,stride_w=1,pad_h=0,padding_w=3",
])
def test_per_axis_specs_read_back_in_the_shortest_form(text):
    p = parse_spec(text)
    assert p.stride == (2, 1) and p.pad == (0, 3)
    assert p.spec() == "n=1,c=3,h=9,w=20,k=4,r=1,s=7,stride=2x1,pad=0x3"
    assert parse_spec(p.spec()) == p
    assert parse_spec("n=1,c=1,h=5,w=5,k=1,r=3,s=3,stride_h=2,stride_w=2").spec() == \
        "n=1,c=1,h=5,w=5,k=1,r=3,s=3,stride=2"


@pytest.mark.parametrize("text, msg", [
    ("n=1,c=1,h=5,w=5,k=1,r=3,s=3,stride=2x", "stride='2x' is not an integer or HxW"),
    ("n=1,c=1,h=5,w=5,k=1,r=3,s=3,stride=2x1x1", "stride='2x1x1' is not an integer or HxW"),
    ("n=1,c=1,h=5,w=5,k=1,r=3,s=3,stride_h=2", "stride_h and stride_w go together"),
    ("n=1,c=1,h=5,w=5,k=1,r=3,s=3,stride_h=2,stride_w=1,stride=2", "given both whole and per axis"),
    ("n=1,c=1,h=5,w=5,k=1,r=3,s=3,pad_h=1,pad_h=2", "pad_h given twice"),
    ("n=1,c=1,h=5,w=5,k=1,r=3,s=3,stride=0x1", "stride must be >= 1, got 0x1"),
    ("n=1,c=1,h=5,w=5,k=1,r=3,s=3,pad=-1x0", "pad must be >= 0, got -1x0"),
    ("n=1,c=1,h=5,w=5,k=1,r=3,s=3,pad=-1", "pad must be >= 0, got -1"),
    ("n=1,c=1,h=2,w=5,k=1,r=3,s=3,pad=0x1", "filter extent 3 is larger than the padded input h=2+2*0"),
    ("n=4294967296,c=1,h=5,w=5,k=1,r=3,s=3", "n must be at most 2147483647"),
])
def test_malformed_per_axis_specs(text, msg):
    with pytest.raises(ValueError, match=re.escape(msg)):
        parse_spec(text)


def test_a_problem_larger_than_any_machine_is_still_a_problem():
    p = parse_spec("n=99999999,c=99999,h=9999,w=9999,k=64,r=3,s=3,pad=1")
    assert p.x_shape() == (99999999, 99999, 9999, 9999)
