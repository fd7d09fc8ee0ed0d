"""`convbench gpu-first` and `convbench gpu-check`: the first GPU check (`convbench.runs.gpucheck`):
one command for a first visit within its budget, packed for the trip back; or the whole run and
its summary, then `--tests`, each within a ten-minute command.

Both run on CUDA unless told `--device cpu` or `emu` (their dry forms): where CUDA cannot be
used they refuse at once, in one line, instead of quietly running the CPU's form."""

from __future__ import annotations

import re
import shlex
import sys
import time
from pathlib import Path

from .. import runs
from ..algos import registry
from ..catalogs import layers, selection
from ..core.fmt import first_line
from ..core.problem import PRECISIONS
from ..machine.devices import DEVICES
from ..planning import models
from ..runs import gpucheck
from .common import (
    EXIT_FAULT,
    UsageError,
    choices,
    device_option,
    positive,
    precisions_option,
    resolve_device,
    time_budget_option,
    usage_errors,
)


def _device(args):
    """The device asked for; without `--device`, CUDA or a one-line refusal."""
    if args.device is None:
        reason = gpucheck.cuda_refusal()
        if reason:
            raise UsageError(f"CUDA cannot be used here: {reason} (the dry form is asked for "
                             "by name: --device cpu)")
        return resolve_device("cuda")
    return resolve_device(args.device)


def _common(args, device) -> tuple[list[str] | None, tuple[str, ...]]:
    names = [layer.name for layer in layers.net_layers(args.net)]
    with usage_errors():
        chosen = choices(args.layers, "layer", tuple(names)) if args.layers else None
        registry.expand_algos("all" if args.algos is None else args.algos, device.backend)
        pytest_args = tuple(shlex.split(args.pytest_args))
    return chosen, pytest_args


def _command(args) -> str:
    return " ".join(["convbench", *getattr(args, "argv", [])])


#: The whole training step in the GPU check (`--models`): torchvision's models, each tuned and
#: confirmed, then eager (cuDNN's heuristics), cudnn.benchmark, channels_last and the plan, each
#: in a process of its own (`studies.trainstep`).
CHECK_MODELS = "torchvision.models:resnet50"
CHECK_MODEL_INPUT = "64,3,224,224"
#: gpu-first's shortest form of it, run only where the budget allows (`gpucheck.EXTRA_MIN_S`).
FIRST_MODELS = "torchvision.models:resnet18"
FIRST_MODEL_INPUT = "32,3,224,224"
STEP_CONFIGS = ("eager", "cudnn.benchmark", "channels_last", "plan")
#: The algorithms a model's plan is tuned from on a GPU (`--model-algos`): cuDNN in both modes
#: and our two fastest there, so a real model's tuning fits a lent GPU's command, which every
#: algorithm and cuDNN's one by one would outlast (docs/pages/cuda.md, what the whole step
#: costs). The dry form on the CPU tunes from all.
MODEL_ALGOS = {"cuda": "cudnn,cudnn-autotune,gemm-cublas,winograd-4x4"}
#: Seconds of timed steps per configuration in the check.
STEP_BUDGET_S = 3.0


def _models(args) -> tuple[list[str], tuple[int, ...]]:
    """(the models of --models, the input of --model-input); UsageError for a bad one."""
    models_ = [] if args.models.strip() == "none" else [
        m.strip() for m in args.models.split(",") if m.strip()]
    with usage_errors():
        shape = models.parse_input(args.model_input)
    return models_, shape


def model_algos(args, device) -> str:
    """--model-algos, or the backend's default (`MODEL_ALGOS`); UsageError for a bad list."""
    algos = args.model_algos or MODEL_ALGOS.get(device.backend, "all")
    with usage_errors():
        registry.expand_algos(algos, device.backend)
    return algos


def model_steps(folder: Path, device, specs: list[str], shape: tuple[int, ...],
                algos: str = "all", left_s: float | None = None) -> str:
    """Each model's training step (`trainstep.compare` in `STEP_CONFIGS`, its plan tuned from
    `algos`) into `folder`/trainstep-<model>/ (each configuration's line there as it ends, so a
    visit cut short keeps them), and a summary.md section of their tables; a model
    that cannot run, or that `left_s` seconds (None: no limit) do not see through, is one line
    in it, the others run while time is left."""
    from ..measure import envinfo
    from ..studies import trainstep
    from ..studies.workload import Workload

    lines = ["## The whole training step", "",
             (f"Each model at {','.join(map(str, shape))}, fp32 (TF32 off): its plan tuned and "
              "confirmed on the training step, then each configuration in a process of its own "
              f"({', '.join(STEP_CONFIGS)}), {STEP_BUDGET_S:g} s of steps each."), ""]
    deadline = None if left_s is None else time.monotonic() + left_s
    for spec in specs:
        load = Workload.of_model(spec, tuple(shape[1:]))
        sub = folder / f"trainstep-{re.sub(r'[^a-z0-9]+', '-', spec.lower()).strip('-')}"
        try:
            rows, plan, tuning_s = trainstep.compare(
                load, shape[0], device.name, budget_s=STEP_BUDGET_S, store=folder / "plans",
                log=lambda line: print(f"convbench: {line}", file=sys.stderr),
                configs=STEP_CONFIGS, algos=algos, deadline=deadline, folder=sub)
            env = envinfo.collect(device.backend)
            text = trainstep.markdown(rows, plan, load, shape[0], env["device"],
                                      device.backend, tuning_s, default_batch=False)
            trainstep.write(sub, rows, plan, text, env, {"net": load.name, "batch": shape[0],
                                                         "device": device.name,
                                                         "mode": "train"})
        except trainstep.OutOfTime as exc:
            lines += [f"### {spec}", "", f"not finished: {first_line(exc)}", ""]
            continue
        except Exception as exc:  # noqa: BLE001 - this model's line says why; the rest run
            lines += [f"### {spec}", "", f"failed: {type(exc).__name__}: {first_line(exc)}", ""]
            continue
        lines += [f"### {spec} ({sub.name}/report.md)", "",
                  trainstep.table(rows, device.backend), ""]
    return "\n".join(lines)


def cmd_gpu_check(args) -> int:
    device = _device(args)
    chosen, pytest_args = _common(args, device)
    folder = (Path(args.out) if args.out
              else runs.default_folder(args.net, device.backend, "-gpu-check", runs.FINDINGS))
    if args.tests:
        tested = gpucheck.tests(folder, pytest_args, args.tests_timeout)
        print(gpucheck.tests_line(tested))
        print(f"convbench: {gpucheck.TESTS_LOG} in {folder}", file=sys.stderr)
        return 0 if tested.passed else EXIT_FAULT
    with usage_errors():
        classes = ([] if args.classes.strip() == "none"
                   else selection.parse_classes(args.classes))
        if args.class_algos:
            registry.expand_algos(args.class_algos, device.backend)
    specs, shape = _models(args)
    algos = model_algos(args, device)
    done = gpucheck.run_check(
        folder, device, net=args.net, layers=chosen, algos=args.algos, batch=args.batch,
        budget_s=args.time_budget, command=_command(args), classes=classes,
        sample=args.sample, class_algos=args.class_algos, precisions=args.precisions)
    if specs and done.fault is None:
        text = done.text.rstrip("\n") + "\n\n" + model_steps(folder, device, specs, shape,
                                                               algos)
        (folder / gpucheck.SUMMARY_MD).write_text(text)
        done.text = text
    print(done.text.rstrip("\n"))
    parts = f"{gpucheck.RUN}/" + (f", {gpucheck.CLASSES_RUN}/" if done.classes else "")
    print(f"convbench: {gpucheck.SUMMARY_MD}, {parts}, env.json in {folder}; then "
          f"`convbench gpu-check --tests --out {folder}` for the gpu tests", file=sys.stderr)
    if done.fault:
        print(f"convbench: error: {done.fault}; run the same command again to continue "
              "after it", file=sys.stderr)
    return 0 if done.ok else EXIT_FAULT


def cmd_gpu_first(args) -> int:
    device = _device(args)
    chosen, pytest_args = _common(args, device)
    specs, shape = _models(args)
    algos = model_algos(args, device)
    extra = (lambda work, left_s: model_steps(work, device, specs, shape, algos, left_s)
             ) if specs else None
    with usage_errors():
        first = gpucheck.first(
            args.out, device, work=args.work, net=args.net, layers=chosen, algos=args.algos,
            batch=args.batch, budget_s=args.time_budget, wall_s=args.wall,
            pytest_args=pytest_args, tests_timeout_s=args.tests_timeout,
            command=_command(args), tests=not args.no_tests, extra=extra,
            precisions=args.precisions)
    print(first.text.rstrip("\n"))
    print(f"convbench: {', '.join(p.name for p in first.files)} in {args.out}", file=sys.stderr)
    return 0 if first.ok else EXIT_FAULT


def _options(p, tests_default: float, pytest_default: tuple[str, ...]) -> None:
    device_option(p, "default cuda, refused in one line where CUDA cannot be used; cpu or "
                  "emu: the dry form", tuple(DEVICES))
    p.add_argument("--net", default="alexnet", choices=layers.NETS)
    p.add_argument("--layers", help="comma list of layers of --net (default: all)")
    p.add_argument("--algos", help="comma list of algos (default: all, and on cuda "
                   "cudnn-find, cuDNN's algorithms one by one)")
    p.add_argument("--batch", type=positive(int),
                   help="batch size (default: the catalog's on cuda, the study's 256 for "
                        f"alexnet; {DEVICES['cpu'].batch} on cpu)")
    time_budget_option(p, "seconds of timed repetitions per measurement (default "
                          f"{DEVICES['cuda'].budget_s} on cuda)")
    precisions_option(p, f"comma list of {', '.join(PRECISIONS)}, each measured and summarised "
                         "on its own: fp32 with TF32 off, tf32 with cuDNN's allow_tf32 on, fp16 "
                         "and bf16 in their storage type (default "
                         f"{','.join(gpucheck.PRECISIONS_DEFAULT)})",
                      gpucheck.PRECISIONS_DEFAULT)
    # quoted as a shell would (`shlex.join`), the way `_common` splits it back: a marker
    # expression is one argument of `-m`, not words pytest would take for paths
    p.add_argument("--pytest-args", default=shlex.join(pytest_default),
                   help="what the tests run pytest with, given with '=' since it starts "
                        "with '-' (--pytest-args='-m gpu -x'; default: %(default)s)")
    p.add_argument("--tests-timeout", type=positive(float), default=tests_default,
                   metavar="S", help="seconds the tests may take (default %(default)s)")


def _model_options(p, models_default: str, input_default: str, when: str) -> None:
    p.add_argument("--models", default=models_default, metavar="MODULE:CALLABLE,...",
                   help="the whole training step of these models, each tuned and confirmed, "
                        f"then {', '.join(STEP_CONFIGS)} ({when}; none: not at all; default "
                        "%(default)s)")
    p.add_argument("--model-input", default=input_default, metavar="N,C,H,W",
                   help="their input batch (default %(default)s)")
    p.add_argument("--model-algos", metavar="ALGOS",
                   help="the algorithms their plans are tuned from (default on cuda "
                        f"{MODEL_ALGOS['cuda']}; on cpu all)")


def add_parsers(sub) -> None:
    p = sub.add_parser("gpu-first", help="a first GPU visit in one command within "
                       f"{gpucheck.FIRST_BUDGET_S / 60:.0f} minutes: the gpu tests, env and "
                       "ceilings, AlexNet's layers as far as the time goes, the summary; "
                       f"packed into --out as at most {gpucheck.MAX_FILES} files")
    p.add_argument("--out", required=True, help="folder the packed files are written to")
    p.add_argument("--work", help="the check's folder (default results/<date>-<device>-"
                   "<net>-gpu-first; `gpu-check --out` on it resumes what was not reached)")
    p.add_argument("--wall", type=positive(float), default=gpucheck.FIRST_BUDGET_S,
                   metavar="S", help="seconds of wall time for everything (default "
                                     "%(default)s)")
    _model_options(p, FIRST_MODELS, FIRST_MODEL_INPUT,
                   f"run after AlexNet where {gpucheck.EXTRA_MIN_S:.0f} s are left")
    p.add_argument("--no-tests", action="store_true",
                   help="leave the tests out: a second, short call on a still-warm machine "
                        "that resumes --work")
    _options(p, gpucheck.FIRST_TESTS_TIMEOUT_S, gpucheck.FIRST_TESTS)
    p.set_defaults(func=cmd_gpu_first)

    p = sub.add_parser("gpu-check", help="the first GPU check in two commands: env, every "
                       "algo × pass × layout of a net, a sample of convset's depthwise, grouped "
                       "and pointwise problems, and the ratios; then --tests, the gpu tests' log")
    p.add_argument("--out", help="folder for everything (default results/<date>-<device>-"
                   "<net>-gpu-check); a folder holding a run is resumed")
    p.add_argument("--tests", action="store_true",
                   help="run the gpu tests (into OUT/tests.log, their line into summary.md) "
                        "instead of the run")
    p.add_argument("--classes", default=",".join(gpucheck.CLASSES),
                   help=f"the second part, into OUT/{gpucheck.CLASSES_RUN}/: comma list of "
                        f"{gpucheck.CLASSES_NET}'s classes sampled after the net, or none "
                        "(default %(default)s)")
    p.add_argument("--sample", type=positive(int), default=gpucheck.CLASSES_SAMPLE,
                   help="problems in the second part's stratified sample (default "
                        "%(default)s)")
    p.add_argument("--class-algos", help="comma list of the second part's algos (default: "
                   "all, without cudnn-find)")
    _model_options(p, CHECK_MODELS, CHECK_MODEL_INPUT, "run after the classes")
    _options(p, gpucheck.TESTS_TIMEOUT_S, gpucheck.PYTEST_ARGS)
    p.set_defaults(func=cmd_gpu_check)
