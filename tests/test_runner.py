import contextlib
import dataclasses
import time

import numpy as np
import pytest

from convbench.algos import reference, registry
from convbench.algos.phases import phase_names
from convbench.analysis import report
from convbench.catalogs.layers import Layer
from convbench.core import results
from convbench.core.problem import ConvProblem
from convbench.machine import backends, faults
from convbench.measure import memory, runner, timing
from convbench.measure.rows import median_repetition

TINY = ConvProblem(n=1, c=2, h=6, w=6, k=3, r=3, s=3, pad=1)
LAYER = Layer("custom", "tiny", TINY)
BUDGET = 0.002


class Fake(registry.Implementation):
    """Wraps torch-cpu, counting calls of the prepared pass; `mistake` spoils its output,
    `error` is raised by the pass instead of computing it."""

    backend = "numpy"
    precisions = ("fp32", "fp64")

    def __init__(self, algo, mistake=None, error=None, reason=None):
        self.algo, self.mistake, self.error, self.reason = algo, mistake, error, reason
        self.calls = 0
        self.inner = registry.get("torch-cpu", "numpy")

    def supports(self, problem, pass_, layout, precision):
        return self.reason

    def describe(self, problem, pass_, layout, precision):
        return f"fake {self.algo}"

    def prepare(self, problem, pass_, layout, precision):
        fn = self.inner.prepare(problem, pass_, layout, precision)

        def run(a, b, out):
            self.calls += 1
            if self.error is not None:
                raise self.error
            fn(a, b, out)
            if self.mistake is not None:
                self.mistake(out)

        return run

#: The names the fakes run under: each wraps torch-cpu, so it declares torch-cpu's traits under
#: its own name (the runner, the check and the guard read an algorithm's traits by its name),
#: as one of ours (a wrong result of ours is `failed`, a library's `inexact`).
FAKE_NAMES = ("good", "wrong", "unwritten", "unsup", "oom", "boom", "fault", "bad", "also",
              "later", "fast", "faulty", "scribble", "a", "b", "c", "big", "small", "huge",
              "mute", "phased", "liar", "picks-winograd", "picks-exact")


@contextlib.contextmanager
def fakes_declared(names=FAKE_NAMES):
    """Within: each of `names` declared with torch-cpu's traits, origin ours; the registry
    forgets them after."""
    with registry.scratch():
        for name in names:
            registry.declare(dataclasses.replace(registry.algorithm("torch-cpu"), name=name,
                                                 origin="ours"))
        yield


@pytest.fixture(autouse=True)
def fake_traits():
    """The fakes' traits, declared for the test alone."""
    with fakes_declared():
        yield


def fakes():
    return {
        "good": Fake("good"),
        "wrong": Fake("wrong", mistake=lambda out: out.__imul__(1.01)),  # 1% off: fails
        "unwritten": Fake("unwritten", mistake=lambda out: out.__setitem__((0, 0, 0, 0), np.nan)),
        "unsup": Fake("unsup", reason="no tiny layers"),
        "oom": Fake("oom", error=MemoryError("out of memory allocating 1 TiB")),
        "boom": Fake("boom", error=RuntimeError("boom\nsecond line of a long message")),
    }


def cases(algos, passes=("fwd",), layouts=("nchw",)):
    return runner.sweep([LAYER], algos, "numpy", passes, layouts, ["fp32"])


def test_statuses_and_reasons():
    impls = fakes()
    rows = {r["algo"]: r for r in runner.run(cases(impls), BUDGET, impls)}
    assert {a: r["status"] for a, r in rows.items()} == {
        "good": "ok", "wrong": "failed", "unwritten": "failed", "unsup": "unsupported",
        "oom": "oom", "boom": "failed"}
    good = rows["good"]
    assert good["reps"] >= timing.MIN_REPS and len(good["times_ms"].split()) == good["reps"]
    assert good["gflops"] == pytest.approx(TINY.flops / (good["median_ms"] * 1e6))
    assert good["rel_error"] < good["tolerance"] and good["note"] == "fake good"
    assert "rel_error" in rows["wrong"]["reason"] and rows["wrong"]["rel_error"] > 1e-3
    assert rows["unwritten"]["rel_error"] == float("inf")
    assert rows["unsup"]["reason"] == "no tiny layers"
    assert rows["oom"]["reason"].startswith(  # and what it needed against what was free
        "MemoryError: out of memory allocating 1 TiB (its operands need 936 B, its workspace "
        "is unknown; ")
    assert rows["oom"]["reason"].endswith(" was free)")
    assert rows["boom"]["reason"] == "RuntimeError: boom"  # one line, no traceback
    for r in rows.values():
        assert set(r) == set(results.COLUMNS)
        if r["status"] != "ok":
            assert r["median_ms"] is None and r["times_ms"] is None


def test_a_failed_check_is_never_timed():
    impls = fakes()
    runner.run(cases(impls), BUDGET, impls)
    assert impls["wrong"].calls == 1 and impls["unwritten"].calls == 1  # the check only
    assert impls["unsup"].calls == 0
    assert impls["good"].calls > 1 + timing.MIN_REPS - 1


def test_a_library_result_beyond_its_tolerance_is_timed_and_inexact():
    """A library's result 1% off is what its users run: timed and kept, `inexact`, its reason
    the error against its tolerance. The same error of ours is `failed` and never timed (a
    wrong result of ours never wins); a library's unwritten element is no result at all."""
    off = lambda out: out.__imul__(1.01)
    impls = {"wrong": Fake("wrong", mistake=off), "lib-wrong": Fake("lib-wrong", mistake=off),
             "lib-unwritten": Fake("lib-unwritten",
                                   mistake=lambda out: out.__setitem__((0, 0, 0, 0), np.nan))}
    torch_cpu = registry.algorithm("torch-cpu")  # origin torch
    with registry.scratch():
        registry.declare(dataclasses.replace(torch_cpu, name="lib-wrong", origin="library"))
        registry.declare(dataclasses.replace(torch_cpu, name="lib-unwritten"))
        rows = {r["algo"]: r for r in runner.run(cases(impls), BUDGET, impls)}
    lib, ours = rows["lib-wrong"], rows["wrong"]
    assert lib["status"] == "inexact" and impls["lib-wrong"].calls > 1
    assert lib["median_ms"] > 0 and lib["reps"] >= timing.MIN_REPS and lib["gflops"] > 0
    assert lib["rel_error"] == pytest.approx(0.01, rel=0.05) and lib["tolerance"] == 1e-5
    assert lib["reason"] == (f"rel_error {lib['rel_error']:.3g} > tolerance 1e-05 "
                             f"(max abs error {lib['max_abs_error']:.3g})")
    assert ours["status"] == "failed" and ours["median_ms"] is None
    assert impls["wrong"].calls == 1
    unwritten = rows["lib-unwritten"]
    assert unwritten["status"] == "failed" and unwritten["median_ms"] is None
    assert impls["lib-unwritten"].calls == 1


def test_oom_during_timing_is_recorded_and_the_run_goes_on():
    class OomLater(Fake):
        def prepare(self, *args):
            fn = super().prepare(*args)

            def run(a, b, out):
                if self.calls >= 1:
                    self.calls += 1
                    raise MemoryError("no room")
                fn(a, b, out)

            return run

    impls = {"later": OomLater("later"), "good": Fake("good")}
    rows = runner.run(cases(["later", "good"]), BUDGET, impls)
    assert [r["status"] for r in rows] == ["oom", "ok"]


class FakeDevice:
    """A device's memory, accounted: `total` bytes, `used` of them by others to begin with; a
    block allocated beyond what is free raises MemoryError, as a GPU's pool does, and gives its
    bytes back when nothing holds it."""

    def __init__(self, total, used=0):
        self.total, self.used = total, used

    def allocate(self, nbytes):
        if self.used + nbytes > self.total:
            raise MemoryError(f"out of memory allocating {nbytes} bytes")
        self.used += nbytes
        return _Block(self, nbytes)

    def install(self, monkeypatch):
        """The harness reads this device's free and total memory (the host backend's)."""
        monkeypatch.setattr(memory, "total_bytes", lambda backend: self.total)
        monkeypatch.setattr(memory, "available_host_bytes", lambda: self.total - self.used)


class _Block:
    def __init__(self, device, nbytes):
        self.device, self.nbytes = device, nbytes

    def __del__(self):
        self.device.used -= self.nbytes


class Hungry(Fake):
    """Holds `held` bytes of `device` from `prepare` on, and `temp` more during each call."""

    def __init__(self, algo, device, held, temp=0):
        super().__init__(algo)
        self.device, self.held, self.temp = device, held, temp

    def workspace_bytes(self, problem, pass_, layout, precision):
        return self.held + self.temp

    def prepare(self, *args):
        block, fn, device, temp = self.device.allocate(self.held), super().prepare(*args), \
            self.device, self.temp

        def run(a, b, out):
            assert block is not None
            scratch = device.allocate(temp)  # noqa: F841 - held for the call
            fn(a, b, out)

        return run


KIB = 1024


def test_a_case_that_fits_alone_is_measured_alone_not_oom(monkeypatch):
    """A case needing more than the memory its group's prepared cases leave free (but less than
    the free quarter's alarm would catch) is measured once they are given back, not `oom`; the
    cases that fit together are still timed together."""
    device = FakeDevice(1024 * KIB)
    device.install(monkeypatch)
    impls = {"a": Hungry("a", device, 300 * KIB), "b": Hungry("b", device, 300 * KIB),
             "big": Hungry("big", device, 800 * KIB)}  # beside a and b: 1400 KiB
    rows = runner.run(cases(["a", "b", "big"]), BUDGET, impls)
    assert [r["status"] for r in rows] == ["ok", "ok", "ok"], [r["reason"] for r in rows]
    assert rows[0]["round_group"] == rows[1]["round_group"] != rows[2]["round_group"]
    assert device.used == 0


def test_a_case_out_of_memory_while_timed_beside_others_is_timed_alone(monkeypatch):
    """A call's scratch that fits once the group's other cases are given back: measured alone,
    not `oom`."""
    device = FakeDevice(1024 * KIB)
    device.install(monkeypatch)
    impls = {"a": Hungry("a", device, 100 * KIB, temp=500 * KIB),
             "b": Hungry("b", device, 500 * KIB)}  # a's call beside b: 1100 KiB
    rows = runner.run(cases(["a", "b"]), BUDGET, impls)
    assert [r["status"] for r in rows] == ["ok", "ok"], [r["reason"] for r in rows]
    assert device.used == 0


def test_a_case_that_cannot_fit_alone_is_oom_saying_what_it_needed_and_had(monkeypatch):
    device = FakeDevice(1024 * KIB, used=500 * KIB)  # another process holds 500 KiB
    device.install(monkeypatch)
    impls = {"small": Hungry("small", device, 100 * KIB),
             "huge": Hungry("huge", device, 600 * KIB)}
    rows = runner.run(cases(["small", "huge"]), BUDGET, impls)
    assert [r["status"] for r in rows] == ["ok", "oom"]
    needed = memory.operand_bytes(TINY, "fwd", np.float32) + 600 * KIB
    assert rows[1]["reason"] == (
        f"MemoryError: out of memory allocating {600 * KIB} bytes (it needs "
        f"{memory.format_size(needed)} with its workspace; 524 KiB of the device's 1 MiB was "
        "free)")
    assert device.used == 500 * KIB


def test_a_reference_that_cannot_be_made_is_blamed_on_the_reference(monkeypatch):
    """The float64 reference failing to allocate (torch's im2col for a huge filter) makes each
    case `oom`, its reason saying it was the operands or the reference, not the algorithm."""
    def no_room(*args, **kwargs):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: "
                           "can't allocate memory: you tried to allocate 2130840649728 bytes.")

    monkeypatch.setattr(reference, "reference", no_room)
    impls = {"good": Fake("good")}
    rows = runner.run(cases(["good"]), BUDGET, impls)
    assert [r["status"] for r in rows] == ["oom"]
    assert rows[0]["reason"].startswith("the operands or the float64 reference: RuntimeError: ")
    assert impls["good"].calls == 0


def test_torch_oom_is_recognised_by_name():
    OutOfMemoryError = type("OutOfMemoryError", (RuntimeError,), {})
    assert runner._is_oom(OutOfMemoryError("CUDA out of memory"))
    assert not runner._is_oom(RuntimeError("x"))


def test_library_allocation_failures_are_oom():
    """cuFFT, cuBLAS and cuDNN report a failed allocation in errors of their own types."""
    CuFFTError = type("CuFFTError", (RuntimeError,), {})
    assert runner._is_oom(CuFFTError("CUFFT_ALLOC_FAILED"))
    assert runner._is_oom(RuntimeError("cuDNN error: CUDNN_STATUS_ALLOC_FAILED"))
    assert not runner._is_oom(RuntimeError("CUFFT_INVALID_PLAN"))
    # torch's host allocator (the float64 reference of a 63x63 filter on 1024x1024 through
    # torch's im2col asked for 2 TB)
    assert runner._is_oom(RuntimeError(
        "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate "
        "memory: you tried to allocate 2130840649728 bytes. Error code 12 (Cannot allocate "
        "memory)"))


STICKY = RuntimeError("CUDARuntimeError: cudaErrorIllegalAddress: an illegal memory access was "
                      "encountered")


@pytest.mark.parametrize("error", [
    STICKY, RuntimeError("CUDA_ERROR_LAUNCH_FAILED: unspecified launch failure"),
    RuntimeError("CUDA error: misaligned address"),
    RuntimeError("CUDA error: device-side assert triggered"),
    RuntimeError("cuDNN error: CUDNN_STATUS_EXECUTION_FAILED"),
    RuntimeError("CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasSgemm( handle, ...)`"),
    RuntimeError("cuFFT error: CUFFT_EXEC_FAILED"),
    RuntimeError("cudnnConvolutionForward: CUDNN_STATUS_MAPPING_ERROR"),
    faults.DeviceUnusable("cuDNN's find: CUDNN_STATUS_INTERNAL_ERROR; then illegal address")],
    ids=str)
def test_a_gpu_fault_is_recognised(error):
    assert runner.is_sticky_fault(error)
    assert not runner.is_sticky_fault(RuntimeError("CUFFT_INVALID_PLAN"))


def test_a_gpu_fault_keeps_its_row_and_stops_the_run():
    """After an illegal address the device is unusable in this process: every later case would
    fail the same way. The faulting case's row is streamed (so a resumed run continues after
    it) and the run stops there, saying which case it was."""
    impls = {"fault": Fake("fault", error=STICKY), "good": Fake("good")}
    seen = []
    with pytest.raises(runner.DeviceFault, match="tiny fault fwd nchw faulted the GPU") as exc:
        runner.run(cases(["fault", "good"]), BUDGET, impls, on_row=seen.append)
    assert [r["algo"] for r in seen] == ["fault"] and seen[0]["status"] == "failed"
    assert exc.value.row is seen[0] and "illegal memory access" in seen[0]["reason"]
    assert impls["good"].calls == 0


def test_an_error_making_a_row_fails_that_row_and_the_run_goes_on(monkeypatch):
    """Only a GPU fault ends a run: a bug while one timed row is made (its note, its
    statistics) is that row's `failed`, and every other case is measured."""
    real = runner.timed_row

    def broken(case, *args, **kwargs):
        if case.algo == "bad":
            raise ValueError("a statistic of nothing")
        return real(case, *args, **kwargs)

    monkeypatch.setattr(runner, "timed_row", broken)
    impls = {"bad": Fake("bad"), "good": Fake("good")}
    rows = runner.run(cases(["bad", "good"]) + cases(["good"], passes=("bwd_data",)), BUDGET,
                      impls)
    assert [(r["algo"], r["status"]) for r in rows] == [("bad", "failed"), ("good", "ok"),
                                                        ("good", "ok")]
    assert rows[0]["reason"] == "ValueError: a statistic of nothing (while its row was made)"


def test_an_operation_count_that_fails_fails_its_row_only(monkeypatch):
    """A count that cannot be made (seen on Python 3.12: an FFT's transform grid not found)
    fails the timed row it belongs to, whose `failed` row is still made, and the run goes on."""
    from convbench.measure import opcount

    real = opcount.op_count

    def broken(algo, *args):
        if algo == "bad":
            raise ValueError("bad does not give its transform grid")
        return real(algo, *args)

    monkeypatch.setattr(opcount, "op_count", broken)
    rows = runner.run(cases(["bad", "good"]), BUDGET, {"bad": Fake("bad"), "good": Fake("good")})
    assert [(r["algo"], r["status"]) for r in rows] == [("bad", "failed"), ("good", "ok")]
    assert "transform grid (while its row was made)" in rows[0]["reason"]


def test_a_library_is_judged_by_the_family_of_the_algorithm_it_picked():
    """A library that picks its own algorithm (cuDNN through torch) and ran a Winograd is
    judged with Winograd's tolerance, not the exact algorithms' one: its rounding is the
    family's. One that says nothing keeps its own tolerance."""
    class Picks(Fake):
        def __init__(self, algo, family):
            super().__init__(algo, mistake=lambda out: out.__imul__(1 + 3e-5))
            self.family = family

        def judged_as(self, *args):
            return self.family

    # wrapped as the registry wraps cuDNN (an H200 run lost the answer in the wrapper)
    winograd, exact = runner.run(cases(["picks-winograd", "picks-exact"]), BUDGET, {
        "picks-winograd": registry.ExplicitPad(Picks("picks-winograd", "cudnn-find-winograd")),
        "picks-exact": registry.ExplicitPad(Picks("picks-exact", None))})
    assert winograd["status"] == "ok" and winograd["tolerance"] == pytest.approx(1e-4)
    assert exact["status"] == "failed" and "> tolerance 1e-05" in exact["reason"]


def test_garbage_is_collected_once_a_group_not_once_a_case(monkeypatch):
    """Each case starts from an empty device, but the collection of garbage (tens of
    milliseconds over torch's and pandas' objects) runs before a group's first case only."""
    seen = []
    monkeypatch.setattr(memory, "release_device_memory",
                        lambda backend, collect=True: seen.append(collect))
    impls = {a: Fake(a) for a in ("a", "b", "c")}
    rows = runner.run(cases(["a", "b", "c"]) + cases(["a", "b"], passes=("bwd_data",)),
                      BUDGET, impls)
    assert [r["status"] for r in rows] == ["ok"] * 5
    assert seen == [True, False, False, True, False]


def test_torch_s_own_result_copy_is_timed_apart_and_left_out():
    """torch-cpu (like cudnn) computes into a result torch allocates, then copies it into the
    harness's output: the copy is a phase of its own, and the pass's time is the rest."""
    (r,) = runner.run(cases(["torch-cpu"]), BUDGET)
    phases = results.parse_phases(r["phases_ms"])
    assert list(phases) == ["convolution", "copy to output"]
    assert r["median_ms"] == pytest.approx(phases["convolution"], rel=1e-5)
    assert "ms copy of the library's result into the output" in r["note"]


def test_a_failing_description_keeps_the_measurement():
    class Mute(Fake):
        def describe(self, *args):
            raise RuntimeError("profiler unavailable\nmore")

    (r,) = runner.run(cases(["mute"]), BUDGET, {"mute": Mute("mute")})
    assert r["status"] == "ok" and r["median_ms"] > 0
    assert r["note"] == "(no description: RuntimeError: profiler unavailable)"


def test_the_kernels_a_library_ran_are_in_its_row_with_whether_on_tensor_cores(tmp_path):
    """A library that names the kernels its pass launched (cuDNN through torch: profiled)
    gets them in its row, and whether one ran on tensor cores, read from the names (the TF32
    setting only allows it); an implementation that names none leaves both empty, and one whose
    naming fails keeps its measurement. Through the explicit-pad wrapper alike."""
    xmma = ("sm80_xmma_fprop_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize128x128x16"
            "_stage4_warpsize2x2x1_g1_tensor16x8x8_execute_kernel__5x_cudnn")
    fill = "void at::native::vectorized_elementwise_kernel<4, FillFunctor<float> >(int)"

    class Naming(Fake):
        def __init__(self, algo, names):
            super().__init__(algo)
            self.names = names

        def kernels(self, *args):
            if isinstance(self.names, Exception):
                raise self.names
            return self.names

    impls = {"a": registry.ExplicitPad(Naming("a", [fill, xmma, xmma])),
             "b": Naming("b", ["void cudnn::detail::implicit_convolve_sgemm<float>(int)"]),
             "c": Naming("c", RuntimeError("no profiler")), "good": Fake("good")}
    rows = {r["algo"]: r for r in runner.run(cases(["a", "b", "c", "good"]), BUDGET, impls)}
    assert all(r["status"] == "ok" for r in rows.values())
    assert rows["a"]["tensor_cores"] is True
    assert rows["a"]["kernels"] == f"vectorized_elementwise_kernel; {xmma}"
    assert (rows["b"]["tensor_cores"], rows["b"]["kernels"]) == (False,
                                                                  "implicit_convolve_sgemm")
    for algo in ("c", "good"):
        assert rows[algo]["tensor_cores"] is None and rows[algo]["kernels"] is None
    sink = results.CsvSink(tmp_path / results.RESULTS_CSV)
    for r in rows.values():
        sink.append(r)
    back = results.frame(results.read_rows(sink.path)).set_index("algo")
    assert back["tensor_cores"].map(repr).to_dict() == {"a": "True", "b": "False",
                                                        "c": "nan", "good": "nan"}
    assert back.loc["b", "kernels"] == "implicit_convolve_sgemm" and back.loc["c", "kernels"] == ""


def test_reference_is_computed_once_per_problem_and_pass(monkeypatch):
    calls = []
    real = reference.reference

    def counting(problem, pass_, layout, a, b):
        calls.append((pass_, layout))
        return real(problem, pass_, layout, a, b)

    monkeypatch.setattr(reference, "reference", counting)
    impls = {"good": Fake("good"), "also": Fake("also")}
    passes = ("fwd", "bwd_data", "bwd_filter")
    rows = runner.run(cases(["good", "also"], passes, ("nchw", "nhwc")), BUDGET, impls)
    assert len(rows) == 12 and all(r["status"] == "ok" for r in rows)
    assert calls == [(p, "nchw") for p in passes]


def test_registry_implementation_both_layouts():
    rows = runner.run(cases(["torch-cpu"], ("fwd", "bwd_filter"), ("nchw", "nhwc")), BUDGET)
    assert [(r["pass"], r["layout"], r["status"]) for r in rows] == [
        ("fwd", "nchw", "ok"), ("fwd", "nhwc", "ok"),
        ("bwd_filter", "nchw", "ok"), ("bwd_filter", "nhwc", "ok")]


def test_operands_are_fresh_copies():
    class Scribbler(Fake):
        def prepare(self, *args):
            fn = super().prepare(*args)

            def run(a, b, out):
                fn(a, b, out)
                a[...] = 0  # ruins its own input after computing

            return run

    impls = {"scribble": Scribbler("scribble"), "good": Fake("good")}
    rows = runner.run(cases(["scribble", "good"]), BUDGET, impls)
    assert [r["status"] for r in rows] == ["ok", "ok"]


def test_prepare_returns_a_verified_callable():
    ready = runner.prepare(cases(["torch-cpu"])[0], runner.Operands())
    assert ready.check.ok
    ready.call()
    with pytest.raises(runner.NotMeasured) as info:
        runner.prepare(cases(["unsup"])[0], runner.Operands(), fakes()["unsup"])
    assert info.value.status == "unsupported"


def test_sweep_groups_cases_by_problem_and_pass():
    got = runner.sweep([LAYER], ["a", "b"], "numpy", ["fwd", "bwd_data"], ["nchw", "nhwc"],
                       ["fp32"])
    assert len(got) == 8
    assert [c.pass_ for c in got] == ["fwd"] * 4 + ["bwd_data"] * 4
    assert got[0].key() == ("tiny", "1", "2", "6", "6", "3", "3", "3", "1", "1", "1", "1", "a",
                            "numpy", "fwd", "nchw", "fp32")


class Crash(Fake):
    """Interrupts the run (as Ctrl-C would) when its `at`-th case starts."""

    def __init__(self, algo, at):
        super().__init__(algo)
        self.at, self.started = at, 0

    def prepare(self, *args):
        self.started += 1
        if self.started == self.at:
            raise KeyboardInterrupt
        return super().prepare(*args)


def test_rows_are_streamed_and_survive_a_crash_and_resume_finishes(tmp_path):
    """Rows are written a competing group at a time (a pass's two layouts here): Ctrl-C in the
    second group keeps the first group's rows and none of the second's, which a resumed run
    measures whole."""
    path = tmp_path / results.RESULTS_CSV
    todo = cases(["good"], ("fwd", "bwd_data", "bwd_filter"), ("nchw", "nhwc"))
    sink = results.CsvSink(path)
    with pytest.raises(KeyboardInterrupt):
        runner.run(todo, BUDGET, {"good": Crash("good", at=4)}, on_row=sink.append)
    kept = results.read_rows(path)
    assert [(r["pass"], r["status"]) for r in kept] == [("fwd", "ok")] * 2

    done = {results.row_key(r) for r in kept}
    rest = [c for c in todo if c.key() not in done]
    assert rest == todo[2:]
    fresh = Fake("good")
    runner.run(rest, BUDGET, {"good": fresh}, on_row=results.CsvSink(path).append)
    assert fresh.calls >= 4 * timing.MIN_REPS  # only the four missing cases were measured
    rows = results.read_rows(path)
    assert sorted(tuple(r[c] for c in results.KEY) for r in rows) == sorted(c.key() for c in todo)


def test_a_half_written_last_line_is_dropped(tmp_path):
    path = tmp_path / results.RESULTS_CSV
    sink = results.CsvSink(path)
    sink.append(runner.row(cases(["x"])[0], "unsupported", "why"))
    with open(path, "a") as f:
        f.write("tiny,1,2,6")  # killed mid-write
    assert len(results.read_rows(path)) == 1
    results.CsvSink(path).append(runner.row(cases(["y"])[0], "unsupported", "why"))
    assert [r["algo"] for r in results.read_rows(path)] == ["x", "y"]


# --- phase breakdown ------------------------------------------------------------------------
class Phasing(Fake):
    """torch-cpu with four named phases: `log` records every whole call ("run") and every
    phase call (its name). `phase_fns` is built in reverse on purpose: `phases()` sets the
    order; `names` (default: the pass's) is what `phases()` claims."""

    def __init__(self, algo, names=None):
        super().__init__(algo)
        self.names, self.log = names, []

    def phases(self, problem, pass_, layout, precision):
        return self.names or phase_names(pass_)

    def prepare(self, problem, pass_, layout, precision):
        fn = super().prepare(problem, pass_, layout, precision)

        def run(a, b, out):
            self.log.append("run")
            fn(a, b, out)

        run.phase_fns = {name: (lambda name=name: self.log.append(name))
                         for name in reversed(phase_names(pass_))}
        return run


def test_a_phased_pass_is_timed_as_its_phases_in_order():
    spy = Phasing("phased")
    (r,) = runner.run(cases(["phased"]), BUDGET, {"phased": spy})
    names = phase_names("fwd")
    assert r["status"] == "ok"
    first = spy.log.index(names[0])
    assert set(spy.log[:first]) == {"run"}  # verified by a whole call first
    sequences = spy.log[first:]  # then timed as its phases only: never a whole call again
    assert len(sequences) % 4 == 0 and len(sequences) >= 4 * timing.MIN_REPS
    assert sequences == names * (len(sequences) // 4)  # always whole sequences, in order
    phases = results.parse_phases(r["phases_ms"])
    assert list(phases) == names and all(ms >= 0 for ms in phases.values())


class Sleepy(Phasing):
    """Phases that take 1, 2, 4 and 8 ms: a pass whose table must add up to its time."""

    def prepare(self, problem, pass_, layout, precision):
        run = super().prepare(problem, pass_, layout, precision)
        run.phase_fns = {name: (lambda ms=ms: time.sleep(ms / 1e3))
                         for name, ms in zip(phase_names(pass_), (1, 2, 4, 8))}
        return run


def test_the_phase_table_adds_up_to_the_pass():
    (r,) = runner.run(cases(["phased"]), BUDGET, {"phased": Sleepy("phased")})
    phases = results.parse_phases(r["phases_ms"])
    assert list(phases) == phase_names("fwd")
    # the median repetition's phases: their sum is the median (to the cell's 6 digits)
    assert sum(phases.values()) == pytest.approx(r["median_ms"], rel=1e-5)
    assert r["median_ms"] >= 15  # the pass's time is its phases' (the whole call never timed)


def test_the_median_repetition_of_an_even_count_is_the_mean_of_the_middle_two():
    from convbench.core.measurement import Measurement
    from convbench.measure.timing import Timed

    steps = {"a": Measurement((1.0, 5.0, 2.0, 9.0)), "b": Measurement((1.0, 1.0, 2.0, 1.0))}
    totals = Measurement((2.0, 6.0, 4.0, 10.0))  # median 5: repetitions 2 and 1
    breakdown = median_repetition(Timed(steps, totals, "budget"))
    assert {k: m.median for k, m in breakdown.items()} == {"a": 3.5, "b": 1.5}
    assert sum(m.median for m in breakdown.values()) == totals.median


def test_a_pass_without_phases_has_no_phases_column():
    (r,) = runner.run(cases(["good"]), BUDGET, {"good": Fake("good")})
    assert r["status"] == "ok" and r["phases_ms"] is None


def test_phases_that_contradict_the_prepared_pass_fail_the_case():
    spy = Phasing("liar", names=["transform x", "product"])
    (r,) = runner.run(cases(["liar"]), BUDGET, {"liar": spy})
    assert r["status"] == "failed" and "phases() names" in r["reason"]


def test_phases_text_round_trip():
    from convbench.core.measurement import Measurement

    text = results.phases_text({"transform x": Measurement((0.5, 0.125, 0.25)),
                               "product": Measurement((2.0,))})
    assert text == "transform x=0.25;product=2"
    assert results.parse_phases(text) == {"transform x": 0.25, "product": 2.0}
    assert results.parse_phases("") == results.parse_phases(None) == {}


EMU_TINY = Layer("custom", "tiny", ConvProblem(n=1, c=4, h=7, w=7, k=4, r=3, s=3, pad=1))


def test_emu_fft_and_winograd_carry_their_four_phases():
    reason = backends.available("emu")
    if reason:
        pytest.skip(reason)
    passes = ("fwd", "bwd_data", "bwd_filter")
    todo = runner.sweep([EMU_TINY], ["fft", "winograd-2x2"], "emu", passes, ["nchw"], ["fp32"])
    rows = runner.run(todo, BUDGET)
    for r in rows:
        assert r["status"] == "ok", r["reason"]
        phases = results.parse_phases(r["phases_ms"])
        assert list(phases) == phase_names(r["pass"]) and all(v > 0 for v in phases.values())
    text = report.markdown(results.frame(rows), {})
    assert "## Phase breakdown" in text
    assert "### fft, bwd_data, fp32" in text and "### winograd-2x2, bwd_filter, fp32" in text


def test_a_results_file_without_the_phases_column_is_refused(tmp_path):
    path = tmp_path / results.RESULTS_CSV
    older = [c for c in results.COLUMNS if c != "phases_ms"]
    path.write_text(",".join(older) + "\n")
    with pytest.raises(ValueError, match="other columns"):
        results.CsvSink(path)


#: Inception's 1x7, strided along the height only.
PER_AXIS = ConvProblem(n=2, c=3, h=9, w=10, k=4, r=1, s=7, stride=(2, 1), pad=(0, 3))


def test_a_per_axis_problem_round_trips_through_the_csv_and_resumes(tmp_path):
    """Real CPU measurements of a per-axis problem: the CSV spells it `2x1`, reads it back as
    the same problem, and a resumed run finds every case done."""
    todo = runner.sweep([Layer("custom", "inception", PER_AXIS)], ["direct", "gemm"], "numpy",
                        ("fwd", "bwd_data", "bwd_filter"), ("nchw", "nhwc"), ["fp32"])
    path = tmp_path / results.RESULTS_CSV
    rows = runner.run(todo, BUDGET, on_row=results.CsvSink(path).append)
    assert [r["status"] for r in rows] == ["ok"] * len(todo)
    assert "stride,pad,dilation" in path.read_text().splitlines()[0]
    back = results.read_rows(path)
    assert {(r["stride"], r["pad"], r["dilation"]) for r in back} == {("2x1", "0x3", "1")}
    assert {results.problem_from_row(r) for r in back} == {PER_AXIS}
    assert {results.row_key(r) for r in back} == {c.key() for c in todo}
    df = results.frame(back)
    assert {results.problem_from_row(r) for _, r in df.iterrows()} == {PER_AXIS}


def test_a_committed_run_with_integer_geometry_still_loads():
    from pathlib import Path

    folder = Path(__file__).parent.parent / "results" / "2026-11-21-cpu-2core-alexnet"
    df, _ = results.load_run(folder)
    problems = {results.problem_from_row(r) for _, r in df.iterrows()}
    assert problems and not any(p.per_axis for p in problems)
    assert all(isinstance(p.stride, int) and isinstance(p.pad, int) for p in problems)


def _alive(cls) -> int:
    """Objects of `cls` the collector tracks, by their type: isinstance on a weakref.proxy
    whose referent is gone raises ReferenceError (Numba's compiler leaves some behind)."""
    import gc

    return sum(issubclass(type(o), cls) for o in gc.get_objects())


def test_no_phased_pass_outlives_its_case_without_the_garbage_collector():
    """A prepared pass frees its arrays, plans and workspaces when its case is done, by
    reference counting alone: a reference cycle would keep them (on a GPU, gigabytes) until the
    collector next ran, so every phased pass of a sweep run with the collector off must be gone
    when the sweep returns."""
    import gc

    from convbench.algos.phases import Phased

    problems = [ConvProblem(n=1, c=2, h=6 + i, w=6, k=3, r=3, s=3, pad=1) for i in range(3)]
    layers = [Layer("custom", f"tiny{i}", p) for i, p in enumerate(problems)]
    sweep = runner.sweep(layers, ["torch-cpu"], "numpy", ["fwd", "bwd_data", "bwd_filter"],
                         ["nchw", "nhwc"], ["fp32"])
    runner.run(sweep[:1], BUDGET)  # the first imports (torch's raise and catch: frame cycles)
    gc.collect()
    before = _alive(Phased)
    was = gc.isenabled()
    gc.disable()
    try:
        rows = runner.run(sweep, BUDGET)
        assert [r["status"] for r in rows] == ["ok"] * len(sweep)
        assert _alive(Phased) == before
    finally:
        if was:
            gc.enable()


def test_torch_s_result_is_not_counted_as_its_workspace():
    """torch allocates its result and the harness copies it into the output; our kernels write
    into the output they are given and never count it. A torch-cpu row counts its result like
    ours: a 1x1 channels-last forward, which oneDNN runs without a buffer torch allocates (in
    NCHW it reorders into one of the output's size, a real workspace), peaks below half an
    output's size (counting the result, it peaked above one output)."""
    p = ConvProblem(n=8, c=8, h=64, w=64, k=32, r=1, s=1)
    (r,) = runner.run(runner.sweep([Layer("custom", "1x1", p)], ["torch-cpu"], "numpy",
                                   ["fwd"], ["nhwc"], ["fp32"]), BUDGET)
    out_bytes = 4 * p.n * p.k * p.h * p.w
    assert r["status"] == "ok" and r["peak_bytes"] is not None
    assert r["peak_bytes"] < out_bytes / 2


def test_a_fault_while_describing_is_blamed_on_that_case_and_stops_the_run():
    """A case whose description (cuDNN's profiled call) faults the GPU is that case's failure:
    swallowed into its note, the next case would be blamed for the unusable device."""
    class Faulty(Fake):
        def describe(self, *args):
            raise STICKY

    impls = {"good": Fake("good"), "faulty": Faulty("faulty"), "later": Fake("later")}
    seen = []
    with pytest.raises(runner.DeviceFault, match="tiny faulty fwd nchw faulted the GPU") as exc:
        runner.run(cases(["good", "faulty", "later"]) + cases(["good"], passes=("bwd_data",)),
                   BUDGET, impls, on_row=seen.append)
    assert [(r["algo"], r["pass"], r["status"]) for r in seen] == [
        ("good", "fwd", "ok"), ("later", "fwd", "ok"), ("faulty", "fwd", "failed")]
    assert "illegal memory access" in exc.value.row["reason"]
    assert seen[1]["note"] == "(no description: the GPU faulted describing faulty nchw)"


def test_each_layout_is_transposed_once_per_problem_and_pass(monkeypatch):
    """Every algorithm of a (problem, pass) shares the operands and the reference: a layout is
    made once (three transposes: a, b, the reference), not once per case."""
    calls = []
    real = reference.to_layout

    def counting(a, layout):
        calls.append(layout)
        return real(a, layout)

    monkeypatch.setattr(reference, "to_layout", counting)
    rows = runner.run(cases(["torch-cpu", "good"], layouts=("nchw", "nhwc")), BUDGET,
                      {"good": Fake("good")})
    assert [r["status"] for r in rows] == ["ok"] * 4
    assert calls.count("nhwc") == 3  # (before: 3 per case)


def test_each_host_stage_of_a_run_is_timed():
    runner.stage_seconds(reset=True)
    runner.run(cases(["torch-cpu"]), BUDGET)
    seconds = runner.stage_seconds(reset=True)
    assert list(seconds) == list(runner.STAGES)
    assert all(seconds[s] > 0 for s in ("operands", "prepare", "verify", "time"))
    assert set(runner.stage_seconds().values()) == {0.0}


@pytest.mark.gpu_pins
@pytest.mark.gpu
def test_a_gpu_case_is_verified_on_the_device():
    """On the GPU the reference stays on the device and the check runs there, in float64, with
    the host's answer."""
    import cupy

    from convbench.measure import verify

    case = runner.sweep([LAYER], ["cudnn"], "cuda", ["fwd"], ["nhwc"], ["fp32"])[0]
    ref = runner.Operands(on_device=True).get(case, cupy)[2]
    assert isinstance(ref, cupy.ndarray) and ref.dtype == cupy.float64
    out = (ref + 1e-3 * cupy.random.standard_normal(ref.shape)).astype(cupy.float32)
    on_device, on_host = verify.errors(out, ref), verify.errors(out.get(), ref.get())
    assert on_device == pytest.approx(on_host, rel=1e-6)
    out[0, 0, 0, 0] = cupy.nan
    assert verify.errors(out, ref) == (float("inf"), float("inf"))


def test_an_output_whose_random_terms_cancel_is_not_a_failed_row():
    """One output element whose 40 terms sum to 0.0085: judged against its own size, rounding
    of 2.5e-7 failed direct and torch-cpu (`convbench layer` said `failed`); the runner's
    operands carry the magnitude floor (`verify.magnitude_floor`)."""
    p = ConvProblem(n=1, c=4, h=5, w=5, k=1, r=5, s=2, stride=(1, 3), dilation=(1, 2))
    layer = Layer("custom", "cancel", p)
    for case in runner.sweep([layer], ["direct", "torch-cpu"], "numpy", ["fwd"], ["nchw"],
                             ["fp32"]):
        operands = runner.Operands()
        ready = runner.prepare(case, operands)
        assert operands.floor > 1.0 and ready.check.ok, ready.check.reason


# --- the limit: a row faster than the device can go is not a result ---------------------------
def device_ceilings(**figures):
    """conftest's fake ceilings with the figures given (GFLOP/s, GB/s)."""
    import dataclasses

    from convbench.measure import ceilings

    return dataclasses.replace(ceilings.measure("cpu", 1), **figures)


#: A CPU's ceilings: 100 GFLOP/s attainable, 150 peak (the guard's roof: 150 x 1.25).
CPU_LIKE = {"gflops_attainable": 100.0, "gflops_peak_theoretical": 150.0}


def plant_fast(monkeypatch, algo: str, factor: float = 1e-10) -> None:
    """The timer reports `algo`'s case `factor` times its real time (a missed
    synchronisation, a timer around the wrong call): far faster than the device can go, even
    where a loaded machine makes the tiny case's real call take 60 ms (it did here, beside two
    other test runs on 2 cores: at 1e-6 the planted row stayed under the ceiling)."""
    import dataclasses

    from convbench.core.measurement import Measurement

    real = runner._time_part

    def time_part(part, *args, **kw):
        real_rounds = timing.time_rounds

        def rounds(contenders, budget_s, backend, **options):
            out = real_rounds(contenders, budget_s, backend, **options)
            if len(out) != len(part):  # a phase timing of one contender
                return out
            return [dataclasses.replace(t, total=Measurement(tuple(
                v * factor for v in t.total.times_ms))) if case.algo == algo else t
                for (case, _), t in zip(part, out)]

        monkeypatch.setattr(timing, "time_rounds", rounds)
        try:
            return real(part, *args, **kw)
        finally:
            monkeypatch.setattr(timing, "time_rounds", real_rounds)

    monkeypatch.setattr(runner, "_time_part", time_part)


def test_a_planted_too_fast_row_is_failed_and_a_plausible_one_passes(monkeypatch):
    """With the device's ceilings, a row timed faster than the device can go is `failed` with
    the guard's reason, no time of its own (never a win), its check kept; its competitor,
    timed beside it at its real speed, is `ok`. Without ceilings nothing is guarded."""
    impls = {"good": Fake("good"), "fast": Fake("fast")}
    plant_fast(monkeypatch, "fast")
    unguarded = {r["algo"]: r for r in runner.run(cases(impls), BUDGET, impls)}
    assert unguarded["fast"]["status"] == "ok"  # the old behaviour: a 1e6x win
    rows = {r["algo"]: r for r in runner.run(cases(impls), BUDGET, impls,
                                             ceilings=device_ceilings(**CPU_LIKE))}
    assert rows["good"]["status"] == "ok" and rows["good"]["gflops"] < 100
    fast = rows["fast"]
    assert fast["status"] == "failed" and fast["reason"].startswith("implausible: timed at")
    assert "a timing or synchronisation bug" in fast["reason"]
    assert fast["median_ms"] is None and fast["gflops"] is None
    assert fast["rel_error"] is not None and set(fast) == set(results.COLUMNS)
    df = results.frame(list(rows.values()))
    winners = report.winner_table(df)  # good's, or none where the machine was busy
    assert winners.loc[("tiny", "fwd"), "fastest"] in ("good nchw", "")
    assert "fast failed" in winners.loc[("tiny", "fwd"), "did not run"]
    assert report.time_table(df).loc["fast", "tiny"] == "failed"


def test_a_tiny_ceiling_fails_every_row_a_high_one_none():
    impls = {"good": Fake("good")}
    (low,) = runner.run(cases(impls), BUDGET, impls,
                        ceilings=device_ceilings(gflops_attainable=1e-9,
                                                 gflops_peak_theoretical=None))
    assert low["status"] == "failed" and "implausible" in low["reason"]
    (high,) = runner.run(cases(impls), BUDGET, impls, ceilings=device_ceilings(**CPU_LIKE))
    assert high["status"] == "ok"


def test_the_guard_allows_fft_and_winograd_their_reduction_and_libraries_the_largest():
    from convbench.catalogs import layers
    from convbench.measure import opcount, rows

    conv3 = layers.resolve("alexnet:conv3").problem.with_batch(1)
    layer = Layer("alexnet", "conv3", conv3)
    (wino, gemm, torch_cpu, cudnn_gemm) = runner.sweep(
        [layer], ["winograd-4x4", "gemm", "torch-cpu", "cudnn-find-implicit-gemm"], "numpy",
        ["fwd"], ["nchw"], ["fp32"])
    ops = opcount.op_count("winograd-4x4", conv3, "fwd").total
    assert rows.reduction(wino, ops) == pytest.approx(conv3.flops / ops) and ops < conv3.flops
    assert rows.reduction(gemm, conv3.flops) == 1.0
    assert rows.reduction(cudnn_gemm, None) == 1.0
    # a library's own choice may be a Winograd or an FFT kernel: our best reduction is allowed
    assert rows.reduction(torch_cpu, None) >= conv3.flops / ops > 1
    c = device_ceilings(**CPU_LIKE)  # roof 150 x 1.25
    fast = {"gflops": 150 * 1.25 * 1.5, "algo_ops": ops}  # 1.5x the roof in direct flops
    # F(4x4) does ~2x fewer operations here, its transforms counted
    assert rows.plausibility(fast, wino, c) is None
    assert rows.plausibility(fast, gemm, c) is not None
    tf32 = runner.sweep([layer], ["gemm"], "numpy", ["fwd"], ["nchw"], ["tf32"])[0]
    assert rows.plausibility(fast, tf32, c) is None  # tensor cores: above the fp32 roof
    assert rows.plausibility(fast, gemm, None) is None


@pytest.mark.parametrize("count", [1, 2])
def test_host_rounds_of_more_than_one_thread_time_each_call_with_its_pool_awake(count,
                                                                               monkeypatch):
    """On the host with 2 threads each timed repetition follows an untimed call of its own
    (`timing.WARM_POOLS`); with 1 there is no pool to wake, and rounds time calls as they
    come."""
    from convbench.machine import threads

    seen = []
    real = timing.time_rounds
    monkeypatch.setattr(timing, "time_rounds", lambda contenders, budget, backend, **o: (
        seen.append(o.get("warm", False)), real(contenders, budget, backend, **o))[1])
    try:
        threads.use(count)
        assert runner.warm_pools("numpy") is (count > 1) and not runner.warm_pools("cuda")
        impls = fakes()
        runner.run(cases(["good"]), BUDGET, impls)
    finally:
        threads.use()
    assert seen == [count > 1]
