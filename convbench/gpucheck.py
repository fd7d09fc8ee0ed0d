"""The first GPU check as one call: the environment, a run of a net with every algorithm, pass
and layout, the summary of its ratios (`summary`), and the `gpu` tests' log, in one folder.

    convbench gpu-check [--out DIR]                           # on the GPU: everything in DIR
    convbench gpu-check --device cpu --batch 1 --layers conv3   # its dry form, which CI runs

Made for machines lent for minutes, with commands cut at ten: the run comes first (the README
quotes it) and streams its rows, so a command cut short keeps them and the same command resumes
the run; the tests come last, in a process of their own (a GPU fault in the run leaves only this
process's device unusable), under a time limit. Each stage's duration is in the summary.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from . import layers as catalogs
from . import registry, runs, summary
from .devices import Device
from .problem import LAYOUTS, PASSES
from .results import ENV_JSON, RunFolder

RUN = "run"
TESTS_LOG = "tests.log"
SUMMARY_MD = "summary.md"
#: What the tests run: the `gpu` marker's tests, quietly, without a cache in the checkout.
PYTEST_ARGS = ("-m", "gpu", "-q", "-p", "no:cacheprovider")


@dataclass
class Tests:
    """How the tests went: pytest's exit code (None: not run), its last line, its arguments."""

    returncode: int | None
    line: str
    args: tuple[str, ...] = ()

    @property
    def passed(self) -> bool:
        return self.returncode in (None, 0, 5)  # 5: nothing collected


@dataclass
class Check:
    """What the check left in its folder: the run's outcome, the tests, the summary's text."""

    folder: Path
    outcome: runs.Outcome
    tests: Tests
    text: str

    @property
    def ok(self) -> bool:
        return self.outcome.fault is None and not self.outcome.interrupted and self.tests.passed


def source_checkout() -> Path | None:
    """The checkout convbench runs from, when it has its tests (not an installed wheel)."""
    root = Path(__file__).resolve().parent.parent
    return root if (root / "tests").is_dir() and (root / "pyproject.toml").is_file() else None


def run_tests(log: Path, pytest_args: tuple[str, ...] = PYTEST_ARGS,
              timeout_s: float = 240) -> Tests:
    """pytest with `pytest_args` in a process of its own, from the checkout, its output in
    `log`; the last line of its report."""
    root = source_checkout()
    if root is None:
        return Tests(None, "not run: convbench is installed without its tests", pytest_args)
    with open(log, "w") as out:
        try:
            proc = subprocess.run([sys.executable, "-m", "pytest", *pytest_args], cwd=root,
                                  stdout=out, stderr=subprocess.STDOUT, timeout=timeout_s,
                                  check=False)
        except subprocess.TimeoutExpired:
            return Tests(-1, f"timed out after {timeout_s:g} s (see {log.name})", pytest_args)
    lines = [ln.strip() for ln in log.read_text().splitlines() if ln.strip()]
    return Tests(proc.returncode, (lines or ["no output"])[-1].strip("= "), pytest_args)


def check(folder: str | Path, device: Device, *, net: str = "alexnet",
          layers: list[str] | None = None, algos: str = "all", batch: int | None = None,
          budget_s: float | None = None, tests: bool = True, pytest_args=PYTEST_ARGS,
          tests_timeout_s: float = 240, command: str = "") -> Check:
    """Run the check into `folder` (a resumed run if it has one); see the module docstring.
    ValueError for a bad net, layer or algo list, before anything runs."""
    folder = Path(folder)
    names = layers or [layer.name for layer in catalogs.net_layers(net)]
    cases = runs.sweep_cases([f"{net}:{name}" for name in names], net, [batch], device,
                             registry.expand_algos(algos, device.backend), PASSES, LAYOUTS,
                             ["fp32"])
    budget = budget_s or device.budget_s
    folder.mkdir(parents=True, exist_ok=True)
    env = runs.environment(device, net, cases, budget, batch=batch, command=command)
    (folder / ENV_JSON).write_text(json.dumps(env, indent=1) + "\n")
    started = time.monotonic()
    outcome = runs.Run(cases, budget, RunFolder.open(folder / RUN, env, resume=True)).measure()
    seconds = {"run": time.monotonic() - started, "tests": 0.0}
    if not tests:
        tested = Tests(None, "not run (--no-tests)", tuple(pytest_args))
    else:  # the summary first: a command cut short during the tests still leaves it
        (folder / SUMMARY_MD).write_text(markdown(env, outcome, Tests(
            None, "started, not finished (this line stays if the command was cut short then)",
            tuple(pytest_args)), seconds))
        started = time.monotonic()
        tested = run_tests(folder / TESTS_LOG, tuple(pytest_args), tests_timeout_s)
        seconds["tests"] = time.monotonic() - started
    text = markdown(env, outcome, tested, seconds)
    (folder / SUMMARY_MD).write_text(text)
    return Check(folder, outcome, tested, text)


def markdown(env: dict, outcome: runs.Outcome, tests: Tests, seconds: dict[str, float]) -> str:
    """summary.md: what ran where, how the run and the tests went, then the ratios."""
    gpu = env.get("gpu") or {}
    torch = env.get("torch") or {}
    counts = outcome.frame["status"].value_counts()
    facts = [
        ("device", env.get("device")),
        ("versions", f"driver {gpu.get('driver')}, CUDA runtime {gpu.get('cuda_runtime')}, "
                     f"cuDNN {torch.get('cudnn')}, torch {torch.get('version')}, "
                     f"CuPy {env.get('cupy')}" if gpu else None),
        ("FP32 peak", f"{gpu['fp32_peak_tflops']:.4g} TFLOP/s ({gpu['sm_count']} SMs at "
                      f"{gpu['clock_khz'] / 1e6:.3g} GHz)" if gpu.get("fp32_peak_tflops")
         else None),
        ("run", f"{RUN}/ ({RUN}/report.md): " + ", ".join(
            f"{counts[s]} {s}" for s in counts.index) + f", in {seconds['run']:.0f} s"
         + (", interrupted" if outcome.interrupted else "")),
        ("GPU fault", outcome.fault),
        ("tests", f"`pytest {' '.join(tests.args)}`: {tests.line}"
                  + (f", in {seconds['tests']:.0f} s ({TESTS_LOG})"
                     if tests.returncode is not None else "")),
        ("command", env.get("run", {}).get("command")),
    ]
    lines = [f"# GPU check: {env.get('device')}", ""]
    lines += [f"- {k}: {v}" for k, v in facts if v]
    return "\n".join(lines + ["", summary.markdown(outcome.frame, env)])
