"""`convbench`: measure layers, sweep a net into a run folder, re-render, compare, list.

    convbench layer conv2 --algos all --batch 2 --format json
    convbench bench [--net alexnet] [--device cpu|cuda|emu] [--out DIR] [--resume]
    convbench sweep [--net alexnet] [--layers conv2,conv3] [--batch 1,2,4,8] [--memory-limit 2GiB]
    convbench memprofile [--net alexnet] [--batch 2] [--budget 8GiB] [--run RUN] [--out DIR]
    convbench report RUN
    convbench compare RUN_A RUN_B
    convbench advise RUN [--workspace-budget 256MiB];  convbench train-step   (convbench.advisor)
    convbench list
    convbench kernels ...           (the CUDA kernel tools, convbench.kernels)

Bad input — an unknown layer, net, algo, pass, layout or precision, a malformed layer spec, a
device this machine lacks — is one line on stderr naming what is wrong and what is valid, and
exit code 2. Ctrl-C during a sweep keeps every row measured so far (and, with a run folder,
writes its report), then exits 130; `--resume` finishes the folder.
"""

from __future__ import annotations

from .threads import sleep_idle_threads

sleep_idle_threads()  # before NumPy or torch loads: see convbench.threads

import argparse
import datetime
import importlib
import json
import shutil
import sys
import time
from pathlib import Path

from tabulate import tabulate

from . import advisor, batchsweep, envinfo, layers, memory, registry, report, runner
from .problem import LAYOUTS, PASSES, PRECISIONS, check_choice

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class UsageError(Exception):
    """Bad input: reported as one line, exit code 2."""


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (no usage dump), exit code 2."""

    def error(self, message: str):
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        sys.exit(EXIT_USAGE)


def _positive(kind):
    def parse(text: str):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a positive number") from None
        if v <= 0:
            raise argparse.ArgumentTypeError(f"{text!r} is not positive")
        return v

    return parse


def _batches(text: str) -> list[int]:
    """`1,2,4,8` -> the distinct positive batch sizes, smallest first."""
    try:
        batches = sorted({int(t) for t in text.split(",") if t.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma list of batch sizes") from None
    if not batches or batches[0] <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma list of positive batch sizes")
    return batches


def _size(text: str) -> int:
    try:
        return memory.parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _choices(text: str, kind: str, valid: tuple[str, ...]) -> list[str]:
    """A comma list, each item one of `valid` (`all` for every one)."""
    items = [t.strip() for t in text.split(",") if t.strip()]
    if items == ["all"]:
        return list(valid)
    if not items:
        raise ValueError(f"no {kind} given; valid: {', '.join(valid)}")
    return [check_choice(kind, t, valid) for t in dict.fromkeys(items)]


# --- progress -------------------------------------------------------------------------------
class Progress:
    """A one-line progress bar on a terminal (stderr), silent when stderr is piped."""

    def __init__(self, total: int, stream=None):
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() and total > 0
        self.total, self.done, self.start = total, 0, time.monotonic()

    def __call__(self, row: dict) -> None:
        self.done += 1
        if not self.enabled:
            return
        elapsed = time.monotonic() - self.start
        eta = elapsed / self.done * (self.total - self.done)
        line = (f"[{self.done}/{self.total}] {row['layer']} {row['pass']} {row['layout']} "
                f"{row['algo']}: {row['status']}  elapsed {_duration(elapsed)}, "
                f"eta {_duration(eta)}")
        width = shutil.get_terminal_size().columns - 1
        self.stream.write("\r" + line[:width].ljust(width))
        self.stream.flush()

    def close(self) -> None:
        if self.enabled and self.done:
            self.stream.write("\n")
            self.stream.flush()


def _duration(s: float) -> str:
    return f"{int(s // 60)}m{int(s % 60):02d}s"


# --- measuring ------------------------------------------------------------------------------
def default_device() -> str:
    """`cuda` where a GPU and CuPy are here, else `cpu`."""
    return "cuda" if registry.available("cuda") is None else "cpu"


def _device(name: str | None) -> runner.Device:
    device = runner.DEVICES[name or default_device()]
    reason = registry.available(device.backend)
    if reason:
        here = [d for d, dev in runner.DEVICES.items() if registry.available(dev.backend) is None]
        raise UsageError(f"--device {device.name}: {reason}; valid here: {', '.join(here)}")
    return device


def _layers(specs: list[str], net: str, batch: int | None,
            device: runner.Device) -> list[layers.Layer]:
    """Layers by name, `net:layer` or text spec; a catalog layer takes `--batch` or the
    device's default batch, a text spec keeps its own n unless `--batch` is given."""
    out = []
    for spec in specs:
        layer = layers.resolve(spec, net)
        n = batch or (None if layer.net == "custom" else device.batch)
        out.append(layers.Layer(layer.net, layer.name, layer.problem.with_batch(n))
                   if n else layer)
    return out


def _run_folder(args, device: runner.Device, kind: str = "") -> Path:
    if args.out:
        return Path(args.out)
    date = datetime.date.today().isoformat()
    return Path("results") / f"{date}-{envinfo.device_slug(device.backend)}-{args.net}{kind}"


def _batch_list(args) -> list[int | None]:
    """The batches asked for: `sweep` takes a list, the other commands one batch (or None)."""
    return args.batch if isinstance(args.batch, list) else [args.batch]


def _cases(args, specs: list[str], device: runner.Device) -> list[runner.Case]:
    """The sweep the options ask for, each layer at each batch, smallest first (the order
    `SkipLarger` relies on); UsageError naming the first bad value."""
    try:
        algos = registry.expand_algos(args.algos, device.backend)
        passes = _choices(args.passes, "pass", PASSES)
        layouts = _choices(args.layouts, "layout", LAYOUTS)
        precisions = _choices(args.precision, "precision", PRECISIONS)
        chosen = [layer for spec in specs for n in _batch_list(args)
                  for layer in _layers([spec], args.net, n, device)]
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return runner.sweep(chosen, algos, device.backend, passes, layouts, precisions)


def _environment(args, device: runner.Device, cases: list[runner.Case], budget: float,
                 limit: memory.MemoryLimit | None) -> dict:
    """env.json: the machine, and how this run was asked for."""
    env = envinfo.collect(device.backend)
    env["run"] = {"net": args.net, "device": device.name, "backend": device.backend,
                  "batch": args.batch or device.batch or "catalog", "budget_s": budget,
                  "memory_limit_bytes": limit.nbytes if limit else None,
                  "algos": list(dict.fromkeys(c.algo for c in cases)),
                  "passes": list(dict.fromkeys(c.pass_ for c in cases)),
                  "layouts": list(dict.fromkeys(c.layout for c in cases)),
                  "precisions": list(dict.fromkeys(c.precision for c in cases)),
                  "command": " ".join(["convbench", *args.argv])}
    env["memory_method"] = memory.trace(device.backend).method
    return env


def _open_folder(folder: Path, resume: bool, env: dict):
    """Prepare a run folder: refuse to mix into finished results unless resuming, or into a
    file with other columns; keep the first env.json of a resumed run. Returns (the rows
    already measured, the env, the CSV sink)."""
    csv_path, env_path = folder / runner.RESULTS_CSV, folder / report.ENV_JSON
    rows = runner.read_rows(csv_path)
    if not resume and rows:
        raise UsageError(f"{folder} already holds results; pass --resume to finish it or "
                         "--out DIR to start another run folder")
    try:
        sink = runner.CsvSink(csv_path)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if resume and env_path.exists():
        env = json.loads(env_path.read_text())
    env_path.write_text(json.dumps(env, indent=1) + "\n")
    return rows, env, sink


def _measure(args, specs: list[str], device: runner.Device, folder: Path | None,
             limit: memory.MemoryLimit | None = None):
    """Sweep `specs` × the options, streaming the rows into `folder` when given, which also
    gets env.json, report.md and plots. A series that runs out of memory (or beyond `limit`)
    is not tried at larger batches. Returns (results, the report's markdown or None, whether
    Ctrl-C cut the sweep short)."""
    if args.resume and folder is None:
        raise UsageError("--resume needs the run folder to finish: --out DIR")
    cases = _cases(args, specs, device)
    budget = args.budget or device.budget_s
    env = _environment(args, device, cases, budget, limit)
    measured, sink = [], None
    if folder is not None:
        measured, env, sink = _open_folder(folder, args.resume, env)
    done = {runner.row_key(r) for r in measured}
    todo = [c for c in cases if c.key() not in done]
    rows, progress, skip = [], Progress(len(todo)), batchsweep.SkipLarger(measured)

    def on_row(r: dict) -> None:
        if sink is not None:
            sink.append(r)
        skip.observe(r)
        rows.append(r)
        progress(r)

    interrupted = False
    try:
        runner.run(skip.pending(todo), budget, on_row=on_row, limit=limit)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        progress.close()
    if skip.skipped:
        print(f"convbench: {skip.skipped} cases not tried: their series ran out of memory at a "
              "smaller batch", file=sys.stderr)
    if folder is None:
        return report.frame(rows), None, interrupted
    df, _ = report.load_run(folder)
    text = report.write(folder, df, env)
    print(f"convbench: {len(df)} rows in {folder}", file=sys.stderr)
    return df, text, interrupted


def _emit(df, fmt: str, table_text: str) -> None:
    print({"table": lambda: table_text, "csv": lambda: report.to_csv(df).rstrip("\n"),
           "json": lambda: report.to_json(df)}[fmt]())


def _exit_code(interrupted: bool, folder: Path | None) -> int:
    if not interrupted:
        return 0
    where = f"; finish with --resume --out {folder}" if folder else ""
    print(f"convbench: interrupted; the rows measured so far are kept{where}", file=sys.stderr)
    return EXIT_INTERRUPTED


def _limit(args) -> memory.MemoryLimit | None:
    return memory.MemoryLimit(args.memory_limit) if args.memory_limit else None


def cmd_layer(args) -> int:
    folder = Path(args.out) if args.out else None
    df, _, interrupted = _measure(args, args.layer, _device(args.device), folder, _limit(args))
    _emit(df, args.format, report.layer_table(df))
    return _exit_code(interrupted, folder)


def cmd_bench(args) -> int:
    device = _device(args.device)
    folder = _run_folder(args, device)
    specs = [f"{args.net}:{layer.name}" for layer in layers.net_layers(args.net)]
    df, text, interrupted = _measure(args, specs, device, folder, _limit(args))
    _emit(df, args.format, text)
    return _exit_code(interrupted, folder)


def cmd_sweep(args) -> int:
    """`bench` over a list of batches: time per image and peak memory as the batch grows. On
    the host the memory limit defaults to a share of the memory available now."""
    device = _device(args.device)
    args.batch = args.batch or list(batchsweep.DEFAULT_BATCHES[device.name])
    folder = _run_folder(args, device, "-sweep")
    names = [layer.name for layer in layers.net_layers(args.net)]
    try:
        chosen = _choices(args.layers, "layer", tuple(names)) if args.layers else names
    except ValueError as exc:
        raise UsageError(f"{exc} (in {args.net})") from None
    limit = _limit(args) or batchsweep.default_limit(device.backend)
    specs = [f"{args.net}:{name}" for name in chosen]
    df, text, interrupted = _measure(args, specs, device, folder, limit)
    _emit(df, args.format, text)
    return _exit_code(interrupted, folder)


def _load(folder: str):
    try:
        return report.load_run(folder)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def cmd_report(args) -> int:
    df, env = _load(args.run)
    _emit(df, args.format, report.write(args.run, df, env))
    return 0


def cmd_compare(args) -> int:
    (a, _), (b, _) = _load(args.run_a), _load(args.run_b)
    cmp = report.compare(a, b)
    _emit(cmp, args.format, report.compare_table(cmp))
    return 0


def cmd_list(args) -> int:
    """Nets and their layers; per backend, each algorithm, its precisions and what it supports
    on the layers of `--net`, with the reasons for what it does not."""
    nets = [args.net] if args.net else list(layers.NETS)
    for net in nets:
        print(f"## {net}\n")
        rows = [(layer.name, layer.problem.spec(), f"{layer.problem.flops / 1e9:.4g}")
                for layer in layers.net_layers(net)]
        print(tabulate(rows, headers=["layer", "problem", "GFLOP"], tablefmt="github"))
        print()
    net_layers = layers.net_layers(args.net or "alexnet")
    for backend in registry.BACKENDS:
        reason = registry.available(backend)
        print(f"## backend {backend}: {'available' if reason is None else reason}\n")
        impls = registry.implementations(backend)
        if not impls:
            print("no implementations\n")
            continue
        table, reasons = [], {}
        for impl in impls:
            cells = []
            for layer in net_layers:
                ok, why_not = [], {}
                for pass_ in PASSES:
                    for layout in LAYOUTS:
                        why = registry.supports(impl, layer.problem, pass_, layout,
                                                args.precision)
                        if why is None:
                            ok.append(f"{pass_}/{layout}")
                        else:
                            why_not.setdefault(why, []).append(f"{pass_} {layout}")
                cells.append("yes" if not why_not else ", ".join(ok) or "no")
                for why, cases in why_not.items():
                    reasons.setdefault((impl.algo, why), []).extend(
                        (layer.name, *case.split()) for case in cases)
            avail = registry.impl_available(impl)
            table.append([impl.algo, "/".join(impl.precisions), avail or "yes", *cells])
        print(tabulate(table, headers=["algo", "precisions", "runs here",
                                       *[layer.name for layer in net_layers]],
                       tablefmt="github"))
        print()
        for (algo, why), cases in reasons.items():
            print(f"- {algo}: {why} ({report.where(cases, len(PASSES) * len(LAYOUTS))})")
        print()
    return 0


def _advised(run: str, budget: int | None):
    """The advisor's plan of a run folder, under a workspace budget if given."""
    from . import advisor
    from .plan import Constraints

    try:
        return advisor.advise_run(run, Constraints(workspace_budget=budget))[0]
    except ValueError as exc:
        raise UsageError(f"--run {run}: {str(exc).splitlines()[0]}") from None


def cmd_memprofile(args) -> int:
    """The memory timeline of one training step, and the largest batch that fits `--budget`
    under torch's defaults and (with `--run`) the advisor's fastest and workspace-budgeted
    plans."""
    from . import memprofile, trainstep

    device = _device(args.device)
    batch = args.batch or (trainstep.CPU_BATCH if device.backend == "numpy" else
                           layers.net_layers(args.net)[0].problem.n)
    budget = args.budget or _device_memory(device.backend)
    plans = {"defaults": None}
    if args.run:
        plans["fastest"] = _advised(args.run, None)
        plans["budgeted"] = _advised(args.run, args.workspace_budget)
    if args.config not in plans:
        raise UsageError(f"--config {args.config} needs --run RUN, a bench run folder to "
                         "advise from")
    configs = memprofile.configurations(args.net, plans, args.workspace_budget)
    try:
        events = memprofile.profile_step(
            args.net, batch, device.name,
            memprofile.declared_workspace(args.net, configs[args.config][0]),
            plan=plans[args.config], measure=True)
    except ValueError as exc:  # a plan for another device
        raise UsageError(f"--config {args.config}: {str(exc).splitlines()[0]}") from None
    found = memprofile.fits(args.net, configs, budget)
    text = memprofile.markdown(args.net, batch, device.name, args.config, events, found,
                               budget)
    if args.out:
        written = memprofile.write(Path(args.out), text, events, found,
                                   f"{args.net}, batch {batch}, {device.name}, {args.config}")
        print(f"convbench: {', '.join(written)} in {args.out}", file=sys.stderr)
    rows = memprofile.timeline_rows(events)
    print({"table": lambda: text.rstrip("\n"),
           "csv": lambda: report.to_csv(report.pd.DataFrame(rows)).rstrip("\n"),
           "json": lambda: json.dumps({"timeline": rows,
                                       "largest_batch": memprofile.fit_rows(found)}, indent=1)}
          [args.format]())
    return 0


def _device_memory(backend: str) -> int:
    """The memory a step may use by default: the GPU's, or what the host has available."""
    if backend == "cuda":
        import cupy

        return cupy.cuda.Device().mem_info[1]
    return memory.available_host_bytes()


def cmd_kernels(argv: list[str]) -> int:
    """Hand over to `convbench.kernels.main(argv)`, which the CUDA-kernel tooling provides."""
    try:
        kernels = importlib.import_module("convbench.kernels")
    except ModuleNotFoundError as exc:
        if exc.name != "convbench.kernels":
            raise
        raise UsageError("kernels: this build has no convbench.kernels module") from None
    if not hasattr(kernels, "main"):
        raise UsageError("kernels: convbench.kernels has no main(argv)")
    return int(kernels.main(argv) or 0)


# --- the parser -----------------------------------------------------------------------------
def _sweep_options(p: argparse.ArgumentParser, layer: bool, batches: bool = False) -> None:
    p.add_argument("--net", default="alexnet", choices=layers.NETS,
                   help="catalog the layers come from (default alexnet)")
    p.add_argument("--algos", default="all",
                   help="comma list of algos; `winograd` = both tiles, `winograd-fused` both "
                        "fused tiles; `all` (default)")
    p.add_argument("--passes", default="all", help=f"comma list of {', '.join(PASSES)}; all")
    p.add_argument("--layouts", default="all", help=f"comma list of {', '.join(LAYOUTS)}; all")
    p.add_argument("--precision", default="fp32",
                   help=f"comma list of {', '.join(PRECISIONS)} (default fp32)")
    if batches:
        p.add_argument("--batch", type=_batches, help="comma list of batch sizes (default: "
                       + "; ".join(f"{d} {','.join(map(str, b))}"
                                   for d, b in batchsweep.DEFAULT_BATCHES.items()) + ")")
    else:
        p.add_argument("--batch", type=_positive(int), help=f"batch size (default: "
                       f"{runner.CPU_BATCH} on cpu, the catalog's on cuda)")
    p.add_argument("--memory-limit", type=_size, metavar="SIZE",
                   help="treat a case needing more than SIZE (e.g. 2GiB) as oom: on cuda the "
                        "allocators refuse beyond it, on cpu the predicted and measured "
                        "footprints are checked against it (sweep default on cpu: "
                        f"{batchsweep.HOST_LIMIT_FRACTION:.0%}% of the memory available)")
    p.add_argument("--device", choices=list(runner.DEVICES),
                   help="cpu (numpy), cuda (GPU kernels) or emu (CUDA sources on the CPU); "
                        "default cuda where a GPU is, else cpu")
    p.add_argument("--budget", type=_positive(float),
                   help="seconds of timed repetitions per measurement (default "
                        f"{runner.CPU_BUDGET_S} on cpu, {runner.DEVICES['cuda'].budget_s} on cuda)")
    p.add_argument("--format", choices=("table", "csv", "json"), default="table")
    p.add_argument("--out", help="run folder to write (measurements.csv, env.json, report.md, "
                   "plots)" + ("" if layer else "; default results/<date>-<device>-<net>"
                                                   + ("-sweep" if batches else "")))
    p.add_argument("--resume", action="store_true",
                   help="skip the measurements the run folder already holds")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="convbench", description="Which convolution algorithm and layout is "
                     "fastest for this layer on this device.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    p = sub.add_parser("layer", help="measure one or more layers")
    p.add_argument("layer", nargs="+", help="layer name in --net, NET:LAYER, or a spec "
                   "n=..,c=..,h=..,w=..,k=..,r=..,s=..[,stride=..,pad=..,dilation=..,groups=..]")
    _sweep_options(p, layer=True)
    p.set_defaults(func=cmd_layer)
    p = sub.add_parser("bench", help="sweep every layer of a net into a run folder")
    _sweep_options(p, layer=False)
    p.set_defaults(func=cmd_bench)
    p = sub.add_parser("sweep", help="time per image and peak memory of every algo as the "
                       "batch grows, until out of memory")
    p.add_argument("--layers", help="comma list of layers of --net (default: all)")
    _sweep_options(p, layer=False, batches=True)
    p.set_defaults(func=cmd_sweep)
    for name, func, runs, text in (("report", cmd_report, ["run"], "re-render a run folder"),
                                   ("compare", cmd_compare, ["run_a", "run_b"],
                                    "ratio of medians per row between two run folders")):
        p = sub.add_parser(name, help=text)
        for r in runs:
            p.add_argument(r, metavar=r.upper())
        p.add_argument("--format", choices=("table", "csv", "json"), default="table")
        p.set_defaults(func=func)
    p = sub.add_parser("memprofile", help="memory timeline of a training step by layer, and "
                       "the largest batch that fits a budget")
    p.add_argument("--net", default="alexnet", choices=("alexnet", "alexnet-owt"))
    p.add_argument("--device", choices=("cpu", "cuda"),
                   help="default cuda where a GPU is, else cpu")
    p.add_argument("--batch", type=_positive(int),
                   help="images in the profiled step (default 2 on cpu, the catalog's on cuda)")
    p.add_argument("--budget", type=_size, metavar="SIZE",
                   help="memory the step may use, e.g. 8GiB (default: the GPU's memory, or the "
                        "host memory available)")
    p.add_argument("--run", help="bench run folder the advisor plans from: adds its fastest "
                   "plan and its plan under --workspace-budget")
    p.add_argument("--workspace-budget", type=_size, default=256 << 20, metavar="SIZE",
                   help="workspace budget of the advisor's budgeted plan (default 256MiB)")
    p.add_argument("--config", choices=("defaults", "fastest", "budgeted"), default="defaults",
                   help="configuration whose timeline is measured and shown (default "
                        "defaults; the others need --run)")
    p.add_argument("--out", help="folder for memprofile.md, timeline.csv, largest_batch.csv, "
                   "timeline.png")
    p.add_argument("--format", choices=("table", "csv", "json"), default="table")
    p.set_defaults(func=cmd_memprofile)
    p = sub.add_parser("list", help="nets, layers, and what each algo supports")
    p.add_argument("--net", choices=layers.NETS, help="only this net (support shown on it; "
                   "default: every net listed, support on alexnet)")
    p.add_argument("--precision", default="fp32", choices=PRECISIONS)
    p.set_defaults(func=cmd_list)
    sub.add_parser("kernels", help="CUDA kernel tools: compile check, resources "
                   "(convbench kernels --help)", add_help=False)
    advisor.add_cli(sub)  # advise, train-step
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv[:1] == ["kernels"]:
            return cmd_kernels(argv[1:])
        args = build_parser().parse_args(argv)
        args.argv = argv
        return args.func(args)
    except UsageError as exc:
        print(f"convbench: error: {str(exc).splitlines()[0]}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
