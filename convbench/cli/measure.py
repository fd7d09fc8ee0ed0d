"""`convbench layer`, `bench` and `sweep`: measure layers, into a run folder or to the terminal.

    convbench layer conv2 --algos all --batch 2 --format json
    convbench bench [--net alexnet] [--device cpu|cuda|emu] [--out DIR] [--resume]
    convbench bench --resume --out DIR --remeasure busy,noisy
    convbench sweep [--net alexnet] [--layers conv2,conv3] [--batch 1,2,4,8] [--memory-limit 2GiB]

Each parses its options into cases (`runs.sweep_cases`), opens the run folder
(`results.RunFolder`), runs them (`runs.Run`) and prints the rows or the report.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

from .. import runs
from ..algos import registry
from ..analysis import report
from ..catalogs import layers, problemfile
from ..core.problem import LAYOUTS, PASSES, PRECISIONS
from ..core.results import ENV_JSON, FolderInUse, RunFolder, resumable_env
from ..machine import devices, threads
from ..machine.devices import DEVICES
from ..measure import batchsweep, envinfo, memory, timing
from ..planning import models
from ..runs import shard
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
    resolve_device,
    size,
    time_budget_option,
    usage_errors,
)


def _measure(args, specs: list, device: devices.Device, folder: Path | None,
             limit: memory.MemoryLimit | None = None, source: dict | None = None):
    """Sweep `specs` (layer specs, or Layers) × the options, streaming the rows into `folder`
    when given, which also gets env.json, report.md and plots. Returns the run's outcome
    (`runs.Outcome`)."""
    if args.remeasure and not args.resume:
        raise UsageError("--remeasure takes rows of a run again: give it with --resume --out "
                         "DIR")
    with usage_errors():
        cases = runs.sweep_cases(
            specs, args.net, args.batch if isinstance(args.batch, list) else [args.batch],
            device, registry.expand_algos(args.algos, device.backend),
            choices(args.passes, "pass", PASSES), choices(args.layouts, "layout", LAYOUTS),
            choices(args.precision, "precision", PRECISIONS))
    budget = args.time_budget or device.budget_s
    target = args.target_noise or timing.TARGET_NOISE
    with usage_errors():
        sharded = shard.from_env(device.backend)  # torchrun, several ranks: this rank's share
    if sharded and sharded.rank:  # rank 0 prints the results; the other ranks' stdout is dropped
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - for the rest of the process
    if sharded and args.remeasure:
        raise UsageError("--remeasure runs in one process: resume the folder without torchrun")
    with usage_errors():  # the ranks on this machine share its cores
        threads.use(threads.check(args.threads)
                    or shard.host_threads(sharded, threads.available_cores()))
    run_folder = None
    if folder is not None:
        env = runs.environment(device, args.net, cases, budget, batch=args.batch, limit=limit,
                               command=" ".join(["convbench", *map(shlex.quote, args.argv)]),
                               source=source, argv=args.argv, target=target)
        try:
            run_folder = (sharded.open(folder, env, args.resume) if sharded
                          else RunFolder.open(folder, env, args.resume))
        except FolderInUse as exc:
            raise UsageError(f"{exc}; pass --resume to finish it or --out DIR to start "
                             "another run folder") from None
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        except OSError as exc:  # --out names a file, or a folder this process cannot write
            raise UsageError(f"--out {folder}: cannot write a run folder there "
                             f"({exc.strerror or exc})") from None
    run = (shard.Run(sharded, cases, budget, run_folder, limit, target) if sharded
           else runs.Run(cases, budget, run_folder, limit, target, args.remeasure or ()))
    progress = Progress(len(run.todo), quiet=args.quiet)
    try:
        outcome = run.measure(on_row=progress)
    finally:
        progress.close()
    return outcome


# --- resuming: a run folder's own options ------------------------------------------------------
#: Options that say how to show or where to write a run, or which of its rows to take again,
#: not what it measures: a resumed run may give them anew.
_PRESENTATION = {"resume", "out", "format", "quiet", "command", "func", "argv",
                 "build_parser", "remeasure"}
#: Options whose default a run resolved and recorded in env.json's run: an explicit value is
#: compared with what the run used, not with "not given".
_RESOLVED = {"net": "net", "device": "device", "batch": "batch", "time_budget": "budget_s",
             "threads": "threads", "target_noise": "target_noise"}
#: Comma lists whose order does not change what is measured.
_LISTS = {"algos", "passes", "layouts", "precision", "layers"}


def _explicit(build_parser, argv: list[str]) -> argparse.Namespace:
    """`argv` parsed with every default suppressed: only the options it gives."""
    parser = build_parser()
    for sub in parser._subparsers._group_actions[0].choices.values():
        for action in sub._actions:
            if action.dest != "help":
                action.default = argparse.SUPPRESS
    return parser.parse_args(argv)


def _same(dest: str, given, recorded) -> bool:
    if dest in _LISTS and isinstance(given, str) and isinstance(recorded, str):
        return set(given.split(",")) == set(recorded.split(","))
    if dest in _RESOLVED and isinstance(recorded, list) and not isinstance(given, list):
        return [given] == recorded
    return given == recorded


def _stored_argv(run: dict, folder: Path) -> list[str]:
    if "argv" in run:
        return list(run["argv"])
    try:  # a run folder from before argv was recorded: its command line
        return shlex.split(run.get("command", ""))[1:]
    except ValueError:
        raise UsageError(f"{folder / ENV_JSON}: cannot read the run's options from its command "
                         f"{run.get('command')!r}; start another run folder") from None


def _option(dest: str) -> str:
    return "layers given" if dest == "layer" else "--" + dest.replace("_", "-")


def resumed(args) -> argparse.Namespace:
    """For `--resume --out DIR`: the run's own options (from its env.json), with this
    command's presentation options; UsageError, before anything is written, where there is no
    run to resume (`results.resumable_env`: resuming nothing would start a whole run of
    default options) or where this command contradicts it (another value for an option the run
    was made with, another subcommand, another machine). Without --resume, `args` as they
    are."""
    if not args.resume:
        return args
    if not args.out:  # a default folder is named by options the run's env.json would give
        raise UsageError("--resume needs the run folder to finish: --out DIR")
    env_path = Path(args.out) / ENV_JSON
    with usage_errors("--resume: "):
        env = resumable_env(args.out)
    try:
        run = env["run"]
    except (KeyError, TypeError):
        raise UsageError(f"{env_path} is not a convbench env.json; start another run folder") \
            from None
    stored = _stored_argv(run, env_path.parent)
    with usage_errors(f"{env_path}: "):
        try:
            original = _explicit(args.build_parser, stored)
        except SystemExit:
            raise ValueError(f"cannot parse the run's own options {' '.join(stored)!r}") \
                from None
    given = _explicit(args.build_parser, args.argv)
    if original.command != given.command:
        raise UsageError(f"{args.out} was made by `convbench {original.command}`, not "
                         f"`convbench {given.command}`: resume it with `convbench "
                         f"{original.command} --resume --out {args.out}`")
    for dest, value in vars(given).items():
        if dest in _PRESENTATION:
            continue
        recorded = getattr(original, dest, run.get(_RESOLVED.get(dest, ""), None))
        if not _same(dest, value, recorded):
            shown = " ".join(map(str, value)) if isinstance(value, list) else value
            was = "not given" if recorded is None else (
                " ".join(map(str, recorded)) if isinstance(recorded, list) else recorded)
            raise UsageError(f"{_option(dest)} {shown} contradicts the run in {args.out}, made "
                             f"with {_option(dest)} {was} ({ENV_JSON}): resume with its own "
                             "options (give none), or start another run folder with --out")
    _same_machine(env, args.out)
    out = args.build_parser().parse_args(stored)
    for dest in _PRESENTATION - {"command", "func"}:
        if hasattr(args, dest):
            setattr(out, dest, getattr(args, dest))
    out.resume, out.out = True, args.out
    return out


def _same_machine(env: dict, folder) -> None:
    """UsageError where this machine is not the one a run folder's rows were measured on."""
    backend = env.get("backend") or env.get("run", {}).get("backend", "numpy")
    now = {"device": envinfo.device_name(backend)}
    was = {"device": env.get("device")}
    if was["device"] and now["device"] != was["device"]:
        raise UsageError(f"{folder} was measured on {was['device']}, this machine is "
                         f"{now['device']}: its rows would mix two machines; start another run "
                         "folder")



def _limit(args) -> memory.MemoryLimit | None:
    return memory.MemoryLimit(args.memory_limit) if args.memory_limit else None


def network(args, dev: devices.Device) -> tuple[list, dict | None]:
    """The layers of `--model` (with `--input`), of `--problems`, or of `--net`: (specs or
    Layers, where they came from and how often each occurs, for env.json; None for a catalog of
    one network). Sets `args.net` to the name the rows carry."""
    if args.input and not args.model:
        raise UsageError("--input goes with --model MODULE:CALLABLE")
    given = [o for o, v in (("--model", args.model), ("--problems", args.problems),
                            ("--net", args.net)) if v]
    if len(given) > 1:
        raise UsageError(f"{' and '.join(given)} are sources of layers: give one")
    if args.model:
        if args.classes or args.sample is not None:
            raise UsageError("--class and --sample choose among the problems of --net or "
                             "--problems, not of --model")
        return _model_layers(args, dev)
    if args.problems:
        skipped: list[problemfile.Skipped] = []
        with usage_errors():
            found = problemfile.read(args.problems, skipped=skipped)
        args.net = found[0].net
        found, chosen = catalog.choose(args, found, args.net)
        source = {"problems": str(args.problems), "occurrences": _counts(found), **chosen}
        if skipped:
            # Lines that read as convolutions convbench cannot hold (3-D ones): said, kept in
            # env.json with their reasons, and the file's other problems run.
            print(f"convbench: {args.problems}: {len(skipped)} of its convolutions skipped "
                  f"(the first: {skipped[0]}); env.json lists them", file=sys.stderr)
            source["skipped"] = [str(s) for s in skipped]
        return found, source
    args.net = args.net or layers.NETS[0]
    found, chosen = catalog.choose(args, layers.net_layers(args.net), args.net)
    if args.net in layers.OWN_BATCH:  # a list of problems, weighed by how often each occurs
        return found, {"occurrences": _counts(found), **chosen}
    return [f"{args.net}:{layer.name}" for layer in found], chosen or None


def _counts(found: list[layers.Layer]) -> dict[str, int]:
    return {layer.name: layer.count for layer in found}


def _model_layers(args, dev: devices.Device) -> tuple[list, dict]:
    if not args.input:
        raise UsageError("--model needs --input N,C,H,W (the shape of one input batch)")
    with usage_errors():
        shape = models.parse_input(args.input)
        args.net = models.net_name(args.model)
        found = models.conv_layers(models.load(args.model), shape, args.net,
                                   "cuda" if dev.backend == "cuda" else "cpu")
    for u in found.unplanned:
        print(f"convbench: {u.layer} not measured: {u.reason}", file=sys.stderr)
    for name, why in found.kept.items():
        print(f"convbench: {name} measured; apply would keep it as it is: {why}",
              file=sys.stderr)
    print(f"convbench: {args.model}: {sum(found.occurrences.values())} conv layers, "
          f"{len(found.layers)} distinct problems", file=sys.stderr)
    return found.layers, {"model": args.model, "input": list(shape),
                          "occurrences": found.occurrences,
                          "unmeasured": {u.layer: u.reason for u in found.unplanned},
                          "kept_by_apply": found.kept}


def cmd_layer(args) -> int:
    args = resumed(args)
    folder = Path(args.out) if args.out else None
    if args.layer and (args.model or args.problems):
        raise UsageError("give layers, --model or --problems, not several")
    if not (args.layer or args.model or args.problems):
        raise UsageError("no layer given: name layers or specs, or give --model or --problems")
    dev = resolve_device(args.device)
    specs, source = network(args, dev) if not args.layer else (args.layer, None)
    args.net = args.net or layers.NETS[0]
    outcome = _measure(args, specs, dev, folder, _limit(args), source)
    emit(outcome.frame, args.format, report.layer_table(outcome.frame))
    return finish(outcome, folder)


def cmd_bench(args) -> int:
    args = resumed(args)
    dev = resolve_device(args.device)
    specs, source = network(args, dev)
    folder = Path(args.out) if args.out else runs.default_folder(args.net, dev.backend)
    outcome = _measure(args, specs, dev, folder, _limit(args), source)
    emit(outcome.frame, args.format, outcome.report)
    return finish(outcome, folder)


def cmd_sweep(args) -> int:
    """`bench` over a list of batches: time per image and peak memory as the batch grows. On
    the host the memory limit defaults to a share of the memory available now."""
    args = resumed(args)
    dev = resolve_device(args.device)
    args.net = args.net or layers.NETS[0]
    args.batch = args.batch or list(batchsweep.DEFAULT_BATCHES[dev.name])
    folder = (Path(args.out) if args.out
              else runs.default_folder(args.net, dev.backend, "-sweep"))
    names = [layer.name for layer in layers.net_layers(args.net)]
    try:
        chosen = choices(args.layers, "layer", tuple(names)) if args.layers else names
    except ValueError as exc:
        raise UsageError(f"{exc} (in {args.net})") from None
    limit = _limit(args) or batchsweep.default_limit(dev.backend)
    specs = [f"{args.net}:{name}" for name in chosen]
    outcome = _measure(args, specs, dev, folder, limit)
    emit(outcome.frame, args.format, outcome.report)
    return finish(outcome, folder)


# --- the parsers ----------------------------------------------------------------------------
def _flags(text: str) -> list[str]:
    """`--remeasure`: a comma list of `runs.REMEASURE` (`all`: every one)."""
    try:
        return choices(text, "flag", runs.REMEASURE)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _sweep_options(p, layer: bool, batch_list: bool = False) -> None:
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
    p.add_argument("--algos", default="all",
                   help="comma list of algos; `winograd` = both tiles, `winograd-fused` both "
                        "fused tiles; `all` (default)")
    p.add_argument("--passes", default="all", help=f"comma list of {', '.join(PASSES)}; all")
    p.add_argument("--layouts", default="all", help=f"comma list of {', '.join(LAYOUTS)}; all")
    p.add_argument("--precision", default="fp32",
                   help=f"comma list of {', '.join(PRECISIONS)} (default fp32)")
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
    p.add_argument("--out", help="run folder to write (measurements.csv, env.json, report.md, "
                   "plots)" + ("" if layer else "; default results/<date>-<device>-<net>"
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
