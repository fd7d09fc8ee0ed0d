"""The first GPU check in two commands, each within the ten minutes a lent machine gives one:

    convbench gpu-check [--out DIR]            # the run and its summary (under 6 min on an H100)
    convbench gpu-check --tests [--out DIR]    # the `gpu` tests, into DIR/tests.log (under 8)
    convbench gpu-check --device cpu --batch 1 --layers conv3   # the dry form CI runs

`gpu-check` runs a net with every algorithm (cuDNN's one by one too: `cudnn-find`), pass and
layout, and writes env.json, the run folder and summary.md (`summary`: the ratios), with the host
seconds of each stage of the run (`runner.stage_seconds`: operands and reference, memory
release, preparing, verifying, timing, describing) so the next check knows where its minutes
went. It streams its rows: a command cut short keeps them and the same command resumes the run.
`fft-tiled` is left out where it would not tile (`fft` runs the same transforms). `--tests` runs
the `gpu` tests in a process of their own (a GPU fault in the run leaves only that process's
device unusable), under a time limit, and adds their line to summary.md.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from .. import runs
from ..algos import registry
from ..analysis import summary
from ..catalogs import layers as catalogs
from ..core.problem import LAYOUTS, PASSES
from ..core.results import ENV_JSON, RunFolder
from ..machine.devices import Device
from ..measure import runner

RUN = "run"
TESTS_LOG = "tests.log"
SUMMARY_MD = "summary.md"
#: What the tests run: the `gpu` marker's tests, quietly, without a cache in the checkout.
PYTEST_ARGS = ("-m", "gpu", "-q", "-p", "no:cacheprovider")
#: What `gpu-check` runs by default: every algo, and on a GPU cuDNN's algorithms one by one.
ALGOS = {"cuda": "all,cudnn-find"}
#: Seconds the tests may take (`--tests-timeout`): within a ten-minute command.
TESTS_TIMEOUT_S = 480


@dataclass
class Tests:
    """How the tests went: pytest's exit code (None: not run), its last line, its arguments."""

    returncode: int | None
    line: str
    args: tuple[str, ...] = ()
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return self.returncode in (None, 0, 5)  # 5: nothing collected


@dataclass
class CheckRun:
    """What the run left in its folder: its outcome, the summary's text."""

    folder: Path
    outcome: runs.Outcome
    text: str

    @property
    def ok(self) -> bool:
        return self.outcome.fault is None and not self.outcome.interrupted


def source_checkout() -> Path | None:
    """The checkout convbench runs from, when it has its tests (not an installed wheel)."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / "tests").is_dir() and (root / "pyproject.toml").is_file() else None


def run_tests(log: Path, pytest_args: tuple[str, ...] = PYTEST_ARGS,
              timeout_s: float = TESTS_TIMEOUT_S) -> Tests:
    """pytest with `pytest_args` in a process of its own, from the checkout, its output in
    `log`; the last line of its report."""
    root = source_checkout()
    if root is None:
        return Tests(None, "not run: convbench is installed without its tests", pytest_args)
    started = time.monotonic()
    with open(log, "w") as out:
        try:
            proc = subprocess.run([sys.executable, "-m", "pytest", *pytest_args], cwd=root,
                                  stdout=out, stderr=subprocess.STDOUT, timeout=timeout_s,
                                  check=False)
        except subprocess.TimeoutExpired:
            return Tests(-1, f"timed out after {timeout_s:g} s (see {log.name})", pytest_args,
                         time.monotonic() - started)
    lines = [ln.strip() for ln in log.read_text().splitlines() if ln.strip()]
    return Tests(proc.returncode, (lines or ["no output"])[-1].strip("= "), pytest_args,
                 time.monotonic() - started)


def never_tiles(case: runner.Case) -> bool:
    """Whether `case` is `fft-tiled` on a problem it runs as one tile: `fft`'s transforms."""
    if case.algo != "fft-tiled":
        return False
    impl = registry.get(case.algo, case.backend)
    return isinstance(impl, registry.TransformGrid) and \
        impl.transform_grid(case.problem, case.pass_)[2] == 1


def run_check(folder: str | Path, device: Device, *, net: str = "alexnet",
          layers: list[str] | None = None, algos: str | None = None, batch: int | None = None,
          budget_s: float | None = None, command: str = "") -> CheckRun:
    """Run the check into `folder` (a resumed run if it has one) and write its summary; see the
    module docstring. ValueError for a bad net, layer or algo list, before anything runs."""
    folder = Path(folder)
    names = layers or [layer.name for layer in catalogs.net_layers(net)]
    cases = runs.sweep_cases([f"{net}:{name}" for name in names], net, [batch], device,
                             registry.expand_algos(algos or ALGOS.get(device.backend, "all"),
                                                   device.backend), PASSES, LAYOUTS,
                             ["fp32"])
    untiled = [c for c in cases if never_tiles(c)]
    cases = [c for c in cases if not never_tiles(c)]
    budget = budget_s or device.budget_s
    folder.mkdir(parents=True, exist_ok=True)
    env = runs.environment(device, net, cases, budget, batch=batch, command=command)
    (folder / ENV_JSON).write_text(json.dumps(env, indent=1) + "\n")
    started = time.monotonic()
    runner.stage_seconds(reset=True)
    outcome = runs.Run(cases, budget, RunFolder.open(folder / RUN, env, resume=True)).measure()
    seconds = {"run": time.monotonic() - started, **runner.stage_seconds(reset=True)}
    notes = [(f"fft-tiled left out of {len(untiled)} cases where it runs one tile (fft's "
               "transforms)")] if untiled else []
    text = markdown(env, outcome, seconds, notes)
    (folder / SUMMARY_MD).write_text(text)
    return CheckRun(folder, outcome, text)


def tests(folder: str | Path, pytest_args=PYTEST_ARGS,
          timeout_s: float = TESTS_TIMEOUT_S) -> Tests:
    """The `gpu` tests into `folder`/tests.log; their line replaces summary.md's (where a run
    left one)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tested = run_tests(folder / TESTS_LOG, tuple(pytest_args), timeout_s)
    path = folder / SUMMARY_MD
    if path.is_file():
        text = re.sub(r"(?m)^- tests: .*\n", "", path.read_text())
        head, sep, rest = text.partition("\n\n")
        path.write_text(f"{head}\n{tests_line(tested)}{sep}{rest}")
    return tested


def tests_line(tested: Tests) -> str:
    return (f"- tests: `pytest {' '.join(tested.args)}`: {tested.line}"
            + (f", in {tested.seconds:.0f} s ({TESTS_LOG})" if tested.returncode is not None
               else ""))


def markdown(env: dict, outcome: runs.Outcome, seconds: dict[str, float],
             notes: list[str] = ()) -> str:
    """summary.md: what ran where, how the run went and where its host time went, then the
    ratios."""
    gpu = env.get("gpu") or {}
    torch = env.get("torch") or {}
    counts = outcome.frame["status"].value_counts() if len(outcome.frame) else {}
    stages = ", ".join(f"{name} {seconds[name]:.1f} s" for name in runner.STAGES
                       if name in seconds)
    facts = [
        ("device", env.get("device")),
        ("versions", f"driver {gpu.get('driver')}, CUDA runtime {gpu.get('cuda_runtime')}, "
                     f"cuDNN {torch.get('cudnn')}, torch {torch.get('version')}, "
                     f"CuPy {env.get('cupy')}" if gpu else None),
        ("FP32 peak", f"{gpu['fp32_peak_tflops']:.4g} TFLOP/s ({gpu['sm_count']} SMs at "
                      f"{gpu['clock_khz'] / 1e6:.3g} GHz)" if gpu.get("fp32_peak_tflops")
         else None),
        ("run", f"{RUN}/ ({RUN}/report.md): " + ", ".join(
            f"{counts[s]} {s}" for s in getattr(counts, "index", [])) +
         f", in {seconds['run']:.0f} s" + (", interrupted" if outcome.interrupted else "")),
        ("host stages of the run", stages or None),
        ("GPU fault", outcome.fault),
        *(("note", n) for n in notes),
        ("command", env.get("run", {}).get("command")),
    ]
    lines = [f"# GPU check: {env.get('device')}", ""]
    lines += [f"- {k}: {v}" for k, v in facts if v]
    return "\n".join(lines + ["", summary.markdown(outcome.frame, env)])
