"""`convbench layer`, `bench` and `sweep`: measure layers, into a run folder or to the terminal.

    convbench layer conv2 --algos all --batch 2 --format json
    convbench bench [--net alexnet] [--device cpu|cuda|emu] [--out DIR] [--resume]
    convbench bench --resume --out DIR --remeasure busy,noisy
    convbench sweep [--net alexnet] [--layers conv2,conv3] [--batch 1,2,4,8] [--memory-limit 2GiB]

Each turns its options into the run as data (`RunSpec`, its defaults resolved), or with
`--resume` reads the run's own back from its folder and refuses an option that contradicts it;
then hands the spec whole to `runs`: its layers (`runs.source.layers_of`; a model's through
`planning.models`), its cases (`runs.cases`), its folder, new or resumed (`runs.open_folder`),
its run (`runs.Run`), and prints the rows or the report; `layer` ends on its verdict, the
fastest of ours against torch's per layer and pass (`report.layer_verdict`).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import sys
from pathlib import Path

from .. import runs
from ..algos import registry
from ..analysis import report
from ..catalogs import layers, selection
from ..core.problem import LAYOUTS, PASSES, PRECISIONS
from ..core.results import ENV_JSON, FolderInUse, RunFolder, resumable_env, schema_of
from ..core.runspec import RunSpec
from ..machine import devices, threads
from ..machine.devices import DEVICES
from ..measure import batchsweep, timing
from ..planning import models
from ..runs import shard, source
from . import catalog
from .common import (
    FORMATS,
    Progress,
    UsageError,
    batches,
    choices,
    device_option,
    emit,
    finish,
    model_options,
    percent,
    positive,
    precisions_option,
    resolve_device,
    size,
    time_budget_option,
    usage_errors,
)

#: Each field of a `RunSpec` by the option that gives it, to name it in a refusal.
_OPTION = {"device": "--device", "net": "--net", "layers": "--layers", "problems": "--problems",
           "model": "--model", "input": "--input", "classes": "--class", "sample": "--sample",
           "seed": "--seed", "stratify": "--stratify", "batches": "--batch", "algos": "--algos", "passes": "--passes",
           "layouts": "--layouts", "precisions": "--precisions", "budget_s": "--time-budget",
           "target_noise": "--target-noise", "memory_limit_bytes": "--memory-limit",
           "threads": "--threads"}


# --- the run as data: from the options, or from the run folder being resumed -------------------
def _given(args, subcommand: str, backend: str, net: str) -> dict:
    """The fields of a RunSpec this command's options give (an option not given gives none):
    comma lists parsed and checked, `all` algos expanded for `backend`, a sweep's `--layers`
    checked against `net`'s."""
    layer_names = getattr(args, "layers", None)
    classes = getattr(args, "classes", None)
    if classes is not None:
        with usage_errors("--class: "):
            classes = selection.parse_classes(classes)
    with usage_errors():
        given = {
            "device": args.device, "net": args.net,
            "layers": tuple(args.layer) if subcommand == "layer" and args.layer else None,
            "problems": str(args.problems) if getattr(args, "problems", None) else None,
            "model": getattr(args, "model", None),
            "input": models.parse_input(args.input) if getattr(args, "input", None) else None,
            "classes": classes or None,
            "sample": getattr(args, "sample", None), "seed": getattr(args, "seed", None),
            "stratify": getattr(args, "stratify", None),
            "batches": (None if args.batch is None else
                        tuple(args.batch) if isinstance(args.batch, list) else (args.batch,)),
            # a comma list given empty (`--algos ""`) is refused, not read as not given
            "algos": (registry.expand_algos(args.algos, backend) if args.algos is not None
                      else None),
            "passes": choices(args.passes, "pass", PASSES) if args.passes is not None else None,
            "layouts": (choices(args.layouts, "layout", LAYOUTS) if args.layouts is not None
                        else None),
            "precisions": args.precisions,
            "budget_s": args.time_budget, "target_noise": args.target_noise,
            "memory_limit_bytes": args.memory_limit, "threads": args.threads}
    if layer_names is not None:
        names = tuple(layer.name for layer in layers.net_layers(net))
        try:
            given["layers"] = tuple(choices(layer_names, "layer", names))
        except ValueError as exc:
            raise UsageError(f"{exc} (in {net})") from None
    return {k: v for k, v in given.items() if v is not None}


def _sources(args, subcommand: str) -> None:
    """UsageError where the options name no layers, or several sources of them."""
    model, problems = getattr(args, "model", None), getattr(args, "problems", None)
    if subcommand == "layer":
        if args.layer and (model or problems):
            raise UsageError("give layers, --model or --problems, not several")
        if not (args.layer or model or problems):
            raise UsageError("no layer given: name layers or specs, or give --model or "
                             "--problems")
    if getattr(args, "input", None) and not model:
        raise UsageError("--input goes with --model MODULE:CALLABLE")
    given = [o for o, v in (("--model", model), ("--problems", problems), ("--net", args.net))
             if v]
    if len(given) > 1:
        raise UsageError(f"{' and '.join(given)} are sources of layers: give one")
    if model and (getattr(args, "classes", None) or getattr(args, "sample", None) is not None):
        raise UsageError("--class and --sample choose among the problems of --net or "
                         "--problems, not of --model")
    if model and not args.input:
        raise UsageError("--model needs --input N,C,H,W (the shape of one input batch)")


def new_spec(args, subcommand: str, recorded: dict | None = None) -> RunSpec:
    """The RunSpec of `convbench SUBCOMMAND` with these options, every default resolved: the
    device, its budget, every algo, pass and layout, fp32, a sweep's batches and memory limit
    (or, for a run folder from before run specs, what its `recorded` run resolved then)."""
    _sources(args, subcommand)
    dev = resolve_device(args.device)
    model = getattr(args, "model", None)
    net = args.net or (models.net_name(model) if model else None)
    if not net and not getattr(args, "problems", None):
        net = layers.NETS[0]
    given = _given(args, subcommand, dev.backend, net or layers.NETS[0])
    was = recorded or {}
    defaults = {"device": dev.name, "net": net, "algos": registry.expand_algos("all", dev.backend),
                "passes": PASSES, "layouts": LAYOUTS, "precisions": ("fp32",),
                "budget_s": was.get("budget_s") or dev.budget_s,
                "target_noise": was.get("target_noise") or timing.TARGET_NOISE,
                "memory_limit_bytes": was.get("memory_limit_bytes"),
                "threads": was.get("threads")}
    if subcommand == "sweep":
        defaults["batches"] = batchsweep.DEFAULT_BATCHES[dev.name]
        if not defaults["memory_limit_bytes"]:
            limit = batchsweep.default_limit(dev.backend)
            defaults["memory_limit_bytes"] = limit.nbytes if limit else None
    with usage_errors():
        return RunSpec(**{**defaults, **given, "subcommand": subcommand})


def _old_spec(args, run: dict, env_path: Path) -> RunSpec:
    """The RunSpec of a run folder from before run specs (schema 0): its recorded command line
    (`argv`, or the `command` before that) parsed as any command is, its defaults those the
    run resolved."""
    try:
        argv = list(run["argv"]) if "argv" in run else shlex.split(run.get("command", ""))[1:]
    except ValueError:
        raise UsageError(f"{env_path}: cannot read the run's options from its command "
                         f"{run.get('command')!r}; start another run folder") from None
    try:
        old = args.build_parser().parse_args(argv)
    except SystemExit:
        raise UsageError(f"{env_path}: cannot parse the run's own options "
                         f"{' '.join(argv)!r}") from None
    if old.command not in ("layer", "bench", "sweep"):
        raise UsageError(f"{env_path} is not a measuring run's; start another run folder")
    return new_spec(old, old.command, run)


def _shown(field: str, value) -> str:
    if isinstance(value, (list, tuple)):
        return (" " if field == "layers" else ",").join(map(str, value))
    return "not given" if value is None else str(value)


def stored_spec(args, subcommand: str) -> RunSpec:
    """For `--resume --out DIR`: the RunSpec of the run in DIR (`RunSpec.from_dict` of its
    env.json, or for a folder from before run specs its recorded command's); UsageError,
    before anything is written, where there is no run to resume (`results.resumable_env`:
    resuming nothing would start a whole run of default options), where a newer convbench
    wrote it, or where this command contradicts it, in one line naming the option (another
    value for an option the run was made with, another subcommand, another machine)."""
    if not args.out:  # a default folder is named by options the run's env.json would give
        raise UsageError("--resume needs the run folder to finish: --out DIR")
    env_path = Path(args.out) / ENV_JSON
    with usage_errors("--resume: "):
        env = resumable_env(args.out)
    run = env.get("run")
    if not isinstance(run, dict):
        raise UsageError(f"{env_path} is not a convbench env.json; start another run folder")
    with usage_errors():
        version = schema_of(env, env_path)
    if version >= 1:
        with usage_errors(f"{env_path}: "):
            spec = RunSpec.from_dict(run)
    else:
        spec = _old_spec(args, run, env_path)
    if spec.subcommand and spec.subcommand != subcommand:
        raise UsageError(f"{args.out} was made by `convbench {spec.subcommand}`, not "
                         f"`convbench {subcommand}`: resume it with `convbench "
                         f"{spec.subcommand} --resume --out {args.out}`")
    backend = DEVICES[spec.device].backend if spec.device in DEVICES else "numpy"
    given = _given(args, subcommand, backend, args.net or spec.net or layers.NETS[0])
    conflict = spec.conflict(given)
    if conflict and conflict[0] == "batches" and not spec.batches:
        # a run given no batch ran at one it chose: that one, given now, is no contradiction
        ran = run.get("batch")
        ran = tuple(ran) if isinstance(ran, list) else (ran,)
        conflict = spec.conflict({k: v for k, v in given.items() if k != "batches"}) \
            if tuple(given["batches"]) == ran else conflict
    if conflict:
        field, value, recorded = conflict
        option = "layers given" if field == "layers" and subcommand == "layer" else \
            _OPTION[field]
        made = f"made with {option} {_shown(field, recorded)}"
        if field == "batches" and not spec.batches:  # not given: the batch the run chose
            ran = run.get("batch")
            made = "made without --batch" + (
                "" if ran is None else f", at its problems' own batches {_shown(field, ran)}"
                if isinstance(ran, list) else f", at the default batch {ran}")
        raise UsageError(f"{option} {_shown(field, value)} contradicts the run in {args.out}, "
                         f"{made} ({ENV_JSON}): resume with its own options (give none), or "
                         "start another run folder with --out")
    with usage_errors():
        runs.same_machine(env, args.out)
    return spec


def _spec(args, subcommand: str) -> RunSpec:
    if args.remeasure and not args.resume:
        raise UsageError("--remeasure takes rows of a run again: give it with --resume --out "
                         "DIR")
    return stored_spec(args, subcommand) if args.resume else new_spec(args, subcommand)


# --- the layers of a run, and measuring them --------------------------------------------------
def network(spec: RunSpec, dev: devices.Device) -> tuple[list, dict | None, RunSpec]:
    """The layers of `spec`: its model's, its problem file's, its layer specs or its catalog's
    (specs or Layers), where they came from and how often each occurs, for env.json (None for
    a catalog of one network), and the spec with the net its rows carry. Says on stderr what it
    chose and left out."""
    if spec.model:
        return _model_layers(spec, dev)
    with usage_errors():
        chosen = source.layers_of(spec, say=lambda text: print(f"convbench: {text}",
                                                                 file=sys.stderr))
    return chosen.found, chosen.record, chosen.spec


def _model_layers(spec: RunSpec, dev: devices.Device) -> tuple[list, dict, RunSpec]:
    with usage_errors():
        found = models.conv_layers(models.load(spec.model), spec.input, spec.net,
                                   "cuda" if dev.backend == "cuda" else "cpu")
    for u in found.unplanned:
        print(f"convbench: {u.layer} not measured: {u.reason}", file=sys.stderr)
    for name, why in found.kept.items():
        print(f"convbench: {name} measured; apply would keep it as it is: {why}",
              file=sys.stderr)
    print(f"convbench: {spec.model}: {sum(found.occurrences.values())} conv layers, "
          f"{len(found.layers)} distinct problems", file=sys.stderr)
    return found.layers, {"model": spec.model, "input": list(spec.input),
                          "occurrences": found.occurrences,
                          "unmeasured": {u.layer: u.reason for u in found.unplanned},
                          "kept_by_apply": found.kept}, spec


def _measure(args, spec: RunSpec, found: list, found_source: dict | None,
             device: devices.Device, folder: Path | None):
    """The cases of `spec` over `found`, streaming the rows into `folder` when given, which
    also gets env.json (the spec in its `run`), report.md and plots. Returns the run's outcome
    (`runs.Outcome`)."""
    with usage_errors():
        cases = runs.cases(spec, found)
    with usage_errors():
        sharded = shard.from_env(device.backend)  # torchrun, several ranks: this rank's share
    if sharded and sharded.rank:  # rank 0 prints the results; the other ranks' stdout is dropped
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - for the rest of the process
    if sharded and args.remeasure:
        raise UsageError("--remeasure runs in one process: resume the folder without torchrun")
    with usage_errors():  # the ranks on this machine share its cores
        threads.use(threads.check(spec.threads)
                    or shard.host_threads(sharded, threads.available_cores()))
    run_folder = None if folder is None else _folder(args, spec, cases, found_source, folder,
                                                     sharded)
    run = (shard.Run(sharded, spec, cases, run_folder) if sharded
           else runs.Run(spec, cases, run_folder, args.remeasure or ()))
    progress = Progress(len(run.todo), quiet=args.quiet)
    try:
        outcome = run.measure(on_row=progress)
    finally:
        progress.close()
    return outcome


def _folder(args, spec: RunSpec, cases: list, found_source: dict | None, folder: Path,
            sharded: shard.Shard | None) -> RunFolder:
    """The run's folder (`runs.open_folder`, a sharded run's through its shard), new with its
    env.json or resumed; UsageError in one line where it cannot be."""
    try:
        return runs.open_folder(spec, cases, folder, resume=args.resume, source=found_source,
                                command=" ".join(["convbench", *map(shlex.quote, args.argv)]),
                                opener=sharded.open if sharded else RunFolder.open)
    except FolderInUse as exc:
        raise UsageError(f"{exc}; pass --resume to finish it or --out DIR to start "
                         "another run folder") from None
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    except OSError as exc:  # --out names a file, or a folder this process cannot write
        raise UsageError(f"--out {folder}: cannot write a run folder there "
                         f"({exc.strerror or exc})") from None


def _run(args, subcommand: str, kind: str | None = "") -> int:
    """`convbench SUBCOMMAND`: its spec, its layers, its run into --out (or, unless `kind` is
    None, the default folder `runs.default_folder` names with `kind`), its output."""
    spec = _spec(args, subcommand)
    dev = resolve_device(spec.device)
    # A sharded run's other ranks say nothing of what rank 0 says for the whole run (what was
    # chosen, the rows, the summary): their errors, raised out of these blocks, still print.
    said = (contextlib.redirect_stderr(open(os.devnull, "w"))  # noqa: SIM115
            if shard.follower() else contextlib.nullcontext())
    with said:
        found, found_source, spec = network(spec, dev)
    folder = (Path(args.out) if args.out else None if kind is None
              else runs.default_folder(spec.net, dev.backend, kind))
    outcome = _measure(args, spec, found, found_source, dev, folder)
    if kind is not None:
        emit(outcome.frame, args.format, outcome.report)
    else:  # `layer` ends on its verdict; as CSV or JSON, the data stays parseable
        verdict = report.layer_verdict(outcome.frame)
        emit(outcome.frame, args.format, "\n\n".join(
            text for text in (report.layer_table(outcome.frame), verdict) if text))
        if verdict and args.format != "table":
            print(verdict, file=sys.stderr)
    with said:
        return finish(outcome, folder)


def cmd_layer(args) -> int:
    return _run(args, "layer", kind=None)


def cmd_bench(args) -> int:
    return _run(args, "bench")


def cmd_sweep(args) -> int:
    """`bench` over a list of batches: time per image and peak memory as the batch grows. On
    the host the memory limit defaults to a share of the memory available now."""
    return _run(args, "sweep", "-sweep")


# --- the parsers ----------------------------------------------------------------------------
def _flags(text: str) -> list[str]:
    """`--remeasure`: a comma list of `runs.REMEASURE` (`all`: every one)."""
    try:
        return choices(text, "flag", runs.REMEASURE)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _sweep_options(p, layer: bool, batch_list: bool = False) -> None:
    """The options of `layer`, `bench` and `sweep` (`batch_list`: a list of batches, and no
    source of layers but a catalog's), in the order --help lists them."""
    _source_options(p, batch_list)
    _spec_options(p, batch_list)
    _folder_options(p, layer, batch_list)


def _source_options(p, batch_list: bool) -> None:
    """Where the layers come from: a catalog, a model, a problem file, a choice among them."""
    p.add_argument("--net", choices=layers.NETS,
                   help="catalog the layers come from (default alexnet)")
    if not batch_list:
        model_options(p, "measure this model's conv layers instead of a catalog's: the "
                         "callable returns an nn.Module (e.g. mymodule:net, or "
                         "torchvision.models:resnet18 with the torchvision built for this "
                         "torch); "
                         "each distinct problem once, named by its first module",
                      "with --model: the input batch's shape (e.g. 8,3,224,224)")
        p.add_argument("--problems", metavar="FILE",
                       help="measure the problems of FILE: CSV with ConvProblem's fields "
                            "(n,c,h,w,k,r,s[,stride,pad,dilation,groups,name,count]) or oneDNN "
                            "benchdnn descriptors, one per line (g1mb8ic96ih27oc256kh5ph2"
                            "n\"conv2\"); each keeps its own batch unless --batch")
        catalog.add_options(p)
        p.set_defaults(seed=None)  # 0 where the run is new: given, it is compared on --resume


def _spec_options(p, batch_list: bool) -> None:
    """The rest of a run's spec, and how it reports."""
    # the options of a run's spec default to None: given, they are checked against a resumed
    # run's own; not given, a new run resolves them (`new_spec`), a resumed one keeps its own
    p.add_argument("--algos",
                   help="comma list of algos; `winograd` = both tiles, `winograd-fused` both "
                        "fused tiles; `all` (default)")
    p.add_argument("--passes", help=f"comma list of {', '.join(PASSES)}; all (default)")
    p.add_argument("--layouts", help=f"comma list of {', '.join(LAYOUTS)}; all (default)")
    precisions_option(p, f"comma list of {', '.join(PRECISIONS)} (default fp32): on cuda fp32 "
                         "runs with TF32 off, tf32 with cuDNN's allow_tf32 on, fp16 and bf16 "
                         "in their storage type (a cudnn row's tensor_cores says whether a "
                         "tensor-core kernel ran)")
    if batch_list:
        p.add_argument("--batch", type=batches, help="comma list of batch sizes (default: "
                       + "; ".join(f"{d} {','.join(map(str, b))}"
                                   for d, b in batchsweep.DEFAULT_BATCHES.items()) + ")")
    else:
        p.add_argument("--batch", type=positive(int), help=f"batch size (default: "
                       f"{DEVICES['cpu'].batch} on cpu, the catalog's on cuda)")
    p.add_argument("--memory-limit", type=size, metavar="SIZE",
                   help="treat a case needing more than SIZE (e.g. 2GiB) as oom: on cuda the "
                        "allocators refuse beyond it, on cpu the predicted and measured "
                        "footprints are checked against it (sweep default on cpu: "
                        f"{batchsweep.HOST_LIMIT_FRACTION:.0%}% of the memory available)")
    device_option(p, "cpu (numpy), cuda (GPU kernels) or emu (CUDA sources on the CPU); "
                     "default cuda where a GPU is, else cpu", tuple(DEVICES))
    time_budget_option(p, "seconds of timed repetitions per measurement (default "
                          f"{DEVICES['cpu'].budget_s} on cpu, {DEVICES['cuda'].budget_s} on "
                          "cuda)")
    p.add_argument("--threads", type=positive(int), metavar="N",
                   help="threads every algorithm may use (NumPy's BLAS, OpenMP, torch, the "
                        "FFT's workers); default the cores this process may run on "
                        f"(here {threads.available_cores()})")
    p.add_argument("--target-noise", type=percent, metavar="PCT",
                   help="repeat until each median is known to within PCT%% (the half-width of "
                        "its 95%% interval) or the budget is spent (default "
                        f"{timing.TARGET_NOISE * 100:g}%%)")
    p.add_argument("--quiet", action="store_true",
                   help="no progress lines on stderr (the summary line stays)")
    p.add_argument("--format", choices=FORMATS, default="table")


def _folder_options(p, layer: bool, batch_list: bool) -> None:
    """The run folder, and resuming it."""
    p.add_argument("--out", help="run folder to write (measurements.csv, env.json, report.md, "
                   "plots)" + ("" if layer else "; default my-runs/<date>-<device>-<net>"
                                                   + ("-sweep" if batch_list else "")))
    p.add_argument("--resume", action="store_true",
                   help="finish the run in --out with the options it was started with (from "
                        "its env.json), skipping what it holds; an option that contradicts "
                        "them is refused")
    p.add_argument("--remeasure", type=_flags, metavar="FLAGS",
                   help="with --resume: measure again the rows flagged busy (timed on a busy "
                        "machine: contended, throttled) or noisy, comma list, each with the "
                        "competitors it was timed beside; each new row replaces the old")


def add_parsers(sub) -> None:
    p = sub.add_parser("layer", help="measure one or more layers")
    p.add_argument("layer", nargs="*", help="layer name in --net, NET:LAYER, or a spec "
                   "n=..,c=..,h=..,w=..,k=..,r=..,s=..[,stride=..,pad=..,dilation=..,groups=..]")
    _sweep_options(p, layer=True)
    p.set_defaults(func=cmd_layer)
    p = sub.add_parser("bench", help="sweep every layer of a net into a run folder")
    _sweep_options(p, layer=False)
    p.set_defaults(func=cmd_bench)
    p = sub.add_parser("sweep", help="time per image and peak memory of every algo as the "
                       "batch grows, until out of memory")
    p.add_argument("--layers", help="comma list of layers of --net (default: all)")
    _sweep_options(p, layer=False, batch_list=True)
    p.set_defaults(func=cmd_sweep)
