"""Padding that differs before and after: ConvProblem's forms, the explicit pad or crop that
runs it where an implementation pads both sides alike, every algorithm checked against float64
on problems padded unequally (all passes, both layouts), the timing of the explicit step apart,
and plans and rows that keep the padding."""

import dataclasses
import json
import re

import numpy as np
import pytest

from convbench import testing
from convbench.algos import padding, reference, registry
from convbench.algos.phases import CONVOLUTION, CROP, EXPLICIT_PAD, OUTPUT_COPY
from convbench.catalogs.layers import Layer
from convbench.core import results
from convbench.core.problem import LAYOUTS, PASSES, ConvProblem, pair_text, parse_spec
from convbench.measure import runner
from convbench.planning import planschema

ASYM = testing.ASYMMETRIC_PROBLEMS


# --- the problem ------------------------------------------------------------------------------
@pytest.mark.parametrize("pad, text, kept", [
    (((0, 1), (0, 1)), "0+1", ((0, 1), (0, 1))),
    ("0+1", "0+1", ((0, 1), (0, 1))),
    ("0+1x1", "0+1x1", ((0, 1), (1, 1))),
    (((0, 1), 1), "0+1x1", ((0, 1), (1, 1))),
    ("1x0+1", "1x0+1", ((1, 1), (0, 1))),
    # sides alike are the old forms
    (((1, 1), (2, 2)), "1x2", (1, 2)),
    ("1+1", "1", 1),
])
def test_pad_forms_and_their_shortest_text(pad, text, kept):
    p = ConvProblem(1, 1, 8, 8, 1, 3, 3, pad=pad)
    assert p.pad == kept and pair_text(p.pad) == text
    assert parse_spec(p.spec()) == p and hash(parse_spec(p.spec())) == hash(p)


def test_the_padding_after_is_kept_in_one_form():
    # stride 2: padding 3 after gives the output that 2 after gives, and 3 before and after
    # the one 3 before and 2 after gives (the row past the last window is never read)
    a = ConvProblem(1, 1, 224, 224, 1, 7, 7, stride=2, pad=((2, 3), (2, 4)))
    assert a.pad == ((2, 3), (2, 3)) and a.p == a.q == 112
    assert ConvProblem(1, 1, 224, 224, 1, 7, 7, stride=2, pad=((3, 2), (3, 2))).pad == 3
    # fewer after: the last rows are never read, kept as a negative padding after
    b = ConvProblem(1, 1, 13, 13, 1, 3, 3, pad="1+-2")
    assert (b.pad_top, b.pad_bottom, b.pad_left, b.pad_right, b.p) == (1, -2, 1, -2, 10)


def test_sides_and_the_symmetric_part():
    p = ConvProblem(2, 3, 10, 9, 4, 3, 2, pad=((1, -2), (0, 1)))
    with pytest.raises(ValueError, match="differs before and after"):
        p.pad_h  # noqa: B018  (a property that raises)
    sym, explicit = p.symmetric_part()
    assert explicit == (0, 1, 1, -2)  # F.pad's (left, right, top, bottom)
    assert (sym.h, sym.w, sym.pad, sym.p, sym.q) == (9, 10, 0, p.p, p.q)
    assert p.torch_args() == {"stride": (1, 1), "padding": (0, 0), "dilation": (1, 1),
                              "groups": 1}
    same = ConvProblem(1, 1, 8, 8, 1, 3, 3, pad=(1, 2))
    assert same.symmetric_part() == (same, (0, 0, 0, 0))
    assert same.torch_args()["padding"] == (1, 2)


@pytest.mark.parametrize("spec, msg", [
    ("n=1,c=1,h=5,w=5,k=1,r=3,s=3,pad=-1+1", "pad must be >= 0 before, got -1+1"),
    ("n=1,c=1,h=3,w=5,k=1,r=5,s=3,pad=0+1x1",
     "filter extent 5 is larger than the padded input h=3+0+1"),
    ("n=1,c=1,h=5,w=5,k=1,r=3,s=3,pad=0+1+2", "is not an integer or HxW"),
    ("n=1,c=1,h=5,w=5,k=1,r=3,s=3,stride=1+2", "stride='1+2' is not an integer or HxW"),
])
def test_malformed_padding(spec, msg):
    with pytest.raises(ValueError, match=re.escape(msg)):
        parse_spec(spec)


def test_spec_per_axis_keys_take_sides():
    p = parse_spec("n=1,c=1,h=8,w=8,k=1,r=3,s=3,pad_h=0+1,pad_w=1")
    assert p.pad == ((0, 1), (1, 1))


# --- the explicit step ------------------------------------------------------------------------
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("problem", ASYM, ids=str)
def test_explicit_pad_is_torchs_pad(problem, layout):
    """PadInput gives F.pad's result; CropOutput inverts it (zeros where rows were cut)."""
    import torch
    import torch.nn.functional as F

    x = np.random.default_rng(0).standard_normal(problem.x_shape("nchw"))
    _, explicit = problem.symmetric_part()
    want = F.pad(torch.from_numpy(x), explicit).numpy()
    got = padding.PadInput(problem, layout, explicit)(reference.to_layout(x, layout))
    np.testing.assert_array_equal(reference.from_layout(got, layout), want)
    crop = padding.CropOutput(problem, layout, explicit)
    crop.target(x)[...] = reference.to_layout(want, layout)
    out = np.full(problem.x_shape(layout), np.nan)
    crop(out)
    back = F.pad(torch.from_numpy(want), tuple(-v for v in explicit)).numpy()
    np.testing.assert_array_equal(reference.from_layout(out, layout), back)


# --- every algorithm --------------------------------------------------------------------------
def _expected_support(algo: str, problem: ConvProblem) -> bool | None:
    """Whether `algo` must run `problem` (None: either way, with a reason if not)."""
    if algo in ("direct", "gemm", "torch-cpu"):
        return True
    if algo.startswith("fft"):
        return problem.stride == 1 and problem.dilation == 1 and problem.groups == 1
    return None


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("pass_", PASSES)
@pytest.mark.parametrize("problem", ASYM, ids=str)
@pytest.mark.parametrize("algo", registry.algos_for("numpy"))
def test_cpu_algorithms_match_float64(algo, problem, pass_, layout):
    impl = registry.get(algo, "numpy")
    precision = "fp64" if "fp64" in impl.precisions else "fp32"
    reason = registry.supports(impl, problem, pass_, layout, precision)
    must = _expected_support(algo, problem)
    if must is not None:
        assert (reason is None) == must, reason
    if reason is not None:
        assert reason and "\n" not in reason
        return
    chk = testing.run_and_check(impl, problem, pass_, layout, precision, seed=1)
    assert chk.ok, f"{algo} {pass_} {layout} {problem}: {chk.reason}"


@pytest.mark.parametrize("problem", [
    ASYM[0],
    # what both sides share is 0 along the height and 1 along the width, a padding per axis
    # Winograd does not take: every side is padded explicitly instead
    ConvProblem(n=1, c=2, h=8, w=8, k=3, r=3, s=3, pad=((0, 1), (1, 1))),
], ids=str)
def test_winograd_runs_a_3x3_stride_1_problem_padded_unequally(problem):
    for algo in ("winograd-2x2", "winograd-4x4"):
        impl = registry.get(algo, "numpy")
        for pass_ in PASSES:
            assert registry.supports(impl, problem, pass_, "nchw", "fp32") is None
            assert testing.run_and_check(impl, problem, pass_, "nchw", "fp32").ok
            sym, _, _ = impl.route(problem, pass_, "nchw", "fp32")
            assert sym.pad == 0
    note = registry.get("winograd-2x2", "numpy").describe(problem, "fwd", "nchw", "fp32")
    assert note.endswith("(timed apart), then padding 0")


def test_winograd_says_why_not_in_one_line():
    problem = ASYM[1]  # stride 2
    reason = registry.supports(registry.get("winograd-2x2", "numpy"), problem, "fwd", "nchw",
                               "fp32")
    assert reason == ("winograd-2x2 needs 5x5 to 10x10 filters at stride 2 (3x3 or 5x5 per phase) "
                      "(got 3x3) (padding 2+0x1 runs as 0x1 after an explicit pad)")


@pytest.mark.parametrize("pass_", PASSES)
@pytest.mark.parametrize("problem", ASYM[:4], ids=str)
@pytest.mark.parametrize("algo", ["direct", "gemm"])
def test_emulated_kernels_run_it_natively(algo, problem, pass_):
    """kernels/direct.cu and im2col.cu take the padding before and the output size: the real
    kernel sources, emulated, on both layouts."""
    impl = testing.runnable(algo, "emu")
    assert not isinstance(impl, registry.ExplicitPad)
    for layout in LAYOUTS:
        assert registry.supports(impl, problem, pass_, layout, "fp32") is None
        chk = testing.run_and_check(impl, problem, pass_, layout, "fp32")
        assert chk.ok, f"{algo} emu {pass_} {layout} {problem}: {chk.reason}"


def test_native_and_routed_implementations():
    for algo in ("direct", "gemm"):
        assert not isinstance(registry.get(algo, "numpy"), registry.ExplicitPad)
    assert isinstance(registry.get("torch-cpu", "numpy"), registry.ExplicitPad)
    for algo in ("fft", "winograd-2x2"):  # behind the dilation split (tests/test_dilation.py)
        assert isinstance(registry.get(algo, "numpy").inner, registry.ExplicitPad)


@pytest.mark.parametrize("pass_", PASSES)
def test_the_explicit_step_is_a_phase_that_replays(pass_):
    for algo in ("torch-cpu", "fft", "gemm"):
        testing.assert_phases_replay(registry.get(algo, "numpy"), ASYM[0], pass_, "nhwc") \
            if registry.get(algo, "numpy").phases(ASYM[0], pass_, "nhwc", "fp32") else None
    impl = registry.get("torch-cpu", "numpy")
    names = impl.phases(ASYM[0], pass_, "nchw", "fp32")
    want = ([CONVOLUTION, OUTPUT_COPY, CROP] if pass_ == "bwd_data"
            else [EXPLICIT_PAD, CONVOLUTION, OUTPUT_COPY])
    assert names == want


def test_the_explicit_pad_is_timed_apart_and_said():
    layer = Layer("t", "asym", ASYM[1])
    cases = runner.sweep([layer], ["torch-cpu", "direct"], "numpy", ["fwd"], ["nchw"], ["fp32"])
    rows = {r["algo"]: r for r in runner.run(cases, 0.002)}
    torch_row, direct = rows["torch-cpu"], rows["direct"]
    assert torch_row["status"] == direct["status"] == "ok"
    phases = results.parse_phases(torch_row["phases_ms"])
    assert list(phases) == [EXPLICIT_PAD, CONVOLUTION, OUTPUT_COPY]
    assert torch_row["median_ms"] == pytest.approx(phases[CONVOLUTION], rel=1e-5)
    assert "x padded explicitly by 2+0x0+0" in torch_row["note"]
    assert "ms explicit pad of x" in torch_row["note"]
    assert "explicit" not in direct["note"]
    assert torch_row["pad"] == "2+0x1"
    assert results.problem_from_row(torch_row) == ASYM[1]
    assert results.problem_from_row({**torch_row, "pad": "2+0x1"}) == ASYM[1]


def test_workspace_counts_the_explicit_buffer():
    from convbench.measure import opcount

    p = ASYM[0]
    sym = p.symmetric_part()[0]
    impl = registry.get("fft", "numpy")
    extra = padding.explicit_bytes(p, "fp32", p.symmetric_part()[1])
    assert extra == sym.n * sym.c * sym.h * sym.w * 4
    assert opcount.workspace_bytes(impl, p, "fwd", "nchw", "fp32") == \
        impl.inner.workspace_bytes(sym, "fwd", "nchw", "fp32") + extra
    assert opcount.theoretical_workspace("fft", p, "fwd") == \
        opcount.theoretical_workspace("fft", sym, "fwd") + extra


# --- plans keep the padding -------------------------------------------------------------------
def test_a_plan_problem_keeps_the_padding_and_old_forms_load():
    p = ASYM[2]
    entry = json.loads(json.dumps(dataclasses.asdict(p)))
    assert entry["pad"] == [[1, -2], [0, 1]]
    assert planschema.problem_field(entry, "problem") == p
    for old in (1, [1, 2]):  # what plans written before padding had sides hold
        old_entry = {**entry, "pad": old}
        assert planschema.problem_field(old_entry, "problem").pad == (tuple(old) if
                                                                  isinstance(old, list) else old)
    with pytest.raises(planschema.Invalid, match=r"expected an integer or \[before, after\]"):
        planschema.problem_field({**entry, "pad": [[0, 1, 2], 1]}, "problem")
    with pytest.raises(planschema.Invalid, match=r"expected an integer >= 0, got -1"):
        planschema.problem_field({**entry, "pad": [[-1, 1], 1]}, "problem")


def test_the_functional_api_takes_sides():
    import torch
    import torch.nn.functional as F

    import convbench

    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((1, 3, 7, 6)), rng.standard_normal((4, 3, 3, 3))
    for algo in ("direct", "fft", "torch-cpu"):
        y = convbench.conv2d(x, w, padding=((0, 1), (2, 1)), algo=algo)
        want = F.conv2d(F.pad(torch.from_numpy(x), (2, 1, 0, 1)), torch.from_numpy(w)).numpy()
        np.testing.assert_allclose(y, want, rtol=1e-9, atol=1e-9)


def test_rows_padded_unequally_and_old_rows_read_back(tmp_path):
    """A run folder's CSV keeps `2+0x1` in the pad column and reads it back as the problem; the
    key matches the case's, so --resume skips it; rows written before (1, 1x2) read as before."""
    old = ConvProblem(1, 3, 8, 8, 4, 3, 3, pad=(1, 2))
    cases = runner.sweep([Layer("t", "asym", ASYM[1]), Layer("t", "old", old)], ["direct"],
                         "numpy", ["fwd"], ["nchw"], ["fp32"])
    rows = runner.run(cases, 0.002)
    results.merge_rows(tmp_path, rows)
    back = results.read_rows(tmp_path / "measurements.csv")
    assert [r["pad"] for r in back] == ["2+0x1", "1x2"]
    assert [results.problem_from_row(r) for r in back] == [ASYM[1], old]
    assert {results.row_key(r) for r in back} == {c.key() for c in cases}
    assert list(results.frame(back)["pad"]) == ["2+0x1", "1x2"]


@pytest.mark.parametrize("pass_", PASSES)
@pytest.mark.parametrize("algo", ["fft", "fft-tiled", "winograd-2x2", "winograd-fused-2x2"])
def test_emulated_kernels_run_it_after_an_explicit_pad(algo, pass_):
    """The FFT and Winograd kernels pad both sides alike: on their grid and in their tiles after
    the explicit pad, which is the same NumPy or CuPy code on every backend."""
    impl = testing.runnable(algo, "emu")
    problem = ASYM[0]
    reason = registry.supports(impl, problem, pass_, "nhwc", "fp32")
    if algo == "winograd-fused-2x2" and pass_ == "bwd_filter":
        assert reason
        return
    assert reason is None
    chk = testing.run_and_check(impl, problem, pass_, "nhwc", "fp32")
    assert chk.ok, f"{algo} emu {pass_} {problem}: {chk.reason}"


@pytest.mark.gpu
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("pass_", PASSES)
@pytest.mark.parametrize("algo", ["direct", "gemm", "gemm-cublas", "fft", "fft-tiled",
                                  "winograd-2x2", "winograd-fused-2x2", "cudnn"])
def test_on_the_gpu(algo, pass_, layout):
    """Natively (direct, gemm) or after the explicit pad (cuDNN, FFT, Winograd), on a GPU."""
    impl = testing.runnable(algo, "cuda")
    for problem in ASYM:
        if registry.supports(impl, problem, pass_, layout, "fp32"):
            assert algo not in ("direct", "gemm", "gemm-cublas", "cudnn")
            continue
        chk = testing.run_and_check(impl, problem, pass_, layout, "fp32")
        assert chk.ok, f"{algo} cuda {pass_} {layout} {problem}: {chk.reason}"
