"""Depthwise, grouped and pointwise layers in our own algorithms (#39): `direct`'s depthwise path
(compiled kernels on the CPU, or taps over strided views without Numba; kernels/depthwise.cu on
`emu`), `gemm`'s one batched
product over the groups and its pointwise layers in place; every pass, both layouts, tails and
per-axis geometry, against the float64 reference."""

import ast
import re
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from convbench import testing
from convbench.algos import (
    depthwise,
    depthwise_jit,
    direct_kernels,
    gemm,
    grouped_jit,
    jit,
    reference,
    registry,
)
from convbench.core.problem import LAYOUTS, PASSES, ConvProblem
from convbench.machine import threads
from convbench.measure import memory

#: Depthwise: 3x3 and 5x5, stride 2 with odd sizes (tails), per-axis stride, padding (before
#: and after apart) and dilation, a multiplier of 2, a 1x1 without padding (read in place),
#: 1x7 and 7x1 (Inception's), a bwd_filter reduction split in slices (N·P·Q = 2048), and a
#: column stride of 3 (the kernels' form for any stride).
DEPTHWISE = [
    ConvProblem(n=2, c=8, h=9, w=7, k=8, r=3, s=3, pad=1, groups=8),
    ConvProblem(n=1, c=6, h=11, w=10, k=12, r=5, s=3, stride=(2, 1), pad=(2, 1),
                dilation=(1, 2), groups=6),
    ConvProblem(n=2, c=36, h=13, w=17, k=36, r=3, s=3, stride=2, pad=1, groups=36),
    ConvProblem(n=1, c=5, h=8, w=9, k=10, r=3, s=3, stride=2, groups=5),
    ConvProblem(n=3, c=4, h=8, w=8, k=4, r=1, s=1, groups=4),
    ConvProblem(n=1, c=4, h=9, w=9, k=4, r=1, s=7, pad=(0, 3), groups=4),
    ConvProblem(n=1, c=4, h=9, w=9, k=4, r=7, s=1, pad=((3, 2), 0), groups=4),
    ConvProblem(n=2, c=16, h=32, w=32, k=16, r=3, s=3, pad=1, groups=16),
    ConvProblem(n=1, c=3, h=7, w=13, k=3, r=2, s=3, stride=(1, 3), groups=3),
]
#: The register-blocked nhwc kernel (fwd, bwd_data of stride 1): rows of 14, 5 and 7 output
#: pixels against its steps (4 then 2, 1), padding before and after apart and beyond the
#: filter's reach in bwd_data (flipped: (R-1) - pad), a column stride of 2 with odd sizes, a
#: multiplier of 2 (the steps of 8 of filters over 25 taps: `test_blocked_depthwise_steps_of_8`).
BLOCKED = [
    ConvProblem(n=2, c=10, h=11, w=13, k=10, r=3, s=3, pad=((2, 1), (1, 2)), groups=10),
    ConvProblem(n=1, c=9, h=12, w=11, k=18, r=3, s=3, stride=(1, 2), pad=(1, 0), groups=9),
    ConvProblem(n=3, c=5, h=7, w=9, k=5, r=2, s=4, pad=((2, 1), (1, 0)), groups=5),
]
#: Grouped and pointwise, for gemm's batched and in-place products (and direct's grouped path).
GROUPED = [
    ConvProblem(n=2, c=8, h=9, w=7, k=12, r=3, s=3, pad=1, groups=4),
    ConvProblem(n=1, c=12, h=10, w=11, k=6, r=3, s=2, stride=(2, 1), pad=(1, 0), groups=3),
    ConvProblem(n=3, c=4, h=8, w=8, k=6, r=1, s=1),
    ConvProblem(n=2, c=8, h=5, w=7, k=6, r=1, s=1, groups=2),
    ConvProblem(n=2, c=4, h=8, w=9, k=6, r=1, s=1, stride=2),
]


#: The compiled kernels are specialised per filter width and, for depthwise, per column stride
#: (1, 2, any: `depthwise_jit.CONSTANT_STRIDES`), a module each, compiled per precision in
#: seconds and in every test process anew where the disk cache is cold (CI). So fp64, the
#: same generated code in another type, is checked on one problem of each kernel family (a
#: stride-2 depthwise layer with tails, a grouped 3x3) rather than all of them; and the random
#: problems draw their filters and column strides from those the lists above compile, while
#: their geometry (sizes, strides down, pads, dilation, channels, batch) is anything.
DEPTHWISE_FP64 = [DEPTHWISE[2]]
GROUPED_FP64 = [GROUPED[0]]
#: (R, S, column stride) the depthwise lists compile (the blocked kernel is one per filter,
#: the others one per width).
DEPTHWISE_FILTERS = sorted({(p.r, p.s, p.stride_w if p.stride_w in depthwise_jit.CONSTANT_STRIDES
                             else 3) for p in DEPTHWISE + BLOCKED})
#: Filter widths the grouped list compiles.
GROUPED_WIDTHS = sorted({p.s for p in GROUPED})


def _problems(problems, fp64_problems, algo: str, precision: str):
    """The problems a case runs: in fp64 on direct's compiled kernels, `fp64_problems`."""
    return fp64_problems if (algo, precision) == ("direct-jit", "fp64") else problems


def _ids(problems):
    return [str(p) for p in problems]


#: direct's two depthwise paths: "jit" (Numba's compiled kernels, what runs where Numba is
#: installed) and "taps" (the strided views, its stand-in without Numba).
PATHS = ["jit", "taps"]


@pytest.fixture
def path(request, monkeypatch):
    """Run direct's depthwise layers on the path the test's `path` parameter names."""
    if request.param == "taps":
        monkeypatch.setattr(jit, "available", lambda: "a test asks for the taps")
    else:
        assert jit.available() is None, "numba is a dependency: it must import"
    return request.param


@pytest.mark.parametrize("precision", ["fp64", "fp32"])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("pass_", PASSES)
@pytest.mark.parametrize("algo", ["direct-jit", "direct-taps", "gemm"])
def test_cpu_depthwise_matches_reference(algo, pass_, layout, precision, monkeypatch):
    problems = _problems(DEPTHWISE, DEPTHWISE_FP64, algo, precision)
    if algo == "direct-taps":
        monkeypatch.setattr(jit, "available", lambda: "a test asks for the taps")
    algo = algo.split("-")[0]
    for problem in problems:
        assert registry.supports(registry.get(algo, "numpy"), problem, pass_, layout,
                                 precision) is None
        testing.assert_matches_reference(algo, "numpy", problem, pass_, layout, precision)


@pytest.mark.parametrize("precision", ["fp64", "fp32"])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("pass_", PASSES)
@pytest.mark.parametrize("algo", ["direct-jit", "direct-products", "gemm"])
def test_cpu_grouped_and_pointwise_match_reference(algo, pass_, layout, precision, monkeypatch):
    problems = _problems(GROUPED, GROUPED_FP64, algo, precision)
    if algo == "direct-products":
        monkeypatch.setattr(jit, "available", lambda: "a test asks for the products")
    algo = algo.split("-")[0]
    for problem in problems:
        testing.assert_matches_reference(algo, "numpy", problem, pass_, layout, precision)


@settings(max_examples=25, deadline=None)
@given(c=st.integers(2, 9), m=st.integers(1, 2), n=st.integers(1, 2), h=st.integers(3, 12),
       w=st.integers(3, 12), filter_=st.sampled_from(DEPTHWISE_FILTERS),
       stride_h=st.integers(1, 3), dilation=st.tuples(st.integers(1, 2), st.integers(1, 2)),
       pad=st.tuples(st.integers(0, 2), st.integers(0, 2)),
       pass_=st.sampled_from(PASSES), layout=st.sampled_from(LAYOUTS))
def test_random_depthwise_problems_match_reference(c, m, n, h, w, filter_, stride_h, dilation,
                                                    pad, pass_, layout):
    """Any geometry, of the filters and column strides the lists compile (see there)."""
    r, s, stride = filter_[0], filter_[1], (stride_h, filter_[2])
    if (h + 2 * pad[0] - (r - 1) * dilation[0]) < 1 or (w + 2 * pad[1] - (s - 1) * dilation[1]) < 1:
        return
    problem = ConvProblem(n=n, c=c, h=h, w=w, k=c * m, r=r, s=s, stride=stride, pad=pad,
                          dilation=dilation, groups=c)
    testing.assert_matches_reference("direct", "numpy", problem, pass_, layout, "fp32")
    testing.assert_matches_reference("gemm", "numpy", problem, pass_, layout, "fp32")


@settings(max_examples=25, deadline=None)
@given(groups=st.integers(2, 3), cg=st.integers(1, 4), kg=st.integers(1, 5), n=st.integers(1, 2),
       h=st.integers(3, 11), w=st.integers(3, 11), r=st.integers(1, 4),
       s=st.sampled_from(GROUPED_WIDTHS),
       stride=st.tuples(st.integers(1, 3), st.integers(1, 3)),
       dilation=st.tuples(st.integers(1, 2), st.integers(1, 2)),
       pad=st.tuples(st.integers(0, 2), st.integers(0, 2)),
       pass_=st.sampled_from(PASSES), layout=st.sampled_from(LAYOUTS))
def test_random_grouped_problems_match_reference(groups, cg, kg, n, h, w, r, s, stride,
                                                  dilation, pad, pass_, layout):
    """direct's compiled grouped kernels (cg <= MAX_GROUP_CHANNELS), any geometry of the
    filter widths `GROUPED` compiles (see `DEPTHWISE_FP64`); kg > 4 takes the KB-wide loops
    and their remainder."""
    if (h + 2 * pad[0] - (r - 1) * dilation[0]) < 1 or (w + 2 * pad[1] - (s - 1) * dilation[1]) < 1:
        return
    if cg == 1:  # depthwise, not grouped: the grouped kernels take one channel a group too
        cg = 2
    problem = ConvProblem(n=n, c=groups * cg, h=h, w=w, k=groups * kg, r=r, s=s, stride=stride,
                          pad=pad, dilation=dilation, groups=groups)
    assert grouped_jit.applies(problem)
    testing.assert_matches_reference("direct", "numpy", problem, pass_, layout, "fp32")


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("pass_", PASSES)
def test_grouped_jit_takes_few_channels_a_group(pass_, layout):
    """Up to MAX_GROUP_CHANNELS a group the compiled kernels (no product at all), beyond it
    the products; a 64-channel-a-group layer, and 8 groups of 4 with 6 outputs each (the
    remainder of the KB-wide loops), both against the reference."""
    direct = registry.get("direct", "numpy")
    few = ConvProblem(n=2, c=32, h=9, w=10, k=48, r=3, s=3, stride=(2, 1), pad=1, groups=8)
    many = ConvProblem(n=1, c=128, h=6, w=6, k=128, r=3, s=3, pad=1, groups=2)
    assert grouped_jit.applies(few) and not grouped_jit.applies(many)
    assert direct.describe(few, pass_, layout, "fp32").startswith("grouped: compiled kernel")
    assert direct.describe(many, pass_, layout, "fp32") == ""
    assert testing.matmul_dtypes(direct, few, pass_, layout) == []
    assert testing.matmul_dtypes(direct, many, pass_, layout) != []


@pytest.mark.parametrize("way", sorted(grouped_jit.TRANSPOSERS))
def test_both_transposes_move_the_axes(way):
    """Numba's tiled transposes and torch's permuted copy, each both ways, on a shape that is
    no multiple of their tiles, against NumPy's."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((2, 5, 19, 70)).astype(np.float32)
    b = np.full((2, 70, 5, 19), np.nan, np.float32)
    grouped_jit.TRANSPOSERS[way]("to_nchw", a, b)
    np.testing.assert_array_equal(b, a.transpose(0, 3, 1, 2))
    back = np.full_like(a, np.nan)
    grouped_jit.TRANSPOSERS[way]("to_nhwc", b, back)
    np.testing.assert_array_equal(back, a)


def test_a_transpose_takes_the_way_faster_on_its_shape_and_says_so(monkeypatch):
    """Probed once per shape on its first call (each way PROBE_ROUNDS times), then only the
    faster runs; the row note names it after, and says how it will be chosen before."""
    import time

    calls = []

    def way(name, pause):
        def run(kind, src, dst):
            calls.append(name)
            time.sleep(pause)
            grouped_jit.TRANSPOSERS_REAL[name](kind, src, dst)
        return run

    monkeypatch.setattr(grouped_jit, "TRANSPOSERS_REAL", dict(grouped_jit.TRANSPOSERS),
                        raising=False)
    monkeypatch.setattr(grouped_jit, "TRANSPOSERS", {"numba": way("numba", 0.02),
                                                     "torch": way("torch", 0.0)})
    monkeypatch.setattr(grouped_jit, "_TRANSPOSE_CHOICE", {})
    p = ConvProblem(n=2, c=32, h=9, w=10, k=48, r=3, s=3, pad=1, groups=8)
    assert "[probed on first call]" in grouped_jit.describe(p, "fwd", "nhwc", np.float32)
    a = np.random.default_rng(1).standard_normal(p.x_shape("nhwc")).astype(np.float32)
    b = np.empty(p.x_shape("nchw"), np.float32)
    grouped_jit.transpose("to_nchw", a, b)
    from convbench.algos import products

    # the probe's rounds (products.probe's: each way once a round), then the faster
    assert sorted(calls[:-1]) == sorted(["numba", "torch"] * products.PROBE_ROUNDS)
    assert calls[-1] == "torch"
    calls.clear()
    grouped_jit.transpose("to_nchw", a, b)
    assert calls == ["torch"]
    np.testing.assert_array_equal(b, a.transpose(0, 3, 1, 2))
    y = np.empty(p.y_shape("nchw"), np.float32)
    grouped_jit.transpose("to_nhwc", y, np.empty(p.y_shape("nhwc"), np.float32))
    assert "by torch's transposes [probed]" in grouped_jit.describe(p, "fwd", "nhwc",
                                                                    np.float32)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("pass_", PASSES)
def test_jit_depthwise_sums_a_long_reduction_in_float64(pass_, layout):
    """A bwd_filter over N·P·Q = 2·64·64 = 8192 pixels per tap (and fwd/bwd_data of the same
    layer, border pixels a minority) within the fp32 tolerance: each row's sums are short, the
    rows add in float64."""
    problem = ConvProblem(n=2, c=24, h=64, w=64, k=24, r=3, s=3, pad=1, groups=24)
    testing.assert_matches_reference("direct", "numpy", problem, pass_, layout, "fp32")


def test_jit_depthwise_caches_its_generated_kernels(tmp_path, monkeypatch):
    """The kernels of a filter width are generated once into the user cache (named by their
    source's hash) and imported from there, so Numba can cache them on disk."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    depthwise_jit.forward_kernels.cache_clear()
    try:
        module = depthwise_jit.forward_kernels(4)
        files = list((tmp_path / "convbench" / "numba").glob("convbench_dw_s4_sw1_*.py"))
        assert [f.read_text() for f in files] == [depthwise_jit._source(4, 1)]
        assert module.__file__ == str(files[0])
    finally:
        depthwise_jit.forward_kernels.cache_clear()


#: Every module the compiled kernels render: (its templates, its source), per filter width and
#: column stride (0: any) that has a module of its own.
RENDERED = ([(depthwise_jit.TEMPLATES, depthwise_jit._source(s, sw)) for s in (1, 3, 5, 7)
             for sw in (0, *depthwise_jit.CONSTANT_STRIDES)]
            + [(grouped_jit.TEMPLATES, grouped_jit._source(s)) for s in (1, 3, 5)]
            + [(["depthwise_blocked"], depthwise_jit._blocked_source(r, s, sw, osw))
               for r, s, sw, osw in ((3, 3, 1, 1), (1, 7, 1, 1), (7, 7, 2, 1), (4, 3, 1, 2))]
            + [(["depthwise_nhwc"], jit.source(["depthwise_nhwc"], "any filter")),
               (["transposes"], jit.source(["transposes"], "any shape"))])


def _reads_like(templates: list[str], source: str) -> None:
    """Every line of the templates is a line of the source, in order: a line that is a
    placeholder's lines skipped, a `${name}` inside a line standing for any text."""
    lines, at = source.splitlines(), 0
    for line in "\n\n".join(jit.template(name) for name in templates).splitlines():
        if jit._LINE.fullmatch(line):
            continue
        pattern = ".+".join(map(re.escape, re.split(r"\$\{?\w+\}?", line)))
        while at < len(lines) and not re.fullmatch(pattern, lines[at]):
            at += 1
        assert at < len(lines), f"template line not in the source, in order: {line!r}"
        at += 1


@pytest.mark.parametrize("templates, source", RENDERED,
                         ids=[f"{'+'.join(t)}-{i}" for i, (t, _) in enumerate(RENDERED)])
def test_jit_kernels_are_their_templates_rendered(templates, source):
    """A rendered module is Python, its placeholders filled (a comment may name them), its
    options Numba's one spelling, and reads line for line as its templates: each one a reviewer
    can read beside the module it makes."""
    ast.parse(source)
    code = [line for line in source.splitlines() if not line.lstrip().startswith("#")]
    assert not [line for line in code if "$" in line]
    assert f"PARALLEL = {jit.PARALLEL!r}" in code and f"SERIAL = {jit.SERIAL!r}" in code
    assert f"PARALLEL_FRESH = {jit.PARALLEL_FRESH!r}" in code
    _reads_like(templates, source)


def test_jit_render_places_lines_at_the_templates_indentation():
    """A line that is only a placeholder takes its lines at its indentation; a placeholder in a
    line takes its value, every one given; a comment is copied as it is."""
    text = "def f(x):\n    # ${body}: the loop\n    ${body}\n    return ${out}\n"
    body = ["for i in range(3):", "    x += i"]
    assert jit.render(text, {"body": body}, out="x") == (
        "def f(x):\n    # ${body}: the loop\n    for i in range(3):\n        x += i\n"
        "    return x\n")
    with pytest.raises(KeyError):
        jit.render(text, {"body": body})
    with pytest.raises(ValueError, match="never placed"):
        jit.render(text, {"body": body, "tail": ["pass"]}, out="x")


def test_jit_source_changes_with_its_template(tmp_path, monkeypatch):
    """The on-disk cache is keyed by the rendered source's hash (`jit.load`): a template's edit
    changes the source, so a changed kernel never meets an old cache."""
    before = depthwise_jit._source(3, 1)
    for name in ("header", "planes", "depthwise"):
        (tmp_path / f"{name}.py.tmpl").write_text(jit.template(name))
    edited = tmp_path / "depthwise.py.tmpl"
    edited.write_text(edited.read_text().replace("wide[j] += ", "wide[j] = wide[j] + "))
    monkeypatch.setattr(jit, "TEMPLATES", tmp_path)
    after = depthwise_jit._source(3, 1)
    assert after != before and "wide[j] = wide[j] + " in after


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("pass_", PASSES)
def test_depthwise_blocks_cover_the_output(pass_, layout, monkeypatch):
    """Blocks of a few rows (and partial last blocks) give the reference result: the blocking
    of real layers is checked on small ones (the taps path's blocks)."""
    monkeypatch.setattr(jit, "available", lambda: "a test asks for the taps")
    monkeypatch.setattr(depthwise, "BLOCK_BYTES", 300)
    for problem in (DEPTHWISE[0], DEPTHWISE[1], DEPTHWISE[2]):
        assert len(depthwise.blocks(problem, np.float64)) > 2
        assert testing.run_and_check(registry.get("direct", "numpy"), problem, pass_, layout,
                                     "fp64").ok


def test_depthwise_blocks_group_small_images():
    p = ConvProblem(n=8, c=32, h=7, w=7, k=32, r=3, s=3, pad=1, groups=32)
    assert depthwise.blocks(p, np.float32) == [(slice(0, 8), slice(0, 7))]


@pytest.mark.parametrize("path", PATHS, indirect=True)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("pass_", PASSES)
def test_depthwise_is_never_a_product(pass_, layout, path):
    """The depthwise path multiplies elementwise: no matrix product at all (one per channel
    is what it replaces)."""
    problem = DEPTHWISE[2]
    assert testing.matmul_dtypes(registry.get("direct", "numpy"), problem, pass_, layout) == []


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("pass_", PASSES)
@pytest.mark.parametrize("problem", [DEPTHWISE[0], GROUPED[0], GROUPED[2]], ids=str)
def test_gemm_runs_every_group_in_one_product(problem, pass_, layout):
    """A grouped (or depthwise) layer is one batched product per pass, not one per group; nchw's
    bwd_filter sums its images, one product each."""
    import torch

    calls = []
    real = torch.matmul

    def counting(*args, **kwargs):
        calls.append(args[0].shape)
        return real(*args, **kwargs)

    a, b = reference.random_operands(problem, pass_, layout, np.float32)
    out = reference.nan_output(problem, pass_, layout, np.float32)
    with mock.patch.dict("os.environ", {"CONVBENCH_GEMM": "torch"}):
        run = registry.get("gemm", "numpy").prepare(problem, pass_, layout, "fp32")
        with mock.patch.object(torch, "matmul", counting):
            run(a, b, out)
    assert len(calls) == 1


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("pass_", PASSES)
def test_pointwise_gemm_has_no_lowering(pass_, layout):
    """A 1x1 stride-1 layer multiplies the activation in place: no im2col, no workspace, one
    phase, and its note says so."""
    impl = registry.get("gemm", "numpy")
    problem = GROUPED[2]
    assert gemm.in_place(problem)
    assert impl.workspace_bytes(problem, pass_, layout, "fp32") == 0
    assert impl.phases(problem, pass_, layout, "fp32") == ["product"]
    assert "no im2col" in impl.describe(problem, pass_, layout, "fp32")
    assert not gemm.in_place(GROUPED[4])  # strided: its im2col is the pixels it reads


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("pass_", PASSES)
@pytest.mark.parametrize("path", PATHS, indirect=True)
@pytest.mark.parametrize("problem", [DEPTHWISE[1], DEPTHWISE[7]], ids=str)
def test_depthwise_workspace_is_what_the_pass_allocates(problem, pass_, layout, path):
    impl = registry.get("direct", "numpy")
    a, b = (o.astype(np.float32) for o in reference.random_operands(problem, pass_, layout))
    out = reference.nan_output(problem, pass_, layout, np.float32)
    impl.prepare(problem, pass_, layout, "fp32")  # Numba's compiled code, loaded once a process
    with memory.Tracemalloc() as trace:
        run = impl.prepare(problem, pass_, layout, "fp32")
        trace.mark()
        run(a, b, out)
    declared = impl.workspace_bytes(problem, pass_, layout, "fp32")
    assert memory.pass_peak(trace.points) == pytest.approx(declared, abs=64 << 10)


@pytest.mark.parametrize("pass_", ["fwd", "bwd_data"])
@pytest.mark.parametrize("problem", BLOCKED, ids=str)
def test_blocked_depthwise_kernel_covers_its_tails(problem, pass_, monkeypatch):
    """The blocked kernel gives the reference in its own blocking (one band), and in blocks
    of 4 channels (a partial last one) and bands of 1 and of 2 output rows (a partial last
    one where the rows are odd); fp64 on one problem (the same code in another type)."""
    assert depthwise_jit._blocked(problem, pass_, "nhwc")
    own = depthwise_jit.blocking
    for blocking in (own, lambda *_: (4, 1), lambda *_: (4, 2)):
        monkeypatch.setattr(depthwise_jit, "blocking", blocking)
        testing.assert_matches_reference("direct", "numpy", problem, pass_, "nhwc", "fp32")
    if problem is BLOCKED[2]:
        testing.assert_matches_reference("direct", "numpy", problem, pass_, "nhwc", "fp64")


@pytest.mark.parametrize("pass_", ["fwd", "bwd_data"])
def test_blocked_depthwise_steps_of_8(pass_, monkeypatch):
    """The kernel of a filter over 25 taps takes 8 pixels a step, then 4, 2, 1: that code
    rendered for a 2x3 filter (its module compiles in seconds; a 26-tap one took 17 of CI's
    time) over rows of 31 pixels (8, 8, 8, 4, 2, 1)."""
    problem = ConvProblem(n=1, c=6, h=5, w=31, k=6, r=2, s=3, pad=((1, 0), (1, 1)), groups=6)
    monkeypatch.setattr(depthwise_jit, "_unroll", lambda R, S: 8)
    depthwise_jit.blocked_kernels.cache_clear()  # a module of 4 pixels a step is not this one
    try:
        assert "while q + 8 <= Q:" in depthwise_jit._blocked_source(2, 3, 1)
        testing.assert_matches_reference("direct", "numpy", problem, pass_, "nhwc", "fp32")
    finally:
        depthwise_jit.blocked_kernels.cache_clear()


def test_blocked_depthwise_bwd_data_by_phases(monkeypatch):
    """A strided bwd_data as one stride-1 forward call per phase of dx, each phase's taps
    flipped: the rows no tap reaches (a filter 2 rows tall of row stride 3) are zero, the
    strides apart per axis, a multiplier of 2; the rule that would keep so small a filter off
    the kernel set aside (BLOCKED covers the phases of a 3x3 with column stride 2)."""
    problem = ConvProblem(n=2, c=3, h=8, w=7, k=6, r=2, s=2, stride=(3, 2), pad=(1, 0),
                          groups=3)
    monkeypatch.setattr(depthwise_jit, "BLOCKED_INTENSITY", 0)
    monkeypatch.setattr(depthwise_jit, "BLOCKED_INSIDE", 0)
    calls = depthwise_jit.launches(problem, "bwd_data")
    assert len(calls) == problem.stride_h * problem.stride_w
    assert sum(c.R for c in calls[::problem.stride_w]) == problem.r
    assert depthwise_jit._blocked(problem, "bwd_data", "nhwc")
    testing.assert_matches_reference("direct", "numpy", problem, "bwd_data", "nhwc", "fp32")


def test_blocked_depthwise_runs_where_its_band_copy_pays():
    """Undilated nhwc fwd (of a column stride of 1 or 2) and bwd_data with 4 taps or more per
    input element; not 3x3 of stride 2, 1x1, dilated, nchw, bwd_filter."""
    def blocked(pass_="fwd", layout="nhwc", **geometry):
        p = ConvProblem(**{**dict(n=1, c=8, h=9, w=9, k=8, r=3, s=3, groups=8), **geometry})
        return depthwise_jit._blocked(p, pass_, layout)

    assert blocked() and blocked("bwd_data") and blocked(r=5, s=5, stride=2)
    assert blocked(r=1, s=7) and blocked(r=7, s=1) and blocked(r=7, s=7, stride=(1, 2))
    assert not blocked(stride=2) and not blocked(r=1, s=1) and not blocked(dilation=2)
    assert not blocked(layout="nchw") and not blocked("bwd_filter")
    assert blocked("bwd_data", r=5, s=5, stride=2, pad=2) and not blocked("bwd_data", stride=2)
    assert not blocked(r=7, s=7, stride=(1, 3))  # a column stride without a kernel
    # the share of the taps' products inside x: 74% for a 9x9 on 16x16, 57% for a 7x7 on 7x7
    assert blocked(h=16, w=16, r=9, s=9, pad=4) and not blocked(h=7, w=7, r=7, s=7, pad=3)


def test_blocked_depthwise_blocking_fills_the_threads_within_its_band(monkeypatch):
    """A batch-1 layer is cut into at least two tasks a thread; each band's input rows fit
    `BAND_BYTES`; the channels a task are 128 for 3x3 filters, 64 for larger, all of them for
    an input beyond `INPUT_BYTES`."""
    monkeypatch.setattr(threads, "count", lambda: 2)
    small = ConvProblem(n=1, c=768, h=16, w=16, k=768, r=3, s=3, pad=1, groups=768)
    big = ConvProblem(n=8, c=64, h=112, w=112, k=64, r=7, s=7, stride=2, pad=3, groups=64)
    def blocking(p):
        return depthwise_jit.blocking(p, depthwise_jit.launches(p, "fwd")[0], np.float32)

    assert blocking(small) == (128, 16)
    KB, PB = blocking(big)
    rows, cols = (PB - 1) * 2 + 7, (big.q - 1) * 2 + 7
    band = cols * KB * 4  # bytes of an input row
    assert KB == 64 and rows * band <= depthwise_jit.BAND_BYTES < (rows + 2) * band
    one = ConvProblem(n=1, c=64, h=8, w=8, k=64, r=3, s=3, pad=1, groups=64)
    assert blocking(one) == (64, 2)  # 4 tasks, not 1
    large = ConvProblem(n=8, c=324, h=56, w=56, k=324, r=3, s=3, pad=1, groups=324)
    assert blocking(large)[0] == 324


def test_direct_describes_its_depthwise_path(monkeypatch):
    direct = registry.get("direct", "numpy")
    note = direct.describe(DEPTHWISE[0], "fwd", "nhwc", "fp32")
    assert note.startswith("depthwise: compiled kernel (Numba), one pass, 9 taps")
    assert "vectorised over the channels" in note and "4 pixels' sums in registers" in note
    note = direct.describe(DEPTHWISE[0], "bwd_data", "nhwc", "fp32")
    assert "registers" in note and "filter flipped" in note
    assert "registers" not in direct.describe(DEPTHWISE[1], "fwd", "nhwc", "fp32")  # dilated
    assert "filter flipped" in direct.describe(DEPTHWISE[0], "bwd_data", "nchw", "fp32")
    assert "gather" in direct.describe(DEPTHWISE[2], "bwd_data", "nhwc", "fp32")
    monkeypatch.setattr(jit, "available", lambda: "numba is not importable (test)")
    note = direct.describe(DEPTHWISE[0], "fwd", "nhwc", "fp32")
    assert note.startswith("depthwise (Numba unavailable: numba is not importable (test)): 9 "
                           "taps as elementwise multiply-adds")
    assert registry.get("direct", "numpy").describe(GROUPED[0], "fwd", "nhwc", "fp32") == ""


# --- kernels/depthwise.cu, under the emulator and on a GPU -----------------------------------
#: The emulator's problems; on a GPU also two of MobileNetV2's depthwise layers at batch 8
#: (stride 1 and 2), sizes the emulator is too slow for.
CUDA_DEPTHWISE = [*DEPTHWISE,
                  ConvProblem(n=8, c=144, h=56, w=56, k=144, r=3, s=3, pad=1, groups=144),
                  ConvProblem(n=8, c=96, h=112, w=112, k=96, r=3, s=3, stride=2, pad=1,
                              groups=96)]
KERNEL_CASES = [*(pytest.param("emu", p, id=f"emu-{p}") for p in DEPTHWISE),
                *(pytest.param("cuda", p, id=f"cuda-{p}", marks=pytest.mark.gpu)
                  for p in CUDA_DEPTHWISE)]


@pytest.mark.gpu_pins
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("pass_", PASSES)
@pytest.mark.parametrize("backend, problem", KERNEL_CASES)
def test_depthwise_kernel_matches_reference(backend, problem, pass_, layout):
    """kernels/depthwise.cu under the emulator (CI) and as a GPU runs it (`gpu`)."""
    impl = testing.runnable("direct", backend)
    assert registry.supports(impl, problem, pass_, layout, "fp32") is None
    assert impl.describe(problem, pass_, layout, "fp32").startswith("depthwise kernel")
    testing.assert_matches_reference("direct", backend, problem, pass_, layout, "fp32")


def test_emu_depthwise_bwd_filter_split():
    """N·P·Q = 2048 runs in 8 slices of 256 pixels, summed in slice order: the same bits twice."""
    impl, problem = testing.runnable("direct", "emu"), DEPTHWISE[7]
    assert "reduction in 8 slice(s)" in impl.describe(problem, "bwd_filter", "nhwc", "fp32")
    assert impl.workspace_bytes(problem, "bwd_filter", "nhwc", "fp32") == 4 * 8 * 16 * 9
    x, dy = reference.random_operands(problem, "bwd_filter", "nhwc")
    run = impl.prepare(problem, "bwd_filter", "nhwc", "fp32")
    first, second = (reference.nan_output(problem, "bwd_filter", "nhwc") for _ in range(2))
    run(x, dy, first)
    run(x, dy, second)
    np.testing.assert_array_equal(first, second)


def test_depthwise_kernels_are_declared_to_the_gate():
    from convbench.cuda import kernels

    declared = kernels.declared()
    assert len(declared["depthwise"]) == len(direct_kernels.DEPTHWISE_CONFIGURATIONS) == 2


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("pass_", PASSES)
@pytest.mark.parametrize("problem", [DEPTHWISE[1], GROUPED[0]], ids=str)
def test_jit_fp32_is_computed_in_fp32(problem, pass_, layout):
    """Benchmarking fp32 means multiplying in fp32: the compiled kernels an fp32 pass calls take
    float32 activations and filters (only bwd_filter's row sums are added in float64)."""
    import numba

    direct = registry.get("direct", "numpy")
    assert testing.run_and_check(direct, problem, pass_, layout, "fp32").ok
    f32 = numba.types.Array(numba.float32, 4, "C")
    modules = [depthwise_jit.forward_kernels(problem.s, problem.stride_w),
               depthwise_jit.forward_kernels(problem.s, 1), depthwise_jit.nhwc_kernels(),
               grouped_jit.kernels(problem.s)]
    called = [sig for m in modules for name in ("fwd_nhwc", "fwd_nchw", "bwd_data_nchw",
                                                "bwd_filter_nchw", "bwd_data_nhwc",
                                                "bwd_filter_nhwc", "fwd", "bwd_data",
                                                "bwd_filter")
              for sig in getattr(getattr(m, name, None), "signatures", [])]
    assert any(sig[0] == f32 for sig in called)
    assert all(sig[0] in (f32, numba.types.Array(numba.float64, 4, "C")) for sig in called)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("pass_", PASSES)
@pytest.mark.parametrize("stride", [1, 2])
def test_grouped_jit_stacks_images_into_a_task(stride, pass_, layout, monkeypatch):
    """Tasks of 2 stacked images over 5 (the last alone): each image's rows of a wide row stay
    its own, every pass, against the reference."""
    problem = ConvProblem(n=5, c=16, h=7, w=6, k=8, r=3, s=3, stride=stride, pad=1, groups=4)
    phases, plane, _ = grouped_jit._planes(problem, pass_)
    inputs, outputs = (2, 4) if pass_ == "bwd_data" and stride == 1 else (4, 2)
    monkeypatch.setattr(grouped_jit, "TASK_BYTES", 2 * (inputs * phases + outputs) * plane * 4)
    assert grouped_jit.images_per_task(problem, pass_, np.float32) == 2
    testing.assert_matches_reference("direct", "numpy", problem, pass_, layout, "fp32")


def test_a_compiled_kernel_leaves_torch_on_the_runs_threads():
    """Numba's OpenMP layer shares GNU OpenMP with torch and its first parallel call set the
    thread count to every core: a one-thread run's torch-cpu then ran on two (and was flagged
    implausible). A fresh process: one thread, a compiled depthwise and grouped pass, torch
    still on one thread."""
    import subprocess
    import sys

    code = """
from convbench.machine import threads
threads.sleep_idle_threads()
import numpy as np, torch
threads.use(1)
from convbench import testing
from convbench.algos import registry
from convbench.core.problem import ConvProblem
for p in (ConvProblem(n=2, c=8, h=9, w=7, k=8, r=3, s=3, pad=1, groups=8),
          ConvProblem(n=2, c=8, h=9, w=7, k=12, r=3, s=3, pad=1, groups=4)):
    assert testing.run_and_check(registry.get("direct", "numpy"), p, "fwd", "nhwc", "fp32").ok
print(torch.get_num_threads())
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.split()[-1] == "1"


def test_the_first_compile_is_not_a_pass_workspace(tmp_path):
    """A process's first compiled kernel (Numba's compiler, some 16 MB of Python objects) is
    compiled by `Implementation.compile` before the runner traces `prepare`: the row's peak is
    the pass's own memory (a committed run's first depthwise row read 16.6 MB for 42 KB)."""
    import os
    import subprocess
    import sys

    code = """
from convbench.measure import runner
from convbench.catalogs.layers import Layer
from convbench.core.problem import ConvProblem
p = ConvProblem(n=2, c=64, h=20, w=20, k=64, r=5, s=5, pad=2, groups=64)
cases = runner.sweep([Layer("custom", "dw", p)], ["direct"], "numpy", ["fwd"], ["nchw"], ["fp32"])
row = runner.run(cases, 0.02)[0]
print(row["status"], row["workspace_bytes"], row["peak_bytes"])
"""
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path))  # nothing compiled on disk yet
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env=env).stdout.split()
    status, workspace, peak = out[-3], int(float(out[-2])), int(float(out[-1]))
    assert status == "ok" and peak < workspace + (1 << 20)
