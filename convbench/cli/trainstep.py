"""`convbench train-step`: a whole training step in the configurations users ask about
(`convbench.studies.trainstep`)."""

from __future__ import annotations

import sys
from pathlib import Path

from ..machine.backends import available
from ..machine.devices import DEVICES, default_device
from ..measure import envinfo
from ..planning import models
from ..studies import trainstep
from ..studies.workload import CPU_STEP_BATCH, CPU_TUNE_BUDGET_S, Workload
from .common import (
    EXIT_INTERRUPTED,
    UsageError,
    choices,
    command_line,
    emit,
    model_options,
    positive,
    step_budget_option,
    step_options,
    study_output_options,
    time_budget_option,
    usage_errors,
)


def _workload(args) -> tuple[Workload, int | None]:
    """The workload asked for: a catalog net (--net), or a user's model (--model and --input,
    whose N is the batch); UsageError for half of the second form or both forms."""
    if bool(args.model) != bool(args.input):
        raise UsageError("--model and --input go together: --model MODULE:CALLABLE --input "
                         "N,C,H,W")
    if not args.model:
        return Workload.parse(args.net or "alexnet"), args.batch
    if args.net:
        raise UsageError("--net and --model name two models: give one")
    with usage_errors():
        n, *chw = models.parse_input(args.input)
        models.load(args.model)  # one line where it does not import or build
    if args.batch and args.batch != n:
        raise UsageError(f"--batch {args.batch} and --input's N {n} disagree: --input's N is "
                         "the batch")
    return Workload.of_model(args.model, tuple(chw)), n


def _configs(text: str | None, load: Workload, backend: str = "numpy") -> tuple[str, ...] | None:
    """The configurations of --configs (any of `trainstep.CONFIGURATIONS`; `all`: every one
    that runs on this backend), in their order, the baseline (the first) always among them,
    since every speed-up is read against it, and on the CPU the control (`cudnn.benchmark`),
    since a win is read against it too: there two processes running the same step differ by
    up to a fifth (`trainstep.with_speedups`); None: the workload's own
    (`trainstep.configs_of`). A name that cannot run here is refused by `trainstep.check`."""
    if text is None:
        return None
    names = tuple(trainstep.CONFIGURATIONS)
    if text.strip() == "all":
        return tuple(n for n in names if backend != "numpy"
                     or not trainstep.CONFIGURATIONS[n].gpu_only)
    with usage_errors():
        chosen = set(choices(text, "configuration", names))
    control = trainstep.CONTROL if backend == "numpy" else None
    return tuple(c for i, c in enumerate(names) if i == 0 or c in chosen or c == control)


def cmd_train_step(args) -> int:
    device = args.device or default_device()
    backend = DEVICES[device].backend
    unavailable = available(backend)
    if unavailable:
        raise UsageError(f"--device {device}: {unavailable}")
    load, batch = _workload(args)
    mode = "inference" if args.inference else "train"
    default_batch = not batch
    batch = batch or load.default_batch(backend)
    tune_budget = args.tune_budget or (CPU_TUNE_BUDGET_S if backend == "numpy" else None)
    configs = _configs(args.configs, load, backend) or trainstep.configs_of(load)
    try:
        with usage_errors():
            rows, plan, tuning_s = trainstep.compare(
                load, batch, device, budget_s=args.time_budget, tune_budget_s=tune_budget,
                algos=args.algos, store=args.store, step_budget_s=args.step_budget,
                log=lambda line: print(f"convbench: {line}", file=sys.stderr), mode=mode,
                configs=configs, precision=args.precision, plan_file=args.plan,
                folder=args.out)
    except KeyboardInterrupt:
        kept = (f"the configurations that finished are in {Path(args.out) / trainstep.LINES}"
                if args.out else "no step was reported (--out keeps each configuration as it "
                "ends)")
        print(f"convbench: train-step interrupted; {kept}; the plan store keeps tuning's "
              "measurements: the same command reuses them", file=sys.stderr)
        return EXIT_INTERRUPTED
    env = envinfo.collect(backend)
    text = trainstep.markdown(rows, plan, load, batch, env["device"], backend, tuning_s,
                              default_batch=default_batch, mode=mode,
                              precision=args.precision, plan_file=args.plan)
    if args.out:
        meta = {"net": load.name, "batch": batch, "device": device,
                "budget_s": args.time_budget, "tuning_s": tuning_s, "mode": mode,
                "precision": args.precision, "plan_file": args.plan,
                "command": command_line(args)}
        env["run"] = meta
        trainstep.write(args.out, rows, plan, text, env, meta)
        print(f"convbench: train-step results in {args.out}", file=sys.stderr)
    emit(trainstep.summary_frame(rows), args.format, text, rows)
    return 0


def add_parsers(sub) -> None:
    p = sub.add_parser("train-step", help="time a training step (or --inference) of an "
                       "AlexNet-shaped model or of your own (--model) in configurations: "
                       "eager, cudnn.benchmark, legacy-find, channels_last, torch.compile, "
                       "the advisor's plan, ... (--configs), at one --precision")
    step_options(p, "catalog whose conv layers the model has (default alexnet)",
                 net_default=None)
    model_options(p, "your own model instead of --net: a callable returning the nn.Module, "
                     "e.g. torchvision.models:resnet50 (with the torchvision built for this "
                     "torch)", "its input batch, N,C,H,W (N is the batch)")
    p.add_argument("--inference", action="store_true",
                   help="time inference (forward, eval mode, no gradients) instead of a "
                        "training step; the plan is confirmed on inference")
    p.add_argument("--batch", type=positive(int),
                   help=f"images per step (default {CPU_STEP_BATCH} on cpu, the "
                        "catalog's on cuda)")
    time_budget_option(p, "seconds of timed steps per configuration (default "
                          f"{trainstep.STEP_BUDGET_S})", default=trainstep.STEP_BUDGET_S)
    p.add_argument("--tune-budget", type=positive(float),
                   help=f"seconds of timed repetitions per tuning measurement (default "
                        f"{CPU_TUNE_BUDGET_S} on cpu, the device's default on cuda)")
    p.add_argument("--algos", default="all", help="algorithms the advisor may choose from")
    step_budget_option(p, "each of tuning's whole-step comparisons, which confirm the plan")
    p.add_argument("--configs", help="comma list of the configurations to time, of "
                   f"{', '.join(trainstep.CONFIGURATIONS)} (default: a catalog net's "
                   f"{', '.join(trainstep.CONFIGS)}; a model's "
                   f"{', '.join(trainstep.MODEL_CONFIGS)}; all: every one this device runs); "
                   f"the baseline, {trainstep.BASELINE}, always runs, and on the CPU the "
                   f"control, {trainstep.CONTROL}")
    p.add_argument("--precision", choices=trainstep.PRECISIONS, default="fp32",
                   help="what every configuration steps in: fp32 (strict, TF32 off), tf32 "
                        "(TF32 on, torch's default for convolutions on a GPU; GPU only), bf16 "
                        "(torch.autocast to bfloat16 around forward and loss) (default fp32)")
    p.add_argument("--plan", metavar="FILE",
                   help="time this saved plan (advisor.apply in the plan's process) instead "
                        "of tuning one; a plan in tf32 or bf16 must be given so")
    p.add_argument("--store", help="plan store folder (default $CONVBENCH_PLAN_DIR, else "
                   "~/.cache/convbench/plans)")
    study_output_options(p, "trainstep", f"trainstep.json, plan.json, {trainstep.LINES} (a "
                         "line per configuration as it ends)")
    p.set_defaults(func=cmd_train_step)
