"""Problem files: benchdnn conv descriptors (fields, defaults, deductions, names, refusals, the
shape files' own lines) and CSV, each malformed entry one error naming file, line and field."""

import csv
import dataclasses
import io
import os
from pathlib import Path

import numpy as np
import pytest

from convbench.algos import reference, registry
from convbench.catalogs import problemfile
from convbench.catalogs.layers import CATALOGS
from convbench.catalogs.problemfile import ProblemFileError, descriptor, parse, read
from convbench.core.problem import ConvProblem
from convbench.measure import opcount, verify

# Lines of oneDNN's own shape files (tests/benchdnn/inputs/conv/), kept as they are written.
SHAPES_ALEXNET = '''# alexnet

g1mb256ic3ih227iw227oc96oh55ow55kh11kw11sh4sw4ph0pw0n"alexnet:conv1"
g2mb256ic96ih27oc256oh27kh5ph2n"alexnet:conv2"
mb256ic256ih13oc384oh13kh3ph1n"alexnet:conv3"
g2mb256ic384ih13oc384oh13kh3ph1n"alexnet:conv4"
g2mb256ic384ih13oc256oh13kh3ph1n"alexnet:conv5"
'''
SHAPES_RESNET_50 = '''# resnet_50

g1mb50ic3ih224iw224oc64oh112ow112kh7kw7sh2sw2ph3pw3n"resnet_50:conv1"
mb50ic64ih56oc256oh56kh1ph0n"resnet_50:res2a_branch1*4"
mb50ic64ih56oc64oh56kh3ph1n"resnet_50:res2a_branch2b*3"
# mb50ic64ih56oc256oh56kh1ph0n"resnet_50:res2a_branch2c"        # res2a_branch1
g1mb50ic256ih56iw56oc512oh28ow28kh1kw1sh2sw2ph0pw0n"resnet_50:res3a_branch1"
'''
SHAPES_GOOGLENET_V3 = '''# googlenet_v3
g1mb22ic3ih299iw299oc32oh149ow149kh3kw3ph0pw0sh2sw2n"googlenet_v3:conv_conv2d"
g1mb22ic128ih17iw17oc128oh17ow17kh1kw7ph0pw3sh1sw1n"googlenet_v3:mixed_4_tower_conv_1_conv2d*2"
g1mb22ic128ih17iw17oc192oh17ow17kh7kw1ph3pw0sh1sw1n"googlenet_v3:mixed_4_tower_conv_2_conv2d"
'''
SHAPES_WAVENET = '''# Wavenet sizes
mb1_g1ic32oc32_iw84350ow84349kw2sw1dw0pw0n"wavenet:conv1d_1"
'''
SHAPES_MEM_STRIDED = ('--strides=903168x1x4032x9::6422528x1x28672x128 g1mb50ic3ih224iw224oc64oh112'
                      'ow112kh7kw7sh2sw2ph3pw3n"resnet_50:conv1"\n--reset\n')
#: (line of shapes_deepbench_*, the DeepBench catalog layer it is)
DEEPBENCH_LINES = [
    ("mb4_ic1ih161iw700_oc32_kh5kw20_sh2sw2_ph0pw0", "deepbench-train", "speech_01"),
    ("mb16_ic3ih224iw224_oc64_kh7kw7_sh2sw2_ph3pw3", "deepbench-train", "vision_13"),
    ("mb16_ic192ih28iw28_oc32_kh5kw5_sh1sw1_ph2pw2", "deepbench-train", "vision_14"),
    ("mb2_ic1ih161iw700_oc32_kh5kw20_sh2sw2_ph0pw0", "deepbench-server", "speech_02"),
    ("mb1_ic64ih112iw112_oc64_kh1kw1_sh1sw1_ph0pw0", "deepbench-device", "resnet_01"),
]


def write(tmp_path, text: str, name: str = "problems.txt") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def fails(tmp_path, text: str, name: str = "problems.txt") -> str:
    path = write(tmp_path, text, name)
    with pytest.raises(ProblemFileError) as info:
        read(path)
    assert "\n" not in str(info.value)
    return str(info.value).removeprefix(path)


# --- real shape files ---------------------------------------------------------------------------
def test_alexnet_shape_file_is_the_studys_alexnet_with_krizhevskys_groups(tmp_path):
    layers = read(write(tmp_path, SHAPES_ALEXNET, "shapes_alexnet"))
    assert [lay.name for lay in layers] == [f"alexnet:conv{i}" for i in range(1, 6)]
    assert {lay.net for lay in layers} == {"shapes_alexnet"}
    study = CATALOGS["alexnet"]
    for lay in layers:
        groups = 1 if lay.name in ("alexnet:conv1", "alexnet:conv3") else 2
        want = study[lay.name.split(":")[1]].problem
        assert lay.problem == dataclasses.replace(want, groups=groups)
        assert lay.count == 1


def test_resnet_50_shape_file_counts_and_comments(tmp_path):
    layers = read(write(tmp_path, SHAPES_RESNET_50))
    assert [(lay.name, lay.count) for lay in layers] == [
        ("resnet_50:conv1", 1), ("resnet_50:res2a_branch1*4", 4),
        ("resnet_50:res2a_branch2b*3", 3), ("resnet_50:res3a_branch1", 1)]
    conv1, res2a, branch2b, res3a = (lay.problem for lay in layers)
    assert conv1 == CATALOGS["resnet50"]["conv1"].problem.with_batch(50)
    assert res2a == ConvProblem(50, 64, 56, 56, 256, 1, 1)
    assert (branch2b.r, branch2b.pad, branch2b.p) == (3, 1, 56)
    assert (res3a.stride, res3a.pad, res3a.p) == (2, 0, 28)


def test_googlenet_v3_per_axis_kernels_and_padding(tmp_path):
    layers = read(write(tmp_path, SHAPES_GOOGLENET_V3))
    first, one_by_seven, seven_by_one = (lay.problem for lay in layers)
    assert (first.stride, first.pad, first.p) == (2, 0, 149)
    assert (one_by_seven.r, one_by_seven.s, one_by_seven.pad) == (1, 7, (0, 3))
    assert (seven_by_one.r, seven_by_one.s, seven_by_one.pad) == (7, 1, (3, 0))
    assert [lay.count for lay in layers] == [1, 2, 1]
    assert all(lay.problem.p == lay.problem.q for lay in layers[1:])


def test_a_1d_shape_is_height_one(tmp_path):
    (layer,) = read(write(tmp_path, SHAPES_WAVENET))
    assert layer.problem == ConvProblem(1, 32, 1, 84350, 32, 1, 2)
    assert layer.problem.q == 84349


def test_memory_strides_are_skipped(tmp_path):
    (layer,) = read(write(tmp_path, SHAPES_MEM_STRIDED))
    assert layer.problem == CATALOGS["resnet50"]["conv1"].problem.with_batch(50)


@pytest.mark.parametrize("line, net, name", DEEPBENCH_LINES)
def test_onednns_deepbench_lines_are_the_deepbench_catalogs(line, net, name):
    problem, label = descriptor(line)
    assert label is None and problem == CATALOGS[net][name].problem


# --- descriptor fields, defaults and deduction --------------------------------------------------
@pytest.mark.parametrize("text, want", [
    # defaults: mb 2, g 1, stride 1, dilation 0 (ConvProblem's 1), padding 0, square from h
    ("ic3ih5oc4kh3", ConvProblem(2, 3, 5, 5, 4, 3, 3)),
    ("mb8_ic3_ih5_oc4_kh3_", ConvProblem(8, 3, 5, 5, 4, 3, 3)),
    ("oc4kh3ic3ih5mb1", ConvProblem(1, 3, 5, 5, 4, 3, 3)),
    # the square rule copies every h entry to w: size, kernel, stride, padding, dilation
    ("ic3ih9oc4kh3sh2ph1dh1", ConvProblem(2, 3, 9, 9, 4, 3, 3, stride=2, pad=1, dilation=2)),
    # per axis
    ("ic1ih10iw20oc1kh3kw5sh2sw1ph1pw2",
     ConvProblem(2, 1, 10, 20, 1, 3, 5, stride=(2, 1), pad=(1, 2))),
    ("ic1ih10iw10oc1kh3kw3dh1dw0", ConvProblem(2, 1, 10, 10, 1, 3, 3, dilation=(2, 1))),
    # only w: 1-D, as height 1
    ("ic8iw16oc8kw3pw1", ConvProblem(2, 8, 1, 16, 8, 1, 3, pad=(0, 1))),
    # a depth of 1 is 2-D
    ("mb2ic16id1ih5iw5oc16kd1kh3kw3", ConvProblem(2, 16, 5, 5, 16, 3, 3)),
    # groups
    ("g2mb256ic96ih27oc256oh27kh5ph2", ConvProblem(256, 96, 27, 27, 256, 5, 5, pad=2, groups=2)),
    ("g32ic32ih14oc32kh3ph1", ConvProblem(2, 32, 14, 14, 32, 3, 3, pad=1, groups=32)),
])
def test_descriptor_fields_and_defaults(text, want):
    assert descriptor(text) == (want, None)


@pytest.mark.parametrize("text, p, pad", [
    ("ic1ih10oc1kh3dh1", 6, 0),             # output from input, dilated kernel, padding 0
    ("ic1ih227oc1kh11sh4", 55, 0),           # strided, the last rows unread
    ("ic1ih13oc1oh13kh3", 13, 1),            # padding deduced from the output: (12-13+3)/2
    ("ic1ih227oc1oh55kh11sh4", 55, 0),       # (216-227+11)/2 = 0, right padding 0
    ("ic1ih224oc1oh112kh7sh2ph3", 112, 3),   # right padding 2 < 3: that row is never read
    ("ic1ih28oc1oh28kh5dh1ph4", 28, 4),      # dilated: extent 9
    ("ic1ih14oc1oh7kh1sh2", 7, 0),           # (12-14+1)/2 truncates toward zero: 0
])
def test_output_and_padding_deduction(text, p, pad):
    problem, _ = descriptor(text)
    assert (problem.p, problem.pad) == (p, pad)


def test_the_batch_option_replaces_the_descriptors_batch():
    assert descriptor("mb4ic1ih5oc1kh3", mb=16)[0].n == 16
    assert descriptor("mb0ic1ih5oc1kh3", mb=16)[0].n == 16


@pytest.mark.parametrize("text, name", [
    ('ic1ih5oc1kh3n"alexnet:conv2"', "alexnet:conv2"),
    ("ic1ih5oc1kh3_nplain", "plain"),
    ("ic1ih5oc1kh3n'single'", "single"),
    ('ic1ih5oc1kh3n""', None),
    ('ic1ih5oc1kh3n"x*4"', "x*4"),
])
def test_names(text, name):
    assert descriptor(text)[1] == name


@pytest.mark.parametrize("text, msg", [
    ("ic3id8ih8iw8oc4kd3kh3kw3", "id: 3-D convolution (id=8, kd=3, od=6): convbench runs 2-D"),
    ("ic3id8oc4kd3", "id: 3-D convolution (id=8, kd=3, od=6): convbench runs 2-D"),
    ("ic3id1ih5oc4kd1kh3", ("iw: a descriptor with depth gives both height and width entries, "
                           "or neither")),
    ("ic3ih5iw5oc4kh3", "kw: not given, or 0, though the descriptor gives the width axis"),
    ("ic3oc4", "ih: no spatial size: give ih and kh (or iw and kw for 1-D)"),
    ("ih5oc4kh3", "ic: not given, or 0"),
    ("ic3ih5oc4kh3xx", "descriptor: unrecognized entry at 'xx' in 'ic3ih5oc4kh3xx'"),
    ("_ic3ih5oc4kh3", "descriptor: unrecognized entry at '_ic3ih5oc4kh3'"),
    ("ic3ihoc4kh3", "ih: no value in 'ic3ihoc4kh3'"),
    ("ic3ih5oc4kh3ph-1", "ph: must not be negative"),
    ("ic3ih5oc4kh3ic4", "ic: given twice"),
    ("g2ic3ih5oc4kh3", "g: 2 groups do not divide ic=3"),
    ("g0ic3ih5oc4kh3", "g: must be at least 1"),
    ("mb0ic3ih5oc4kh3", "mb: must be positive, got 0"),
    ("ic3ih5oc4kh3sh0", "sh: must be at least 1"),
    ('ic3ih5oc4kh3n"open', "n: unbalanced quote in the name '\"open'"),
    ("ic1ih4oc1kh5sh1", ("kh: kernel extent 5 is larger than the padded input ih=4+2*0 "
                        "(oh would be 0)")),
    ("ic1ih10oc1oh5kh3", "ph: deduced as -1 from oh=5, ih=10, kh=3, sh=1: negative padding"),
    ("ic3ih2147483648oc4kh3", "ih: must be at most 2147483647"),
])
def test_descriptor_errors_name_the_field(text, msg):
    with pytest.raises(ValueError) as info:
        descriptor(text)
    assert str(info.value).startswith(msg)


@pytest.mark.parametrize("text, pad, p", [
    # benchdnn pads 2 before and 3 after (TensorFlow's SAME)
    ("ic1ih224oc1oh112kh7sh2", ((2, 3), (2, 3)), 112),
    ('ic32oc13_ih13oh12kh3ph0_n"tails_conv:1"', ((0, 1), (0, 1)), 12),
    ('mb1_ic3oc32_ih512oh256kh3sh2dh0ph0_iw512ow256kw3sw2dw0pw0_n"efficientdet:conv1"',
     ((0, 1), (0, 1)), 256),
    # the padding after is 3 short of 1 before: the last 2 input rows are never read
    ("ic1ih13oc1oh10kh3ph1", ((1, -2), (1, -2)), 10),
    # 1-D (the height is 1 row), dilated: 3 before, none after
    ("ic8oc8_iw5ow2kw3sw1dw2pw3", ((0, 0), (3, 0)), 2),
    # shapes_dw_2d_strided_no-padding's "ph-bottom(1)": the kernel fits only with it
    ("mb1_g16_ic16oc16_kh3kw1_ih2iw1_oh1ow1_sh2sw1_ph0pw0_dh0dw0", ((0, 1), (0, 0)), 1),
    # benchdnn's division truncates toward zero: (4-5)/2 is 0, so oh is 1 and it pads 1 after
    ("ic1ih4oc1kh5sh2", ((0, 1), (0, 1)), 1),
    # short of the padding before by less than a stride: the same convolution as symmetric
    ("ic1ih224oc1oh112kh7sh2ph3", 3, 112),
])
def test_padding_after_is_benchdnns(text, pad, p):
    problem, _ = descriptor(text)
    assert problem.pad == pad
    assert problem.p == p or problem.q == p


def test_a_negative_deduced_padding_before_is_an_error():
    """benchdnn's divisions truncate toward zero: (4-10+3)/2 is -1, not -2; a padding before
    that is negative is not a convolution convbench holds."""
    with pytest.raises(ValueError, match="ph: deduced as -1 from"):
        descriptor("ic1ih10oc1oh5kh3")


# --- benchdnn files ---------------------------------------------------------------------------
def test_file_errors_name_file_line_and_field(tmp_path):
    text = "# comment\n\nic1ih5oc1kh3\nic1ih5oc1kh9  # too big\nic1ih5oc1kh3\n"
    assert fails(tmp_path, text) == (":4: kh: kernel extent 9 is larger than the padded input "
                                     "ih=5+2*0 (oh would be -3)")


def test_options(tmp_path):
    text = ("--dir=FWD_D,BWD_D --dt=f32 --cfg=f32 --attr-post-ops=relu --alg=direct\n"
            "ic1ih5oc1kh3\n--mb=8\nic1ih5oc1kh3n\"a\" mb4ic1ih5oc1kh3\n--mb=0\nmb3ic1ih5oc1kh3\n"
            "--mb=16\n--reset\nic1ih5oc1kh3\n")
    layers = read(write(tmp_path, text))
    assert [(lay.name, lay.problem.n) for lay in layers] == [
        ("line2", 2), ("a", 8), ("line4", 8), ("line6", 3), ("line9", 2)]


@pytest.mark.parametrize("line, msg", [
    ("--batch=shapes_alexnet", (":2: --batch: 'shapes_alexnet': includes another file; give that "
                               "file itself")),
    ("--match=.*kh3.*", ":2: --match: filters problems by a regular expression"),
    ("--mb=1,4,8", (":2: --mb: '1,4,8' is not one batch size (a list runs each problem at each "
                   "batch: give one, or use convbench's --batch)")),
    ("--mb=x", ":2: --mb: 'x' is not one batch size"),
    ("--mode=P", ":2: --mode: not an option convbench reads in a problem file"),
    ("ic1ih5oc1kh3 \\", ":2: line: continues on the next"),
])
def test_options_refused(tmp_path, line, msg):
    assert fails(tmp_path, f"ic1ih5oc1kh3\n{line}\nkh3\n").startswith(msg)


def test_names_are_unique_and_default_to_the_line(tmp_path):
    text = ('ic1ih5oc1kh3n"x" ic1ih6oc1kh3n"x"\n'
            'ic1ih7oc1kh3 ic1ih8oc1kh3\nic1ih9oc1kh3n"x"\nic1ih5oc1kh3n"x#2"\n')
    layers = read(write(tmp_path, text))
    assert [lay.name for lay in layers] == ["x", "x#2", "line2", "line2#2", "x#3", "x#2#2"]
    assert [lay.problem.h for lay in layers] == [5, 6, 7, 8, 9, 5]


def test_a_comment_with_a_comma_does_not_make_csv(tmp_path):
    (layer,) = read(write(tmp_path, "ic1ih5oc1kh3  # small, square\n"))
    assert layer.problem == ConvProblem(2, 1, 5, 5, 1, 3, 3)


def test_net_and_batch(tmp_path):
    path = write(tmp_path, SHAPES_ALEXNET, "shapes_alexnet.txt")
    layers = read(path, net="ours", batch=4)
    assert {(lay.net, lay.problem.n) for lay in layers} == {("ours", 4)}
    assert {lay.net for lay in read(path)} == {"shapes_alexnet"}


@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n   \n"])
def test_empty_file(tmp_path, text):
    assert fails(tmp_path, text) == ":1: file: no problems in it (empty, or only blank lines " \
                                    "and comments)"


def test_a_file_of_options_only(tmp_path):
    assert fails(tmp_path, "--reset\n--mb=2\n") == ":2: file: no problems in it"


def test_a_missing_file(tmp_path):
    with pytest.raises(ProblemFileError, match=r"nope.txt: file: cannot read it: No such file"):
        read(tmp_path / "nope.txt")


# --- CSV --------------------------------------------------------------------------------------
def test_csv_with_defaults_names_and_per_axis_forms(tmp_path):
    text = ("# from a spreadsheet\n"
            "name,n,c,h,w,k,r,s,stride,pad\n"
            "conv1,8,3,227,227,96,11,11,4,0\n"
            "\n"
            "wide,1,1,10,20,1,3,5,2x1,1x2\n"
            ",1,1,5,5,1,3,3,,\n")
    a, b, c = read(write(tmp_path, text, "p.csv"))
    assert (a.name, a.problem) == ("conv1", ConvProblem(8, 3, 227, 227, 96, 11, 11, stride=4))
    assert b.problem == ConvProblem(1, 1, 10, 20, 1, 3, 5, stride=(2, 1), pad=(1, 2))
    assert (c.name, c.problem, c.count) == ("line6", ConvProblem(1, 1, 5, 5, 1, 3, 3), 1)
    assert {lay.net for lay in (a, b, c)} == {"p"}


def test_csv_columns_per_axis_aliases_and_count(tmp_path):
    text = ("layer, N, c, h, w, k, r, s, stride_h, stride_w, pad_h, pad_w, dil_h, dil_w, g, count\n"
            "x, 2, 4, 9, 9, 4, 3, 3, 2, 1, 1, 0, 2, 1, 2, 3\n"
            "y, 2, 4, 9, 9, 4, 3, 3, , , , , , , , \n")
    x, y = read(write(tmp_path, text))
    assert x.problem == ConvProblem(2, 4, 9, 9, 4, 3, 3, stride=(2, 1), pad=(1, 0),
                                    dilation=(2, 1), groups=2)
    assert (x.name, x.count) == ("x", 3)
    assert y.problem == ConvProblem(2, 4, 9, 9, 4, 3, 3)


def test_csv_padding_before_and_after(tmp_path):
    text = ("n,c,h,w,k,r,s,stride,pad\n1,1,13,13,1,3,3,1,0+1\n1,1,13,13,1,3,3,1,1+-2x0+1\n"
            "1,1,13,13,1,3,3,1,x\n")
    assert fails(tmp_path, text, "p.csv").startswith(
        ":4: pad: 'x' is not a whole number or HxW (2 or 2x1, before+after: 0+1 or 0+1x1)")
    a, b = read(write(tmp_path, text.rsplit("\n", 2)[0] + "\n", "q.csv"))
    assert (a.problem.pad, b.problem.pad) == (((0, 1), (0, 1)), ((1, -2), (0, 1)))
    per_axis = "n,c,h,w,k,r,s,pad_h,pad_w\n1,1,13,13,1,3,3,0+1,1\n"
    assert read(write(tmp_path, per_axis, "r.csv"))[0].problem.pad == ((0, 1), (1, 1))


def test_csv_reads_back_what_a_problem_writes():
    problems = [ConvProblem(8, 96, 27, 27, 256, 5, 5, pad=2, groups=2),
                ConvProblem(1, 1, 10, 20, 1, 3, 5, stride=(2, 1), pad=(1, 2), dilation=(1, 3)),
                ConvProblem(1, 1, 10, 20, 1, 3, 5, pad=((1, -2), (0, 2)))]
    out = io.StringIO()
    writer = csv.DictWriter(out, ["layer", *problems[0].axis_fields()])
    writer.writeheader()
    writer.writerows({"layer": f"l{i}", **p.axis_fields()} for i, p in enumerate(problems))
    assert [lay.problem for lay in parse(out.getvalue(), "rows.csv")] == problems


@pytest.mark.parametrize("text, msg", [
    ("n,c,h,w,k,r,s,algo\n", ":1: algo: unknown column; valid: n, c, h, w, k, r, s, stride"),
    ("n,c,h,w,k,r\n", ":1: s: required column missing (the header needs n, c, h, w, k, r, s)"),
    ("n,c,h,w,k,r,s,pad,padding\n", ":1: padding: given twice (as 'pad' and 'padding')"),
    ("n,c,h,w,k,r,s,stride_h\n", ":1: stride_h: stride_h and stride_w go together"),
    ("n,c,h,w,k,r,s,stride,stride_h,stride_w\n", (":1: stride: given both as one column and per "
                                                 "axis")),
    ("n,c,h,w,k,r,s\n1,2,3\n", ":2: row: 3 cells for the header's 7 columns"),
    ("n,c,h,w,k,r,s\n1,x,5,5,1,3,3\n", ":2: c: 'x' is not a whole number"),
    ("n,c,h,w,k,r,s\n1,-1,5,5,1,3,3\n", ":2: c: '-1' is not a whole number"),
    ("n,c,h,w,k,r,s\n1,,5,5,1,3,3\n", ":2: c: empty"),
    ("n,c,h,w,k,r,s\n0,1,5,5,1,3,3\n", ":2: n: must be positive, got 0"),
    ("n,c,h,w,k,r,s,stride\n1,1,5,5,1,3,3,2x\n", ":2: stride: '2x' is not a whole number or HxW"),
    ("n,c,h,w,k,r,s,stride_h,stride_w\n1,1,5,5,1,3,3,2,\n", (":2: stride_w: empty while stride_h "
                                                            "is given")),
    ("n,c,h,w,k,r,s,groups\n1,3,5,5,4,3,3,2\n", ":2: groups: groups=2 does not divide c=3"),
    ("n,c,h,w,k,r,s\n1,1,3,3,1,5,5\n", (":2: r: filter extent 5 is larger than the padded input "
                                       "h=3+2*0")),
    ("n,c,h,w,k,r,s,count\n1,1,5,5,1,3,3,0\n", ":2: count: must be at least 1"),
    ("n,c,h,w,k,r,s\n# nothing\n", ":1: file: no problems in it"),
    ("# rows\nn,c,h,w,k,r,s\n1,1,5,5,1,3,3\n\n1,1,5,5,1,3,x\n", (":5: s: 'x' is not a whole "
                                                                 "number")),
])
def test_csv_errors(tmp_path, text, msg):
    assert fails(tmp_path, text, "p.csv").startswith(msg)


def test_the_error_is_a_value_error_with_its_parts(tmp_path):
    path = write(tmp_path, "ic1ih5oc1kh3\nic1ih5oc1kh9\n")
    with pytest.raises(ValueError) as info:
        read(path)
    err = info.value
    assert isinstance(err, problemfile.ProblemFileError)
    assert (err.source, err.line, err.field) == (path, 2, "kh")


# --- padding before and after, and lines convbench skips ------------------------------------
# Lines of oneDNN's shape files (shapes_tails, shapes_dilated, shapes_regression_padding,
# shapes_dw_2d_strided_no-padding, shapes_3d), as written: benchdnn deduces the padding after.
PADDED_UNEQUALLY = '''# tails
mb1ic32oc13_ih13oh12kh3ph0_n"tails_conv:1"
mb1_ic16oc16_kh3kw1_ih2iw1_oh1ow1_sh2sw1_ph0pw0_dh0dw0n"dw_128_ph-bottom(1)"
mb1_g16_ic16oc16_kh2kw1_ih202iw1_oh23ow1_sh9sw1_ph0pw0_dh0dw0n"dw_125_ph-bottom(-2)"
mb1ic8ih13oc8oh10kh3ph1n"unread"
mb1_ic16oc16_kd1kh3kw1_id1ih3iw1_od1oh1ow1_sd1sh1sw1_pd0ph0pw0_dd0dh3dw0n"ph-bottom(6)"
mb1ic16id10ih10iw10oc16od10oh10ow10kd3kh3kw3pd1ph1pw1n"conv3d"
'''


def test_padding_after_and_skipped_lines(tmp_path):
    """More after than before, fewer after than before (a negative padding after leaves input
    rows unread), a kernel that fits only with the padding after, and a 3-D line: skipped with
    its reason when asked, an error otherwise."""
    path = write(tmp_path, PADDED_UNEQUALLY, "shapes_mixed")
    skipped = []
    layers = read(path, skipped=skipped)
    pads = {lay.name: lay.problem.pad for lay in layers}
    assert pads == {"tails_conv:1": ((0, 1), (0, 1)),          # after > before
                    "dw_128_ph-bottom(1)": ((0, 1), (0, 0)),  # the kernel needs the row after
                    # 2 short of 0 after, less than the stride 9: the same as 0 both sides
                    "dw_125_ph-bottom(-2)": 0,
                    "unread": ((1, -2), (1, -2)),             # before > after: 2 rows unread
                    "ph-bottom(6)": ((0, 6), (0, 0))}
    assert [lay.problem.p for lay in layers] == [12, 1, 23, 10, 1]
    (skip,) = skipped
    assert (skip.line, skip.name, skip.field) == (7, "conv3d", "id")
    assert str(skip) == (f"{path}:7: id: 3-D convolution (id=10, kd=3, od=10): convbench "
                         "runs 2-D")
    with pytest.raises(ProblemFileError, match=r":7: id: 3-D convolution"):
        read(path)


def test_a_file_of_skipped_lines_only(tmp_path):
    path = write(tmp_path, "mb1ic16id10ih10iw10oc16od10oh10ow10kd3kh3kw3pd1ph1pw1\n")
    with pytest.raises(ProblemFileError, match=r":1: file: no problems in it that convbench runs "
                                               r"\(1 skipped, the first: id: 3-D"):
        read(path, skipped=[])


def test_a_malformed_line_still_refuses_the_file(tmp_path):
    path = write(tmp_path, PADDED_UNEQUALLY + "ic1ih5oc1kh3xx\n")
    with pytest.raises(ProblemFileError, match=r":8: descriptor: unrecognized entry"):
        read(path, skipped=[])


# --- oneDNN's own files, where they are ----------------------------------------------------
#: A folder holding oneDNN's tests/benchdnn/inputs/conv (its shapes_* files), if given.
ONEDNN_INPUTS = os.environ.get("CONVBENCH_BENCHDNN_INPUTS")


def _shape_files() -> list:
    if not ONEDNN_INPUTS:
        return []
    return sorted(Path(ONEDNN_INPUTS).glob("shapes_*"))


@pytest.mark.slow
@pytest.mark.skipif(not ONEDNN_INPUTS, reason="set CONVBENCH_BENCHDNN_INPUTS to a folder of "
                                              "oneDNN's tests/benchdnn/inputs/conv files")
@pytest.mark.parametrize("path", _shape_files(), ids=lambda p: p.name)
def test_onednns_shape_files_read_and_run(path):
    """Every shape file reads (3-D lines skipped with their reasons; a file of 3-D lines only
    says so); each 2-D problem at batch 1 is run forward by every CPU algorithm that takes it,
    both layouts, and checked against float64 (every other algorithm gives a one-line reason)."""
    skipped: list = []
    try:
        layers = read(path, batch=1, skipped=skipped)
    except ProblemFileError as err:
        assert skipped or "no problems in it" in str(err), err
        assert all("3-D convolution" in s.what for s in skipped), skipped
        return
    # 3-D lines, and sizes past ConvProblem's 32-bit limit (shapes_large_conv's overflow tests)
    assert all(s.field in ("id", "iw", "ih") or "must be at most" in s.what
               for s in skipped), skipped
    impls = registry.implementations("numpy")
    for problem in dict.fromkeys(lay.problem for lay in layers):
        if problem.min_bytes() > 256 << 20:  # past what a CI machine's test should allocate
            continue
        for layout in ("nchw", "nhwc"):
            a, b = reference.random_operands(problem, "fwd", layout, np.float32)
            ref = reference.reference(problem, "fwd", layout, a, b)
            for impl in impls:
                reason = registry.supports(impl, problem, "fwd", layout, "fp32")
                if reason:
                    assert "\n" not in reason
                    continue
                if (opcount.workspace_bytes(impl, problem, "fwd", layout, "fp32") or 0) > 1 << 30:
                    continue  # an `oom` row under `--memory-limit 1GiB` (FFT's 33 GiB spectra)
                out = reference.nan_output(problem, "fwd", layout)
                impl.prepare(problem, "fwd", layout, "fp32")(a, b, out)
                chk = verify.check(out, ref, impl.algo, "fp32", problem, "fwd")
                assert chk.ok, f"{path.name} {impl.algo} {layout} {problem}: {chk.reason}"
