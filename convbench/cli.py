"""`convbench`: measure layers, sweep a net into a run folder, re-render, compare, list.

    convbench layer conv2 --algos all --batch 2 --format json
    convbench bench [--net alexnet] [--device cpu|cuda|emu] [--out DIR] [--resume]
    convbench report RUN
    convbench compare RUN_A RUN_B
    convbench list
    convbench kernels ...           (the CUDA kernel tools, convbench.kernels)

Bad input — an unknown layer, net, algo, pass, layout or precision, a malformed layer spec, a
device this machine lacks — is one line on stderr naming what is wrong and what is valid, and
exit code 2. Ctrl-C during a sweep keeps every row measured so far (and, with a run folder,
writes its report), then exits 130; `--resume` finishes the folder.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import shutil
import sys
import time
from pathlib import Path

from tabulate import tabulate

from . import envinfo, layers, registry, report, runner
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


def _run_folder(args, device: runner.Device) -> Path:
    if args.out:
        return Path(args.out)
    date = datetime.date.today().isoformat()
    return Path("results") / f"{date}-{envinfo.device_slug(device.backend)}-{args.net}"


def _cases(args, specs: list[str], device: runner.Device) -> list[runner.Case]:
    """The sweep the options ask for; UsageError naming the first bad value."""
    try:
        algos = registry.expand_algos(args.algos, device.backend)
        passes = _choices(args.passes, "pass", PASSES)
        layouts = _choices(args.layouts, "layout", LAYOUTS)
        precisions = _choices(args.precision, "precision", PRECISIONS)
        chosen = _layers(specs, args.net, args.batch, device)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return runner.sweep(chosen, algos, device.backend, passes, layouts, precisions)


def _environment(args, device: runner.Device, cases: list[runner.Case], budget: float) -> dict:
    """env.json: the machine, and how this run was asked for."""
    env = envinfo.collect(device.backend)
    env["run"] = {"net": args.net, "device": device.name, "backend": device.backend,
                  "batch": args.batch or device.batch or "catalog", "budget_s": budget,
                  "algos": list(dict.fromkeys(c.algo for c in cases)),
                  "passes": list(dict.fromkeys(c.pass_ for c in cases)),
                  "layouts": list(dict.fromkeys(c.layout for c in cases)),
                  "precisions": list(dict.fromkeys(c.precision for c in cases)),
                  "command": " ".join(["convbench", *args.argv])}
    return env


def _open_folder(folder: Path, resume: bool, env: dict):
    """Prepare a run folder: refuse to mix into finished results unless resuming; keep the
    first env.json of a resumed run. Returns (keys already measured, the env, the CSV sink)."""
    csv_path, env_path = folder / runner.RESULTS_CSV, folder / report.ENV_JSON
    if not resume and runner.read_rows(csv_path):
        raise UsageError(f"{folder} already holds results; pass --resume to finish it or "
                         "--out DIR to start another run folder")
    if resume and env_path.exists():
        env = json.loads(env_path.read_text())
    folder.mkdir(parents=True, exist_ok=True)
    env_path.write_text(json.dumps(env, indent=1) + "\n")
    return runner.done_keys(csv_path), env, runner.CsvSink(csv_path)


def _measure(args, specs: list[str], device: runner.Device, folder: Path | None):
    """Sweep `specs` × the options, streaming the rows into `folder` when given, which also
    gets env.json, report.md and plots. Returns (results, the report's markdown or None,
    whether Ctrl-C cut the sweep short)."""
    if args.resume and folder is None:
        raise UsageError("--resume needs the run folder to finish: --out DIR")
    cases = _cases(args, specs, device)
    budget = args.budget or device.budget_s
    env = _environment(args, device, cases, budget)
    done, sink = set(), None
    if folder is not None:
        done, env, sink = _open_folder(folder, args.resume, env)
    todo = [c for c in cases if c.key() not in done]
    rows, progress = [], Progress(len(todo))

    def on_row(r: dict) -> None:
        if sink is not None:
            sink.append(r)
        rows.append(r)
        progress(r)

    interrupted = False
    try:
        runner.run(todo, budget, on_row=on_row)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        progress.close()
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


def cmd_layer(args) -> int:
    folder = Path(args.out) if args.out else None
    df, _, interrupted = _measure(args, args.layer, _device(args.device), folder)
    _emit(df, args.format, report.layer_table(df))
    return _exit_code(interrupted, folder)


def cmd_bench(args) -> int:
    device = _device(args.device)
    folder = _run_folder(args, device)
    specs = [f"{args.net}:{layer.name}" for layer in layers.net_layers(args.net)]
    df, text, interrupted = _measure(args, specs, device, folder)
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
def _sweep_options(p: argparse.ArgumentParser, layer: bool) -> None:
    p.add_argument("--net", default="alexnet", choices=layers.NETS,
                   help="catalog the layers come from (default alexnet)")
    p.add_argument("--algos", default="all",
                   help="comma list of algos; `winograd` = both tiles; `all` (default)")
    p.add_argument("--passes", default="all", help=f"comma list of {', '.join(PASSES)}; all")
    p.add_argument("--layouts", default="all", help=f"comma list of {', '.join(LAYOUTS)}; all")
    p.add_argument("--precision", default="fp32",
                   help=f"comma list of {', '.join(PRECISIONS)} (default fp32)")
    p.add_argument("--batch", type=_positive(int),
                   help=f"batch size (default: {runner.CPU_BATCH} on cpu, the catalog's on cuda)")
    p.add_argument("--device", choices=list(runner.DEVICES),
                   help="cpu (numpy), cuda (GPU kernels) or emu (CUDA sources on the CPU); "
                        "default cuda where a GPU is, else cpu")
    p.add_argument("--budget", type=_positive(float),
                   help="seconds of timed repetitions per measurement (default "
                        f"{runner.CPU_BUDGET_S} on cpu, {runner.DEVICES['cuda'].budget_s} on cuda)")
    p.add_argument("--format", choices=("table", "csv", "json"), default="table")
    p.add_argument("--out", help="run folder to write (measurements.csv, env.json, report.md, "
                   "plots)" + ("" if layer else "; default results/<date>-<device>-<net>"))
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
    for name, func, runs, text in (("report", cmd_report, ["run"], "re-render a run folder"),
                                   ("compare", cmd_compare, ["run_a", "run_b"],
                                    "ratio of medians per row between two run folders")):
        p = sub.add_parser(name, help=text)
        for r in runs:
            p.add_argument(r, metavar=r.upper())
        p.add_argument("--format", choices=("table", "csv", "json"), default="table")
        p.set_defaults(func=func)
    p = sub.add_parser("list", help="nets, layers, and what each algo supports")
    p.add_argument("--net", choices=layers.NETS, help="only this net (support shown on it; "
                   "default: every net listed, support on alexnet)")
    p.add_argument("--precision", default="fp32", choices=PRECISIONS)
    p.set_defaults(func=cmd_list)
    sub.add_parser("kernels", help="CUDA kernel tools: compile check, resources "
                   "(convbench kernels --help)", add_help=False)
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
